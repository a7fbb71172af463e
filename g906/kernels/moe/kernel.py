"""Triton kernels of the routed experts (reference: reference.py).

Decode (T <= GEMV_MAX_TOKENS): a routed GEMV per projection. Program (pair p = t * k + j, tile of
rows) reads expert topk_ids[p]'s gate and up rows only and writes silu(gate) * up; the down
projection's program (token t, tile of rows) loops over t's k chosen experts, weighting each
by its routing weight, so the output needs no reduction pass. The bytes read are the chosen
experts' blocks: the active bytes, which bound an MoE decode step.
Prefill and batches: the pairs are grouped by expert (sort.py) and a grouped GEMM runs over tiles
of one expert's pairs, gate and up in the same tile with their SwiGLU in the epilogue; the down
GEMM scales its rows by the routing weights and the k rows of a token are summed after.

Weights: dense [E, N, K] (the model's dtype) or GGUF blocks of the fused types (uint8 [E, N,
row_bytes], decoded 256 elements a step by linear/gguf_decode.py); int4/int8 group-quantized
experts (GPTQ / AWQ / compressed-tensors) take the kernels of int4.py. fp32 accumulation; tl.dot
has a non-matrix-core lowering (gfx906)."""

from __future__ import annotations

import torch
import triton
import triton.language as tl

from .._triton_util import empty, is_rocm
from ..int4.experts import is_group_quant_experts
from ..linear.gguf_decode import QTYPES, STEP_BYTES, _dequant_step
from .common import GEMV_MAX_TOKENS, _dot_t, _tile_cols, _tile_pairs, routing, sum_pairs
from .sort import sort_by_expert

FUSED_QTYPES = tuple(QTYPES)


