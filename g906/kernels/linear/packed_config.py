"""How the packed GEMV is launched: configs per device (CUDA, ROCm gfx9) and shape, its loop
flags and field decodes, and the plane arguments of a PackedQuant."""

from __future__ import annotations

import functools
import math

import torch
import triton

from .._triton_util import is_rocm, next_pow2, num_sms
from ..pdl import pdl_args
from .packed_fields import PQ_E


def _pq_whole_rows(x, pw) -> bool:
    """Whether packed_matmul(x, pw) runs its GEMV with one split of K (each output summed by
    one program: what GLU, add_norm and rms_of need in the kernel)."""
    T, K = x.shape[0], pw.shape[1]
    if not 0 < T <= 16 or _pq_takes_dot(x):
        return False
    c = _pq_gemv_config(T, pw.shape[0], K, pw.qtype, x.device)
    return _pq_splits(K // PQ_E[pw.qtype], c["SPLIT"])[1] == 1


def _pq_takes_dot(x) -> bool:
    """The packed product's default for x [T, K]: tensor cores for a few rows (T >= 2, fp16,
    CUDA; not ROCm: gfx906 has no matrix cores)."""
    return (x.shape[0] >= 2 and x.dtype == torch.float16 and x.device.type == "cuda"
            and not is_rocm())


def _pq_splits(KW, split):
    """(words a program covers, splits) for a row of KW words asked to split `split` ways."""
    kw_len = triton.cdiv(triton.cdiv(KW, split), 16) * 16
    return kw_len, triton.cdiv(KW, kw_len)


def _pq_args(pw):
    """Kernel pointers and row strides (in each plane's elements) for a PackedQuant."""
    P = pw.planes
    qs = P["qs"]
    qh = P.get("qh", qs)
    if pw.qtype in ("Q8_0", "Q4_0"):
        a, b = P["d"], P["d"]
    elif pw.qtype in ("Q4_K", "Q5_K"):
        a, b = P["dm"], P["scm"]
    else:
        a, b = P["sc"], P["d"]
    return qs, qh, a, b


def warp_size(device) -> int:
    if device.type != "cuda":
        return 32
    return getattr(torch.cuda.get_device_properties(device), "warp_size", 64 if is_rocm() else 32)


def _pq_gemv_config(T, N, K, qtype, device):
    return dict(_pq_gemv_config_cached(T, N, K, qtype, device))   # callers update their copy


@functools.lru_cache(maxsize=4096)
def _pq_gemv_config_cached(T, N, K, qtype, device):
    """BLOCK_N rows per program (rows live in registers: each thread reuses its activations for
    all of them and keeps BLOCK_N 16-byte loads in flight), num_warps, PREFETCH, PAIRS, WSPLIT,
    ONE_IMM, CVT and a split of K. CUDA, T = 1: _pq_cuda_decode. ROCm (wave64, 256 VGPRs per
    lane and SIMD): T = 1 _pq_rocm_decode, else blocks of up to 4 tokens (BLOCK_T); 1.0f as an
    immediate and byte fields converted (full-rate conversions on GCN)."""
    bt = next_pow2(T)
    wide = qtype in ("Q5_K", "Q6_K")          # two planes per element: more registers
    kw = K // PQ_E[qtype]
    ws = warp_size(device)
    rocm = is_rocm()
    # one iteration covers 4 * threads words: fewer warps where that would leave a masked
    # tail (27B: K = 5120, 17408 are 5 and 17 times 1024 elements). Where even one warp does
    # not divide the row, ROCm takes one (the 0.8B's K = 1024 in Q4_K is 128 words: 4 waves
    # of 64 lanes would leave 7 in 8 lanes masked in its issue-bound loop, one wave half)
    fit = next((w for w in (4, 2, 1) if kw % (4 * ws * w) == 0), 1 if rocm else 4)
    prefetch, pairs, wsplit, block_t = False, 1, wide, bt
    if rocm and bt == 1:
        block_n, pairs, wsplit = _pq_rocm_decode(qtype)
        # Q4_K's 8 rows need more than 128 VGPRs at 2 warps, not at 1 or 4 (gfx908 code): one
        # wave per SIMD instead of two
        warps = 1 if qtype == "Q4_K" and fit == 2 else fit
    elif rocm:
        # at most 4 tokens a program, more token blocks beyond: from 8 tokens on the gfx908 code
        # needs AGPRs or scratch (spills on a gfx906, which has no AGPRs); 2 tokens x 4 rows or
        # 4 x 2 fit its VGPRs. A row of at most a quarter of the wave's iteration (one word a
        # lane or less, masked: the MoE shared expert's down projection, K = 512 in the 4-bit
        # types) takes one row at 4 tokens: 2 rows with the SwiGLU prologue need 255 VGPRs and
        # 7 AGPRs there (gfx908 code, tests/kernels/test_gfx9_code.py)
        short = kw <= ws * fit
        block_n = 4 if bt == 2 else (1 if short else 2)
        warps, wsplit, block_t = fit, True, min(bt, 4)
    elif bt == 1:
        block_n, warps, prefetch, pairs, wsplit = _pq_cuda_decode(qtype, N, K, num_sms(device))
        warps = min(warps, fit)
    else:
        block_n = max(1, {2: 8, 4: 4, 8: 2}.get(bt, 1) // (2 if wide else 1))
        warps = fit
    block_n = min(block_n, next_pow2(N))
    progs = triton.cdiv(N, block_n)
    want = 4 * num_sms(device)
    split = 1
    while (progs * split * 2 <= want and kw % (split * 2) == 0
           and (kw // (split * 2)) % (4 * ws * warps) == 0 and kw // (split * 2) >= 1024):
        split *= 2
    return dict(BLOCK_N=block_n, num_warps=warps, SPLIT=split, PREFETCH=prefetch, PAIRS=pairs,
                WSPLIT=wsplit, ONE_IMM=rocm, CVT=rocm, BLOCK_T=block_t,
                PRELOAD=pq_preloads(qtype, block_n))


def pq_preloads(qtype, block_n) -> bool:
    """Whether a packed GEMV loads its first iteration before the PDL wait (PRELOAD, the decode
    graphs on CUDA): it pays for every type but Q5_K's 4-row fp32 fields, whose extra
    registers cost more than it saves. Loading a second iteration early too does not pay."""
    return qtype != "Q5_K" or block_n >= 8


def _pq_rocm_decode(qtype):
    """(rows, PAIRS, WSPLIT) of a T = 1 GEMV on ROCm, chosen from the compiled gfx908 code
    (benchmarks/sass.py --target gfx908: the nearest target upstream Triton 3.5 compiles, with
    gfx906's wave64 VALU and 256 VGPRs; not timed on a gfx906). A gfx906 issues few
    lane-instructions per byte of its bandwidth, so a decode GEMV there is bound by the VALU
    instructions a weight costs: each type takes the rows, word split (WSPLIT), folded scales
    (Q4_K's PAIRS = 2) and byte conversions (CVT) with the fewest that stay within 128 VGPRs,
    two waves per SIMD, each keeping rows x 16 bytes per lane in flight
    (tests/kernels/test_gfx9_code.py checks the bound)."""
    if qtype == "Q4_K":
        return 8, 2, True
    if qtype == "Q4_0":
        return 8, 1, True
    return 4, 1, True


def _pq_cuda_decode(qtype, N, K, sms):
    """(rows, warps, PREFETCH, PAIRS, WSPLIT) of a T = 1 GEMV on CUDA: the fastest configs of
    sweeps over the 9B's shapes, under PDL as the decode graphs launch them (docs/PERF.md).
    - Q4_K / Q4_0: 8 rows; 2 warps from N = 8192, 4 below and at N = 12288-16383. Q4_K folds
      its scales and splits its words (PAIRS = 2), but not in the down projections (N < 8192,
      K >= 12288), and asks for PREFETCH, which its down projections' programs, long enough
      (PREFETCH_FROM), take.
    - Q5_K: from N = 8192 8 rows, 2 warps, split words (in packed fp16 with fp16 activations);
      below, 4 rows, 1 warp, fp32 fields: the output projections there take the split norm's
      epilogue, under a 128-register cap (_launch_regs) that 8 rows would exceed.
    - Q6_K: 4 rows, split words, 2 warps with PREFETCH (4 warps at N <= 1024). The LM head
      (N >= 16384), the down projections (K >= 12288) and N = 12288-16383 take 8 rows (2, 4
      and 1 warps, the last with PREFETCH) for their fields in packed fp16; where the fields
      stay fp32 (fp32 activations, the SwiGLU epilogue) those run 4 rows (_pq_rows), as 8 rows
      of fp32 fields take too many registers.
    - Q8_0: 4 rows, unsplit; from N = 16384 2 warps with PREFETCH, else warps so that the grid
      holds about 24 warps per SM (PREFETCH at 4 warps).
    PREFETCH applies where a program makes PREFETCH_FROM iterations (_pq_loop_flags). With fp16
    activations packed_matmul runs Q4_K's, Q5_K's and Q6_K's fields in packed fp16 instead
    (PAIRS = 3, _pq_pairs)."""
    if qtype in ("Q4_K", "Q4_0"):
        pairs = 2 if qtype == "Q4_K" and not (N < 8192 and K >= 12288) else 1
        prefetch = qtype == "Q4_K"   # where its programs make 3 iterations or more
        if qtype == "Q4_K" and 12288 <= N < 16384:
            return 8, 4, prefetch, pairs, False
        return 8, (2 if N >= 8192 else 4), prefetch, pairs, False
    if qtype == "Q5_K":
        return (8, 2, False, 1, True) if N >= 8192 else (4, 1, False, 1, True)
    if qtype == "Q6_K":
        if N >= 16384:
            return 8, 2, False, 1, True
        if K >= 12288:
            return 8, 4, False, 1, True
        if N <= 1024:
            return 4, 4, False, 1, True
        if N >= 12288:
            return 8, 1, True, 1, True
        return 4, 2, True, 1, True
    if N >= 16384:
        return 4, 2, True, 1, False
    want = 24 * sms / triton.cdiv(N, 4)
    warps = 1 << max(0, min(2, round(math.log2(max(want, 1.0)))))
    return 4, warps, warps == 4, 1, False


def _pq_pairs(x, qtype, c, forced: bool, glu: bool = False) -> int:
    """The PAIRS a packed GEMV runs with: its config's, or 3 (fields in packed fp16, fewer
    instructions a weight than fp32 fields) for Q4_K, Q5_K and Q6_K decode with fp16
    activations off ROCm, one token a program and rows in pairs. At 2 or 4 rows the row
    regrouping compiles to byte permutes, so the default asks for 8 or more. Not on ROCm, where
    the gfx908 code needs more VGPRs for it (one wave per SIMD less), nor for Q6_K under the
    SwiGLU epilogue (glu), where its symmetric quants' fp16 rounding shows through
    silu(g) * u; linear_pair's launch keeps it for Q5_K only (_pq_pair_configs). A PAIRS of 3
    asked for where it does not apply (fp32 x, odd BLOCK_N, Q6_K's glu) runs the fp32 fields
    (Q4_K 2, the others 1)."""
    fits = (qtype in ("Q4_K", "Q5_K", "Q6_K") and x.dtype == torch.float16
            and c["BLOCK_N"] % 2 == 0 and not (glu and qtype == "Q6_K"))
    if c["PAIRS"] == 3 and not fits:
        return 2 if qtype == "Q4_K" else 1
    if not forced and fits and c["BLOCK_N"] >= 8 and c["BLOCK_T"] == 1 and not is_rocm():
        return 3
    return c["PAIRS"]


def _pq_rows(qtype, c, forced: bool) -> int:
    """The rows a packed GEMV program runs: its config's, but 4 for Q6_K's 8-row defaults where
    its fields stay fp32 (the 8 rows are for packed fp16: _pq_cuda_decode)."""
    if qtype == "Q6_K" and c["PAIRS"] != 3 and c["BLOCK_N"] == 8 and not forced:
        return 4
    return c["BLOCK_N"]


def _launch_regs(device, add_norm, glu, QT, pairs, preload=0) -> dict:
    """Launch options of a packed GEMV on CUDA: a register cap where ptxas's own choice costs
    resident programs, and only where the cap does not spill.
    - Q4_K's SwiGLU epilogue in packed fp16 (the gate/up GEMV): 96, where ptxas takes 128 with
      the compile-time row offsets and fewer programs then reside per SM.
    - ADD_NORM: 128, where ptxas takes more for the epilogue and leaves fewer 4-warp programs
      per SM than fit. Not where 128 would spill: Q4_K / Q4_0's unfolded scales (PAIRS < 2),
      and Q6_K's packed fp16 without PRELOAD."""
    if device.type != "cuda" or is_rocm():
        return {}
    if glu and QT == 2 and pairs == 3:
        return {"maxnreg": 96}
    if not add_norm or (QT in (1, 2) and pairs < 2) or (QT == 4 and pairs == 3 and not preload):
        return {}
    return {"maxnreg": 128}


def _whole_row_blocks(N, block_n, glu=False) -> bool:
    """EVEN_N of a packed GEMV: its rows fill every program (GLU: the gate rows, N / 2, fill
    the programs' block_n / 2), so row offsets are compile-time constants (_pq_gemv_program)."""
    return (N // 2) % (block_n // 2) == 0 if glu else N % block_n == 0


# The fewest whole iterations a program needs for PREFETCH: with fewer, the next iteration's
# early loads overlap too little to pay for the registers they hold. Q4_K pays from 3; the
# other types keep 4 (3 not timed for them).
PREFETCH_FROM = {"Q4_K": 3}


def _pq_loop_flags(KW, kw_len, H, prefetch, preload, qtype):
    """(EVEN, PREFETCH, PRELOAD) of packed GEMV programs of kw_len of a row's KW words and H
    threads: PREFETCH (the next iteration's loads issued early) only where each program has
    PREFETCH_FROM whole iterations; PRELOAD (the first iteration peeled before the PDL wait)
    where PREFETCH is not."""
    even = kw_len % (4 * H) == 0 and KW % kw_len == 0
    prefetch = bool(prefetch) and even and kw_len // (4 * H) >= PREFETCH_FROM.get(qtype, 4)
    return even, prefetch, bool(preload) and not prefetch


def _pq_pair_configs(x, pws):
    """The configs of the two GEMVs of linear_pair (one num_warps: the larger weight's),
    or None where one launch does not apply: not two packed weights of one K, not the T <= 16
    GEMV path (CUDA fp16 takes tensor cores from 2 tokens), a split K, or ROCm (its GEMVs' waves
    per program differ by type, so each keeps its own launch)."""
    T = x.shape[0]
    if (len(pws) != 2 or any(getattr(w, "planes", None) is None for w in pws)
            or pws[0].shape[1] != pws[1].shape[1] or not 0 < T <= 16 or is_rocm()
            or x.shape[1] != pws[0].shape[1] or x.stride(1) != 1 or _pq_takes_dot(x)):
        return None
    K = x.shape[1]
    cs = [_pq_gemv_config(T, w.shape[0], K, w.qtype, x.device) for w in pws]
    if any(c["SPLIT"] != 1 for c in cs):
        return None
    warps = max(zip(pws, cs), key=lambda wc: wc[0].nbytes)[1]["num_warps"]
    H = warp_size(x.device) * warps
    pdl = bool(pdl_args(x.device))
    for w, c in zip(pws, cs):
        KW = K // PQ_E[w.qtype]
        c["EVEN"], c["PREFETCH"], c["PRELOAD"] = _pq_loop_flags(KW, KW, H, c["PREFETCH"],
                                                                c["PRELOAD"] and pdl, w.qtype)
        c["num_warps"] = warps
        # Q5_K in packed fp16 here too; Q4_K's segment keeps its fields in fp32 (_pq_pairs)
        c["PAIRS"] = _pq_pairs(x, w.qtype, c, w.qtype != "Q5_K")
    return cs
