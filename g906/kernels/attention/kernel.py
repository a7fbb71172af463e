"""Triton kernels for paged attention.

Decode: one program per (sequence, kv head, split); each program serves all the query heads of
its kv head (GQA) over one slice of the sequence with an online softmax, writing either the
final output (one split) or fp32 partials + log-sum-exp that a second kernel combines (and
gates). Query heads are scored with tl.dot on CUDA (padded to 16 rows) and with a broadcast
multiply-reduce elsewhere (ROCm gfx906 has no matrix units: padded dots would waste 4x ALU),
where each position slot of a tile keeps its own online softmax (_decode_slots).

Prefill: one program per (query block, sequence, query head), causal over absolute positions,
keys/values read from the paged cache through the block table.
"""

from __future__ import annotations

import torch
import triton
import triton.language as tl

from .._triton_util import is_rocm, next_pow2, num_sms, empty, empty_like
from ..pdl import pdl_args, pdl_start

LOG2E = 1.4426950408889634


@triton.jit
def _block_ids(bt_row_ptr, n, nmask, block_size):
    return tl.load(bt_row_ptr + n // block_size, mask=nmask, other=0).to(tl.int64)


@triton.jit
def _load_kv_at(c_ptr, blk, n, nmask, kh, d, dmask, block_size, s_blk, s_off, s_h):
    off = (n % block_size).to(tl.int64)
    ptr = c_ptr + blk[:, None] * s_blk + off[:, None] * s_off + kh * s_h + d[None, :]
    return tl.load(ptr, mask=nmask[:, None] & dmask[None, :], other=0.0)


@triton.jit
def _load_kv_tile(c_ptr, bt_row_ptr, n, nmask, kh, d, dmask, block_size, s_blk, s_off, s_h):
    blk = _block_ids(bt_row_ptr, n, nmask, block_size)
    return _load_kv_at(c_ptr, blk, n, nmask, kh, d, dmask, block_size, s_blk, s_off, s_h)


@triton.jit
def _decode_slots(q_ptr, kc_ptr, vc_ptr, bt_row, blk, b64, kh, hq, gmask, d, dmask, start, end,
                  qk_scale, sq_b, sq_h, sk_blk, sk_off, sk_h, sv_blk, sv_off, sv_h, block_size,
                  BLOCK_G: tl.constexpr, BLOCK_N: tl.constexpr, BLOCK_D: tl.constexpr):
    """The decode loop without tl.dot (ROCm: gfx906 has no matrix units), as (acc [G, D],
    m [G], l [G]) of an online softmax over positions start..end.

    Each of a tile's BLOCK_N position slots keeps its own running max, sum and output
    ([G, N] and [G, N, D]): tiles are loaded as [1, N, D], so the products with q, the scores'
    sums over D (within a warp: D spans the lanes of one) and the accumulation all stay in the
    tiles' own layout, and nothing crosses warps until the slots are merged once at the end.
    (Reducing every tile over its positions, and scoring q[:, None, :] * k[None, :, :] from
    2-D tiles, cost two layout conversions and cross-warp sums through LDS per tile: 563 VALU
    and 290 LDS instructions per 8-position tile on gfx908, ~3x the issue budget of a
    memory-bound loop.)"""
    q = tl.load(q_ptr + b64 * sq_b + hq[:, None, None] * sq_h + d[None, None, :],
                mask=gmask[:, None, None] & dmask[None, None, :], other=0.0)
    q = q.to(tl.float32) * qk_scale                                  # [G, 1, D]
    d3 = d[None, None, :]
    dm3 = dmask[None, None, :]
    m_i = tl.full([BLOCK_G, BLOCK_N], float("-inf"), tl.float32)
    l_i = tl.zeros([BLOCK_G, BLOCK_N], tl.float32)
    acc = tl.zeros([BLOCK_G, BLOCK_N, BLOCK_D], tl.float32)
    for n0 in range(start, end, BLOCK_N):
        n = n0 + tl.arange(0, BLOCK_N)
        nmask = n < end
        off = (n % block_size).to(tl.int64)[None, :, None]
        b3 = blk[None, :, None]
        kvm = nmask[None, :, None] & dm3
        k = tl.load(kc_ptr + b3 * sk_blk + off * sk_off + kh * sk_h + d3, mask=kvm, other=0.0)
        v = tl.load(vc_ptr + b3 * sv_blk + off * sv_off + kh * sv_h + d3, mask=kvm, other=0.0)
        blk = _block_ids(bt_row, n + BLOCK_N, n + BLOCK_N < end, block_size)
        s = tl.sum(q * k.to(tl.float32), axis=2)                      # [G, N]
        s = tl.where(nmask[None, :], s, float("-inf"))
        m_new = tl.maximum(m_i, s)
        m_ok = tl.where(m_new == float("-inf"), 0.0, m_new)        # a slot with no position yet
        p = tl.exp2(s - m_ok)
        alpha = tl.exp2(m_i - m_ok)
        l_i = l_i * alpha + p
        acc = acc * alpha[:, :, None] + p[:, :, None] * v.to(tl.float32)
        m_i = m_new
    # merge the slots
    m = tl.max(m_i, axis=1)
    w = tl.exp2(m_i - tl.where(m == float("-inf"), 0.0, m)[:, None])
    return tl.sum(acc * w[:, :, None], axis=1), m, tl.sum(l_i * w, axis=1)


@triton.jit
def _decode_kernel(q_ptr, kc_ptr, vc_ptr, bt_ptr, sl_ptr, gate_ptr, out_ptr, po_ptr, pl_ptr,
                   qk_scale, sq_b, sq_h, sk_blk, sk_off, sk_h, sv_blk, sv_off, sv_h, sbt_b,
                   sg_b, sg_h, so_b, so_h, block_size, num_splits,
                   G: tl.constexpr, BLOCK_G: tl.constexpr, D: tl.constexpr, BLOCK_D: tl.constexpr,
                   BLOCK_N: tl.constexpr, DIRECT: tl.constexpr, HAS_GATE: tl.constexpr,
                   USE_DOT: tl.constexpr, FP32: tl.constexpr, PDL: tl.constexpr = False):
    pdl_start(PDL)
    b = tl.program_id(0)
    kh = tl.program_id(1)
    sp = tl.program_id(2)
    seq_len = tl.load(sl_ptr + b)
    # this sequence's own slice length: its context shared by all the splits (at least a tile
    # each), so a short sequence in a graph captured for long ones still has all its programs
    split_len = tl.cdiv(tl.cdiv(seq_len, num_splits), BLOCK_N) * BLOCK_N
    start = sp * split_len
    end = tl.minimum(start + split_len, seq_len)
    g = tl.arange(0, BLOCK_G)
    gmask = g < G
    hq = kh * G + g
    d = tl.arange(0, BLOCK_D)
    dmask = d < D
    b64 = b.to(tl.int64)
    bt_row = bt_ptr + b64 * sbt_b
    # the next tile's block ids are loaded with this tile's keys and values, so the table
    # lookup is not a memory round trip of its own in every iteration of the slice
    n = start + tl.arange(0, BLOCK_N)
    blk = _block_ids(bt_row, n, n < end, block_size)
    if USE_DOT:
        q = tl.load(q_ptr + b64 * sq_b + hq[:, None] * sq_h + d[None, :],
                    mask=gmask[:, None] & dmask[None, :], other=0.0)
        m_i = tl.full([BLOCK_G], float("-inf"), tl.float32)
        l_i = tl.zeros([BLOCK_G], tl.float32)
        acc = tl.zeros([BLOCK_G, BLOCK_D], tl.float32)
        for n0 in range(start, end, BLOCK_N):
            n = n0 + tl.arange(0, BLOCK_N)
            nmask = n < end
            k = _load_kv_at(kc_ptr, blk, n, nmask, kh, d, dmask, block_size, sk_blk, sk_off, sk_h)
            v = _load_kv_at(vc_ptr, blk, n, nmask, kh, d, dmask, block_size, sv_blk, sv_off, sv_h)
            blk = _block_ids(bt_row, n + BLOCK_N, n + BLOCK_N < end, block_size)
            if FP32:
                s = tl.dot(q, tl.trans(k), input_precision="ieee") * qk_scale
            else:
                s = tl.dot(q, tl.trans(k)) * qk_scale
            s = tl.where(nmask[None, :], s, float("-inf"))
            m_new = tl.maximum(m_i, tl.max(s, axis=1))
            p = tl.exp2(s - m_new[:, None])
            alpha = tl.exp2(m_i - m_new)
            l_i = l_i * alpha + tl.sum(p, axis=1)
            if FP32:
                pv = tl.dot(p, v, input_precision="ieee")
            else:
                pv = tl.dot(p.to(v.dtype), v)
            acc = acc * alpha[:, None] + pv
            m_i = m_new
    else:
        acc, m_i, l_i = _decode_slots(q_ptr, kc_ptr, vc_ptr, bt_row, blk, b64, kh, hq, gmask, d,
                                      dmask, start, end, qk_scale, sq_b, sq_h, sk_blk, sk_off,
                                      sk_h, sv_blk, sv_off, sv_h, block_size, BLOCK_G, BLOCK_N,
                                      BLOCK_D)
    omask = gmask[:, None] & dmask[None, :]
    if DIRECT:
        o = acc / l_i[:, None]
        if HAS_GATE:
            gt = tl.load(gate_ptr + b64 * sg_b + hq[:, None] * sg_h + d[None, :], mask=omask,
                         other=0.0).to(tl.float32)
            o = o / (1.0 + tl.exp(-gt))
        tl.store(out_ptr + b64 * so_b + hq[:, None] * so_h + d[None, :],
                 o.to(out_ptr.dtype.element_ty), mask=omask)
    else:
        # partials: po [B, Hq, S, D], pl [B, Hq, S]; an empty split leaves lse = -inf
        row = (b64 * (tl.num_programs(1) * G) + hq) * num_splits + sp
        o = acc / tl.where(l_i > 0, l_i, 1.0)[:, None]
        tl.store(po_ptr + row[:, None] * D + d[None, :], o, mask=omask)
        lse = tl.where(l_i > 0, m_i + tl.log2(tl.where(l_i > 0, l_i, 1.0)), float("-inf"))
        tl.store(pl_ptr + row, lse, mask=gmask)


@triton.jit
def _decode_reduce_kernel(po_ptr, pl_ptr, gate_ptr, out_ptr, num_splits, Hq, sg_b, sg_h, so_b,
                          so_h, D: tl.constexpr, BLOCK_D: tl.constexpr, BLOCK_S: tl.constexpr,
                          HAS_GATE: tl.constexpr, PDL: tl.constexpr = False):
    """One program per (sequence, query head, BLOCK_D columns of the head): every program
    reads the head's log-sum-exps, only its columns of the partial outputs."""
    pdl_start(PDL)
    b = tl.program_id(0).to(tl.int64)
    h = tl.program_id(1)
    s = tl.arange(0, BLOCK_S)
    d = tl.program_id(2) * BLOCK_D + tl.arange(0, BLOCK_D)
    smask = s < num_splits
    dmask = d < D
    row0 = (b * Hq + h) * num_splits
    lse = tl.load(pl_ptr + row0 + s, mask=smask, other=float("-inf"))
    mx = tl.max(lse, axis=0)
    w = tl.where(smask & (lse > float("-inf")), tl.exp2(lse - mx), 0.0)
    o = tl.load(po_ptr + (row0 + s)[:, None] * D + d[None, :], mask=smask[:, None] & dmask[None, :],
                other=0.0)
    out = tl.sum(o * w[:, None], axis=0) / tl.sum(w, axis=0)
    if HAS_GATE:
        gt = tl.load(gate_ptr + b * sg_b + h * sg_h + d, mask=dmask, other=0.0).to(tl.float32)
        out = out / (1.0 + tl.exp(-gt))
    tl.store(out_ptr + b * so_b + h * so_h + d, out.to(out_ptr.dtype.element_ty), mask=dmask)


# Partial outputs one reduce program holds: [splits, columns] fp32 tiles of at most this many
# elements (32 registers per thread at 4 warps; a whole wide head over many splits spills).
REDUCE_TILE = 4096


# Shortest context slice per decode program for a sequence that fills its block table: the
# split count is capped at max_ctx / MIN_SPLIT. Each slice is a serial chain of K/V tile
# loads, so short contexts want short slices. Once max_ctx / MIN_SPLIT passes the
# programs-per-SM cap the cap decides, so MIN_SPLIT only shortens the slices of short tables;
# long contexts (>= 16k) take MIN_SPLIT_LONG. Shorter sequences than the table allows run on
# the same programs with shorter slices (the kernel divides its own length).
MIN_SPLIT = 32
MIN_SPLIT_LONG = 256


def uses_dot(device) -> bool:
    """Whether decode scores query heads with tl.dot (CUDA) or the broadcast path."""
    return device.type == "cuda" and not is_rocm()


def _decode_config(q, k_cache, block_tables, num_kv, max_seq_len, block_n=None, per_sm=None,
                   min_split=None):
    B, Hq, D = q.shape
    G = Hq // num_kv
    use_dot = uses_dot(q.device)
    if use_dot:
        BLOCK_G = max(16, next_pow2(G))
        BLOCK_N = 64 if D <= 128 else 32
    else:
        BLOCK_G = next_pow2(G)
        # the slots' accumulators [G, N, D] over 256 lanes: 32 registers a lane where two waves
        # per SIMD can be had (decode_launch_options: G <= 4), else 64: one wave either way, and
        # a longer tile spends fewer instructions per K/V element
        acc_elems = 8192 if BLOCK_G <= 4 else 16384
        BLOCK_N = max(4, min(64, acc_elems // (BLOCK_G * next_pow2(D))))
    if block_n is not None:
        BLOCK_N = block_n
    max_ctx = block_tables.shape[1] * k_cache.shape[1]
    if max_seq_len is not None:
        max_ctx = min(max_ctx, int(max_seq_len))
    max_ctx = max(max_ctx, 1)
    if per_sm is None:
        # with the block ids prefetched, 2 programs per SM (longer slices) suit the tl.dot
        # path; the broadcast path (ROCm) walks 8-position tiles, where 2 per SM would chain
        # ~140 of them a slice at 32k on 60 CUs, so it keeps shorter slices
        if use_dot:
            per_sm = 2
        else:
            per_sm = 8 if max_ctx >= 16384 else 4
    target = per_sm * num_sms(q.device)
    if min_split is None:
        min_split = MIN_SPLIT_LONG if max_ctx >= 16384 else MIN_SPLIT
    splits = max(1, min(triton.cdiv(target, B * num_kv), triton.cdiv(max_ctx, min_split)))
    # no split that a full-length sequence would leave empty (the kernel's own rounding)
    splits = triton.cdiv(max_ctx, triton.cdiv(triton.cdiv(max_ctx, splits), BLOCK_N) * BLOCK_N)
    return G, BLOCK_G, BLOCK_N, splits, use_dot


def decode_launch_options(use_dot, rocm, BLOCK_G, BLOCK_N, BLOCK_D, num_warps) -> dict:
    """Compiler options of a decode launch beyond num_warps. ROCm's broadcast path asks LLVM for
    two waves per SIMD (<= 128 VGPRs) for heads of at most 4 queries a KV head whose slots'
    accumulators take at most 32 registers a lane: the gfx908 code for the 9B's heads (G = 4,
    D = 256, 8 positions) takes one wave per SIMD without it, and two with it at the same loop,
    a few values that live across the loop (the epilogue's) parked outside it (AGPRs on
    gfx908, scratch on gfx906: once a program, none in the loop). The 27B's (G = 6, padded
    to 8) would spill inside the loop: they take one wave with longer tiles (_decode_config;
    tests/kernels/test_gfx9_code.py)."""
    if (use_dot or not rocm or BLOCK_G > 4
            or BLOCK_G * BLOCK_N * BLOCK_D > 32 * 64 * num_warps):
        return {}
    return {"waves_per_eu": 2}


def paged_decode_attention(q, k_cache, v_cache, block_tables, seq_lens, scale, *, gate=None,
                           max_seq_len=None, num_splits=None, block_n=None, num_warps=4,
                           per_sm=None, min_split=None):
    B, Hq, D = q.shape
    num_kv = k_cache.shape[2]
    out = empty_like(q)
    if B == 0:
        return out
    G, BLOCK_G, BLOCK_N, splits, use_dot = _decode_config(
        q, k_cache, block_tables, num_kv, max_seq_len, block_n, per_sm, min_split)
    if num_splits is not None:  # explicit override (tests / tuning)
        splits = max(1, int(num_splits))
    direct = splits == 1
    if direct:
        po = pl = out
    else:
        po = empty((B, Hq, splits, D), torch.float32, q.device)
        pl = empty((B, Hq, splits), torch.float32, q.device)
    g = gate if gate is not None else q
    BLOCK_D = next_pow2(D)
    _decode_kernel[(B, num_kv, splits)](
        q, k_cache, v_cache, block_tables, seq_lens, g, out, po, pl, float(scale) * LOG2E,
        q.stride(0), q.stride(1), k_cache.stride(0), k_cache.stride(1), k_cache.stride(2),
        v_cache.stride(0), v_cache.stride(1), v_cache.stride(2), block_tables.stride(0),
        g.stride(0), g.stride(1), out.stride(0), out.stride(1), k_cache.shape[1], splits,
        G=G, BLOCK_G=BLOCK_G, D=D, BLOCK_D=BLOCK_D, BLOCK_N=BLOCK_N, DIRECT=direct,
        HAS_GATE=gate is not None, USE_DOT=use_dot, FP32=q.dtype == torch.float32,
        num_warps=num_warps, **pdl_args(q.device),
        **decode_launch_options(use_dot, is_rocm(), BLOCK_G, BLOCK_N, BLOCK_D, num_warps))
    if not direct:
        BLOCK_S = next_pow2(splits)
        block_dr = max(16, min(BLOCK_D, REDUCE_TILE // BLOCK_S))
        _decode_reduce_kernel[(B, Hq, triton.cdiv(D, block_dr))](
            po, pl, g, out, splits, Hq, g.stride(0), g.stride(1), out.stride(0), out.stride(1),
            D=D, BLOCK_D=block_dr, BLOCK_S=BLOCK_S, HAS_GATE=gate is not None,
            num_warps=4, **pdl_args(q.device))
    return out


@triton.jit
def _prefill_kernel(q_ptr, kc_ptr, vc_ptr, bt_ptr, cu_ptr, sl_ptr, gate_ptr, out_ptr, qk_scale,
                    sq_t, sq_h, sk_blk, sk_off, sk_h, sv_blk, sv_off, sv_h, sbt_b, sg_t, sg_h,
                    so_t, so_h, block_size, G,
                    D: tl.constexpr, BLOCK_D: tl.constexpr, BLOCK_M: tl.constexpr,
                    BLOCK_N: tl.constexpr, HAS_GATE: tl.constexpr, FP32: tl.constexpr):
    mb = tl.program_id(0)
    b = tl.program_id(1)
    h = tl.program_id(2)
    q_start = tl.load(cu_ptr + b)
    q_len = tl.load(cu_ptr + b + 1) - q_start
    if mb * BLOCK_M >= q_len:
        return
    seq_len = tl.load(sl_ptr + b)
    ctx = seq_len - q_len
    kh = h // G
    rows = mb * BLOCK_M + tl.arange(0, BLOCK_M)
    rmask = rows < q_len
    d = tl.arange(0, BLOCK_D)
    dmask = d < D
    t = (q_start + rows).to(tl.int64)
    q = tl.load(q_ptr + t[:, None] * sq_t + h * sq_h + d[None, :],
                mask=rmask[:, None] & dmask[None, :], other=0.0)
    qpos = ctx + rows
    m_i = tl.full([BLOCK_M], float("-inf"), tl.float32)
    l_i = tl.zeros([BLOCK_M], tl.float32)
    acc = tl.zeros([BLOCK_M, BLOCK_D], tl.float32)
    end = tl.minimum(seq_len, ctx + (mb + 1) * BLOCK_M)
    bt_row = bt_ptr + b.to(tl.int64) * sbt_b
    for n0 in range(0, end, BLOCK_N):
        n = n0 + tl.arange(0, BLOCK_N)
        nmask = n < end
        k = _load_kv_tile(kc_ptr, bt_row, n, nmask, kh, d, dmask, block_size, sk_blk, sk_off, sk_h)
        v = _load_kv_tile(vc_ptr, bt_row, n, nmask, kh, d, dmask, block_size, sv_blk, sv_off, sv_h)
        if FP32:
            s = tl.dot(q, tl.trans(k), input_precision="ieee") * qk_scale
        else:
            s = tl.dot(q, tl.trans(k)) * qk_scale
        s = tl.where(nmask[None, :] & (n[None, :] <= qpos[:, None]), s, float("-inf"))
        m_new = tl.maximum(m_i, tl.max(s, axis=1))
        p = tl.exp2(s - m_new[:, None])
        alpha = tl.exp2(m_i - m_new)
        l_i = l_i * alpha + tl.sum(p, axis=1)
        if FP32:
            pv = tl.dot(p, v, input_precision="ieee")
        else:
            pv = tl.dot(p.to(v.dtype), v)
        acc = acc * alpha[:, None] + pv
        m_i = m_new
    o = acc / l_i[:, None]
    omask = rmask[:, None] & dmask[None, :]
    if HAS_GATE:
        gt = tl.load(gate_ptr + t[:, None] * sg_t + h * sg_h + d[None, :], mask=omask,
                     other=0.0).to(tl.float32)
        o = o / (1.0 + tl.exp(-gt))
    tl.store(out_ptr + t[:, None] * so_t + h * so_h + d[None, :], o.to(out_ptr.dtype.element_ty),
             mask=omask)


def prefill_attention(q, k_cache, v_cache, block_tables, cu_seqlens_q, seq_lens, scale, *,
                      gate=None, max_seqlen_q=None):
    T, Hq, D = q.shape
    B = seq_lens.shape[0]
    num_kv = k_cache.shape[2]
    out = empty_like(q)
    if T == 0 or B == 0:
        return out
    if max_seqlen_q is None:
        max_seqlen_q = int((cu_seqlens_q[1:] - cu_seqlens_q[:-1]).max())
    BLOCK_D = next_pow2(D)
    if q.device.type != "cuda":
        BLOCK_M, BLOCK_N, warps = 16, 16, 4
    elif is_rocm():
        BLOCK_M, BLOCK_N, warps = (64, 32, 4) if BLOCK_D <= 128 else (32, 32, 4)
    else:
        BLOCK_M, BLOCK_N, warps = (64, 64, 4) if BLOCK_D <= 128 else (64, 32, 8)
    g = gate if gate is not None else q
    grid = (triton.cdiv(max_seqlen_q, BLOCK_M), B, Hq)
    _prefill_kernel[grid](
        q, k_cache, v_cache, block_tables, cu_seqlens_q, seq_lens, g, out, float(scale) * LOG2E,
        q.stride(0), q.stride(1), k_cache.stride(0), k_cache.stride(1), k_cache.stride(2),
        v_cache.stride(0), v_cache.stride(1), v_cache.stride(2), block_tables.stride(0),
        g.stride(0), g.stride(1), out.stride(0), out.stride(1), k_cache.shape[1], Hq // num_kv,
        D=D, BLOCK_D=BLOCK_D, BLOCK_M=BLOCK_M, BLOCK_N=BLOCK_N, HAS_GATE=gate is not None,
        FP32=q.dtype == torch.float32, num_warps=warps)
    return out