@triton.jit
def _rows_dot(w_ptr, row_off, x_ptr, K, QT: tl.constexpr, STEP_B: tl.constexpr, BLOCK_N: tl.constexpr,
              BLOCK_K: tl.constexpr):
    """[BLOCK_N] dots of the rows starting at w_ptr + row_off (elements, or bytes for GGUF
    blocks) with the vector x_ptr[0:K]."""
    if QT < 0:
        acc = tl.zeros([BLOCK_N, BLOCK_K], tl.float32)
        for k0 in range(0, K, BLOCK_K):
            kk = k0 + tl.arange(0, BLOCK_K)
            km = kk < K
            w = tl.load(w_ptr + row_off[:, None] + kk[None, :], mask=km[None, :], other=0.0)
            xv = tl.load(x_ptr + kk, mask=km, other=0.0)
            acc += w.to(tl.float32) * xv.to(tl.float32)[None, :]
        res = tl.sum(acc, axis=1)
    else:
        rowp = w_ptr + row_off[:, None, None]
        res = tl.zeros([BLOCK_N], tl.float32)
        for st in range(0, K // 256):
            w0, e0, w1, e1 = _dequant_step(rowp + st * STEP_B, QT)
            x0 = tl.load(x_ptr + st * 256 + e0).to(tl.float32)
            x1 = tl.load(x_ptr + st * 256 + e1).to(tl.float32)
            res += tl.sum(tl.sum(w0 * x0 + w1 * x1, axis=2), axis=1)
    return res


@triton.jit
def _routed_gate_up_kernel(x_ptr, w_ptr, ids_ptr, h_ptr, I, K, sx, swe, swn, sh,
                           TOPK: tl.constexpr, QT: tl.constexpr, STEP_B: tl.constexpr,
                           BLOCK_N: tl.constexpr, BLOCK_K: tl.constexpr):
    p = tl.program_id(0)
    nn, nmask, nc = _tile_cols(I, BLOCK_N)          # rows past I read row 0
    e = tl.load(ids_ptr + p).to(tl.int64)
    xp = x_ptr + (p // TOPK).to(tl.int64) * sx
    g = _rows_dot(w_ptr, e * swe + nc * swn, xp, K, QT, STEP_B, BLOCK_N, BLOCK_K)
    u = _rows_dot(w_ptr, e * swe + (nc + I) * swn, xp, K, QT, STEP_B, BLOCK_N, BLOCK_K)
    h = g / (1.0 + tl.exp(-g)) * u
    tl.store(h_ptr + p.to(tl.int64) * sh + nn, h.to(h_ptr.dtype.element_ty), mask=nmask)


@triton.jit
def _routed_down_kernel(h_ptr, w_ptr, ids_ptr, tw_ptr, y_ptr, N, K, sh, swe, swn, sy,
                        TOPK: tl.constexpr, QT: tl.constexpr, STEP_B: tl.constexpr,
                        BLOCK_N: tl.constexpr, BLOCK_K: tl.constexpr):
    t = tl.program_id(0)
    nn, nmask, nc = _tile_cols(N, BLOCK_N)
    acc = tl.zeros([BLOCK_N], tl.float32)
    for j in range(TOPK):
        p = t * TOPK + j
        e = tl.load(ids_ptr + p).to(tl.int64)
        wt = tl.load(tw_ptr + p).to(tl.float32)
        acc += wt * _rows_dot(w_ptr, e * swe + nc * swn, h_ptr + p.to(tl.int64) * sh, K, QT, STEP_B,
                              BLOCK_N, BLOCK_K)
    tl.store(y_ptr + t.to(tl.int64) * sy + nn, acc.to(y_ptr.dtype.element_ty), mask=nmask)


@triton.jit
def _tile_gemm(xrow, xmask, w_ptr, row_off, K, acc, QT: tl.constexpr, STEP_B: tl.constexpr,
               BLOCK_N: tl.constexpr, BLOCK_K: tl.constexpr, FP32: tl.constexpr, K32: tl.constexpr):
    """acc [M, N] + x rows (pointers xrow [M, 1]) @ the weight rows at w_ptr + row_off [N]^T."""
    if QT < 0:
        for k0 in range(0, K, BLOCK_K):
            kk = k0 + tl.arange(0, BLOCK_K)
            km = kk < K
            a = tl.load(xrow + kk[None, :], mask=xmask & km[None, :], other=0.0)
            b = tl.load(w_ptr + row_off[:, None] + kk[None, :], mask=km[None, :], other=0.0)
            acc = _dot_t(a, b, acc, FP32)
    else:
        rowp = w_ptr + row_off[:, None, None]
        for st in range(0, K // 256):
            w0, e0, w1, e1 = _dequant_step(rowp + st * STEP_B, QT)
            kb = st * 256
            a0 = tl.load(xrow + kb + tl.reshape(e0, (1, 128)), mask=xmask, other=0.0)
            a1 = tl.load(xrow + kb + tl.reshape(e1, (1, 128)), mask=xmask, other=0.0)
            if K32:
                acc = _dot_t_k32(a0, tl.reshape(w0, (BLOCK_N, 128)), acc, FP32)
                acc = _dot_t_k32(a1, tl.reshape(w1, (BLOCK_N, 128)), acc, FP32)
            else:
                acc = _dot_t(a0, tl.reshape(w0, (BLOCK_N, 128)), acc, FP32)
                acc = _dot_t(a1, tl.reshape(w1, (BLOCK_N, 128)), acc, FP32)
    return acc


@triton.jit
def _quarters(t):
    """The four [R, 32] parts of t [R, 128] whose columns are k = 4 i + q (q = 0..3)."""
    lo, hi = tl.split(tl.reshape(t, (t.shape[0], 32, 2, 2)))
    q0, q1 = tl.split(lo)
    q2, q3 = tl.split(hi)
    return q0, q1, q2, q3


@triton.jit
def _dot_t_k32(a, b, acc, FP32: tl.constexpr):
    """acc + a [M, 128] @ b [N, 128]^T as four products of 32 columns (the same columns of a and
    b: the sum is unchanged). tl.dot's FMA lowering (gfx906: no matrix cores) holds a thread's
    whole K of both operands in registers: 128 spills, 32 does not (tests/kernels/test_gfx9_moe.py)."""
    a0, a1, a2, a3 = _quarters(a)
    b0, b1, b2, b3 = _quarters(b)
    acc = _dot_t(a0, b0, acc, FP32)
    acc = _dot_t(a1, b1, acc, FP32)
    acc = _dot_t(a2, b2, acc, FP32)
    return _dot_t(a3, b3, acc, FP32)


@triton.jit(do_not_specialize=["num_pairs"])
def _grouped_gate_up_kernel(x_ptr, w_ptr, pairs_ptr, tile_e_ptr, h_ptr, num_pairs, I, K, sx, swe, swn, sh,
                            TOPK: tl.constexpr, QT: tl.constexpr, STEP_B: tl.constexpr,
                            BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr, BLOCK_K: tl.constexpr,
                            FP32: tl.constexpr, K32: tl.constexpr):
    pm = tl.program_id(0)
    e = tl.load(tile_e_ptr + pm).to(tl.int64)
    if e < 0:        # a tile the routing left unused (sort.py sizes for the most tiles)
        return
    valid, rc = _tile_pairs(pairs_ptr, pm, num_pairs, BLOCK_M)
    xrow = x_ptr + (rc // TOPK)[:, None] * sx
    nn, nmask, nc = _tile_cols(I, BLOCK_N)
    g = _tile_gemm(xrow, valid[:, None], w_ptr, e * swe + nc * swn, K,
                   tl.zeros([BLOCK_M, BLOCK_N], tl.float32), QT, STEP_B, BLOCK_N, BLOCK_K, FP32, K32)
    u = _tile_gemm(xrow, valid[:, None], w_ptr, e * swe + (nc + I) * swn, K,
                   tl.zeros([BLOCK_M, BLOCK_N], tl.float32), QT, STEP_B, BLOCK_N, BLOCK_K, FP32, K32)
    h = g / (1.0 + tl.exp(-g)) * u
    tl.store(h_ptr + rc[:, None] * sh + nn[None, :], h.to(h_ptr.dtype.element_ty),
             mask=valid[:, None] & nmask[None, :])


@triton.jit(do_not_specialize=["num_pairs"])
def _grouped_down_kernel(h_ptr, w_ptr, pairs_ptr, tile_e_ptr, tw_ptr, out_ptr, num_pairs, N, K, sh, swe, swn,
                         so, QT: tl.constexpr, STEP_B: tl.constexpr, BLOCK_M: tl.constexpr,
                         BLOCK_N: tl.constexpr, BLOCK_K: tl.constexpr, FP32: tl.constexpr,
                         K32: tl.constexpr):
    pm = tl.program_id(0)
    e = tl.load(tile_e_ptr + pm).to(tl.int64)
    if e < 0:
        return
    valid, rc = _tile_pairs(pairs_ptr, pm, num_pairs, BLOCK_M)
    nn, nmask, nc = _tile_cols(N, BLOCK_N)
    acc = _tile_gemm(h_ptr + rc[:, None] * sh, valid[:, None], w_ptr, e * swe + nc * swn, K,
                     tl.zeros([BLOCK_M, BLOCK_N], tl.float32), QT, STEP_B, BLOCK_N, BLOCK_K, FP32, K32)
    wt = tl.load(tw_ptr + rc, mask=valid, other=0.0).to(tl.float32)
    tl.store(out_ptr + rc[:, None] * so + nn[None, :], acc * wt[:, None],
             mask=valid[:, None] & nmask[None, :])


def _weight_args(w):
    """(tensor, QT, step bytes, expert stride, row stride): dense weights (QT -1) or GGUF blocks."""
    if isinstance(w, torch.Tensor):
        return w, -1, 1, w.stride(0), w.stride(1)
    d = w.data
    return d, QTYPES[w.qtype], STEP_BYTES[w.qtype], d.stride(0), d.stride(1)


def supports(x, w_gate_up, w_down, topk_ids, topk_weights) -> bool:
    """The calls these kernels take: x [T, H] fp16/fp32 rows contiguous; each weight dense of
    x's dtype (contiguous) or GGUF blocks of a fused type whose rows are whole 256-element steps."""
    if x.dim() != 2 or x.dtype not in (torch.float16, torch.float32) or not x.is_contiguous():
        return False
    if is_group_quant_experts(w_gate_up) or is_group_quant_experts(w_down):
        from .int4 import supports as int4_supports

        return int4_supports(x, w_gate_up, w_down)
    for w in (w_gate_up, w_down):
        if isinstance(w, torch.Tensor):
            if w.dtype != x.dtype or not w.is_contiguous():
                return False
        elif getattr(w, "qtype", None) not in FUSED_QTYPES or w.shape[2] % 256 or not w.data.is_contiguous():
            return False
    return True


def on_gpu(device) -> bool:
    return device.type == "cuda"


def moe_config(T, device, qtype: str | None = None) -> dict:
    """Tiles of the routed GEMV (T <= GEMV_MAX_TOKENS: BLOCK_N rows, BLOCK_K elements of a dense
    row a step) and of the grouped GEMM (BLOCK_M pairs x BLOCK_N rows x BLOCK_K); smaller tiles
    in the interpreter (CPU). K32: a GGUF step's dots taken 32 columns at a time (_dot_t_k32;
    CUDA's tensor cores take the 128 at once). qtype: the experts' GGUF type (None: dense). On ROCm the grouped
    GEMM of GGUF experts takes smaller tiles, the largest whose gfx908 code (FMA dots, as a
    gfx906 runs them) needs no AGPRs at the 35B-A3B shape: 16 x 16 for Q4_K / Q5_K (their
    scales and minimums decoded in fp32), 32 x 32 for the others (tests/kernels/test_gfx9_moe.py)."""
    if T <= GEMV_MAX_TOKENS:
        return dict(BLOCK_N=16, BLOCK_K=128, num_warps=4)
    if not on_gpu(device):
        return dict(BLOCK_M=16, BLOCK_N=16, BLOCK_K=32, num_warps=4, K32=True)
    if qtype is not None and is_rocm():
        tile = 16 if qtype in ("Q4_K", "Q5_K") else 32
        return dict(BLOCK_M=tile, BLOCK_N=tile, BLOCK_K=32, num_warps=4, K32=True)
    return dict(BLOCK_M=32, BLOCK_N=64, BLOCK_K=32, num_warps=4, K32=False)


def moe_experts(x, w_gate_up, w_down, topk_ids, topk_weights, **cfg):
    if is_group_quant_experts(w_gate_up):     # GPTQ / AWQ / compressed-tensors experts (int4.py)
        from .int4 import moe_experts as int4_moe_experts

        return int4_moe_experts(x, w_gate_up, w_down, topk_ids, topk_weights, **cfg)
    r = routing(x, w_gate_up, topk_ids, topk_weights)
    T, H, k, E, inter, y, ids, tw = r
    if T == 0:
        return y
    wg, qg, sbg, seg, sng = _weight_args(w_gate_up)
    wd, qd, sbd, sed, snd = _weight_args(w_down)
    h = empty((T * k, inter), x.dtype, x.device)
    c = {**moe_config(T, x.device, getattr(w_gate_up, "qtype", None)), **cfg}
    if T <= GEMV_MAX_TOKENS:
        bn, bk, warps = c["BLOCK_N"], c["BLOCK_K"], c["num_warps"]
        _routed_gate_up_kernel[(T * k, triton.cdiv(inter, bn))](
            x, wg, ids, h, inter, H, x.stride(0), seg, sng, h.stride(0),
            TOPK=k, QT=qg, STEP_B=sbg, BLOCK_N=bn, BLOCK_K=bk, num_warps=warps)
        _routed_down_kernel[(T, triton.cdiv(H, bn))](
            h, wd, ids, tw, y, H, inter, h.stride(0), sed, snd, y.stride(0),
            TOPK=k, QT=qd, STEP_B=sbd, BLOCK_N=bn, BLOCK_K=bk, num_warps=warps)
        return y
    bm, bn, bk, warps, k32 = c["BLOCK_M"], c["BLOCK_N"], c["BLOCK_K"], c["num_warps"], c["K32"]
    pairs, tile_e = sort_by_expert(topk_ids, E, bm)
    n_tiles = tile_e.numel()
    fp32 = x.dtype == torch.float32
    _grouped_gate_up_kernel[(n_tiles, triton.cdiv(inter, bn))](
        x, wg, pairs, tile_e, h, T * k, inter, H, x.stride(0), seg, sng, h.stride(0),
        TOPK=k, QT=qg, STEP_B=sbg, BLOCK_M=bm, BLOCK_N=bn, BLOCK_K=bk, FP32=fp32, K32=k32, num_warps=warps)
    out = empty((T * k, H), torch.float32, x.device)
    _grouped_down_kernel[(n_tiles, triton.cdiv(H, bn))](
        h, wd, pairs, tile_e, tw, out, T * k, H, inter, h.stride(0), sed, snd, out.stride(0),
        QT=qd, STEP_B=sbd, BLOCK_M=bm, BLOCK_N=bn, BLOCK_K=bk, FP32=fp32, K32=k32, num_warps=warps)
    return sum_pairs(out, r, x.dtype)
