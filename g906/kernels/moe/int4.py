"""Triton routed experts over int4/int8 group-quantized weights (GroupQuantExperts: GPTQ, AWQ and
compressed-tensors MoE checkpoints, kept packed). Reference: reference.py (the weights'
dequantize_experts).

The same plan as kernel.py: decode (T <= GEMV_MAX_TOKENS) runs a routed GEMV per projection
that reads only the chosen experts' words, scales and zero points; prefill sorts the pairs by
expert (sort.py) and runs a grouped GEMM, gate and up in one tile with the SwiGLU fused, the down
GEMM scaled by the routing weights. Each step of BLOCK_K input features lies inside one group
(BLOCK_K divides the group size), so a row loads one scale (and zero point) a step; values are
dequantized as (q - z) * s in the activations' dtype (fp16 on gfx906) and accumulated in fp32.
The GEMV loads each word once and shifts its values out along a third axis (as the dense int4
GEMV does); the GEMM dequantizes a [BLOCK_N, BLOCK_K] tile for tl.dot (which has a
non-matrix-core lowering on gfx906).

Act order: the activations of each (token, expert) pair are permuted once, before the kernels,
by the chosen expert's permutation (X_PER_PAIR: the kernels then read x by pair, not by
token); gate and up rows may have permutations of their own (x_ptr / xu_ptr)."""

from __future__ import annotations

import torch
import triton
import triton.language as tl

from .._triton_util import empty
from ..int4.experts import GroupQuantExperts
from .common import GEMV_MAX_TOKENS, _dot_t, _tile_cols, _tile_pairs, routing, sum_pairs
from .sort import sort_by_expert


@triton.jit
def _scale_zero(s_ptr, z_ptr, off, BITS: tl.constexpr, HAS_Z: tl.constexpr, WT: tl.constexpr):
    s = tl.load(s_ptr + off).to(WT)
    if HAS_Z:
        z = tl.load(z_ptr + off).to(tl.int32)
    else:
        z = tl.zeros_like(off).to(tl.int32) + (1 << (BITS - 1))
    return s, z


@triton.jit
def _gq_rows_dot(qw_ptr, s_ptr, z_ptr, wrow, srow, x_ptr, K, BITS: tl.constexpr, GS: tl.constexpr,
                 HAS_Z: tl.constexpr, BLOCK_N: tl.constexpr, BLOCK_K: tl.constexpr):
    """[BLOCK_N] dots of the rows whose words start at qw_ptr + wrow and whose scales / zero
    points start at srow, with the vector x_ptr[0:K]."""
    WT = x_ptr.dtype.element_ty
    PACK: tl.constexpr = 32 // BITS
    MASK: tl.constexpr = (1 << BITS) - 1
    BKW: tl.constexpr = BLOCK_K // PACK
    rw = tl.arange(0, BKW)
    ri = tl.arange(0, PACK)
    KW = K // PACK
    acc = tl.zeros([BLOCK_N], tl.float32)
    for k0 in range(0, K, BLOCK_K):
        w = k0 // PACK + rw
        wm = w < KW
        words = tl.load(qw_ptr + wrow[:, None] + w[None, :], mask=wm[None, :], other=0)   # [BN, BKW]
        q = (words[:, :, None] >> (ri * BITS)[None, None, :]) & MASK                      # [BN, BKW, P]
        s, z = _scale_zero(s_ptr, z_ptr, srow + k0 // GS, BITS, HAS_Z, WT)
        wq = (q - z[:, None, None]).to(WT) * s[:, None, None]
        k = w[:, None] * PACK + ri[None, :]
        xk = tl.load(x_ptr + k, mask=wm[:, None], other=0.0)                              # [BKW, P]
        acc += tl.sum(tl.sum((wq * xk[None, :, :]).to(tl.float32), axis=2), axis=1)
    return acc


@triton.jit
def _gq_tile_gemm(xrow, xmask, qw_ptr, s_ptr, z_ptr, wrow, srow, K, acc, BITS: tl.constexpr,
                  GS: tl.constexpr, HAS_Z: tl.constexpr, BLOCK_K: tl.constexpr, FP32: tl.constexpr):
    """acc [M, N] + x rows (pointers xrow [M, 1]) @ the dequantized rows (words at qw_ptr + wrow,
    scales / zero points at srow) ^T."""
    WT = xrow.dtype.element_ty
    PACK: tl.constexpr = 32 // BITS
    MASK: tl.constexpr = (1 << BITS) - 1
    for k0 in range(0, K, BLOCK_K):
        kk = k0 + tl.arange(0, BLOCK_K)
        km = kk < K
        words = tl.load(qw_ptr + wrow[:, None] + (kk // PACK)[None, :], mask=km[None, :], other=0)
        q = (words >> ((kk % PACK) * BITS)[None, :]) & MASK
        s, z = _scale_zero(s_ptr, z_ptr, srow + k0 // GS, BITS, HAS_Z, WT)
        b = (q - z[:, None]).to(WT) * s[:, None]
        a = tl.load(xrow + kk[None, :], mask=xmask & km[None, :], other=0.0)
        acc = _dot_t(a, b, acc, FP32)
    return acc


@triton.jit
def _gq_routed_gate_up_kernel(x_ptr, xu_ptr, qw_ptr, s_ptr, z_ptr, ids_ptr, h_ptr, I, K, sx,
                              sqe, sqn, sse, ssn, sh, TOPK: tl.constexpr, X_PER_PAIR: tl.constexpr,
                              BITS: tl.constexpr, GS: tl.constexpr, HAS_Z: tl.constexpr,
                              BLOCK_N: tl.constexpr, BLOCK_K: tl.constexpr):
    p = tl.program_id(0)
    nn, nmask, nc = _tile_cols(I, BLOCK_N)          # rows past I read row 0
    e = tl.load(ids_ptr + p).to(tl.int64)
    if X_PER_PAIR:
        xo = p.to(tl.int64) * sx
    else:
        xo = (p // TOPK).to(tl.int64) * sx
    g = _gq_rows_dot(qw_ptr, s_ptr, z_ptr, e * sqe + nc * sqn, e * sse + nc * ssn, x_ptr + xo, K,
                     BITS, GS, HAS_Z, BLOCK_N, BLOCK_K)
    u = _gq_rows_dot(qw_ptr, s_ptr, z_ptr, e * sqe + (nc + I) * sqn, e * sse + (nc + I) * ssn, xu_ptr + xo, K,
                     BITS, GS, HAS_Z, BLOCK_N, BLOCK_K)
    h = g / (1.0 + tl.exp(-g)) * u
    tl.store(h_ptr + p.to(tl.int64) * sh + nn, h.to(h_ptr.dtype.element_ty), mask=nmask)


@triton.jit
def _gq_routed_down_kernel(h_ptr, qw_ptr, s_ptr, z_ptr, ids_ptr, tw_ptr, y_ptr, N, K, sh, sqe, sqn, sse, ssn,
                           sy, TOPK: tl.constexpr, BITS: tl.constexpr, GS: tl.constexpr, HAS_Z: tl.constexpr,
                           BLOCK_N: tl.constexpr, BLOCK_K: tl.constexpr):
    t = tl.program_id(0)
    nn, nmask, nc = _tile_cols(N, BLOCK_N)
    acc = tl.zeros([BLOCK_N], tl.float32)
    for j in range(TOPK):
        p = t * TOPK + j
        e = tl.load(ids_ptr + p).to(tl.int64)
        wt = tl.load(tw_ptr + p).to(tl.float32)
        acc += wt * _gq_rows_dot(qw_ptr, s_ptr, z_ptr, e * sqe + nc * sqn, e * sse + nc * ssn,
                                 h_ptr + p.to(tl.int64) * sh, K, BITS, GS, HAS_Z, BLOCK_N, BLOCK_K)
    tl.store(y_ptr + t.to(tl.int64) * sy + nn, acc.to(y_ptr.dtype.element_ty), mask=nmask)


@triton.jit(do_not_specialize=["num_pairs"])
def _gq_grouped_gate_up_kernel(x_ptr, xu_ptr, qw_ptr, s_ptr, z_ptr, pairs_ptr, tile_e_ptr, h_ptr, num_pairs,
                               I, K, sx, sqe, sqn, sse, ssn, sh, TOPK: tl.constexpr, X_PER_PAIR: tl.constexpr,
                               BITS: tl.constexpr, GS: tl.constexpr, HAS_Z: tl.constexpr,
                               BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr, BLOCK_K: tl.constexpr,
                               FP32: tl.constexpr):
    pm = tl.program_id(0)
    e = tl.load(tile_e_ptr + pm).to(tl.int64)
    if e < 0:        # a tile the routing left unused (sort.py sizes for the most tiles)
        return
    valid, rc = _tile_pairs(pairs_ptr, pm, num_pairs, BLOCK_M)
    if X_PER_PAIR:
        xo = rc[:, None] * sx
    else:
        xo = (rc // TOPK)[:, None] * sx
    nn, nmask, nc = _tile_cols(I, BLOCK_N)
    zero = tl.zeros([BLOCK_M, BLOCK_N], tl.float32)
    g = _gq_tile_gemm(x_ptr + xo, valid[:, None], qw_ptr, s_ptr, z_ptr, e * sqe + nc * sqn, e * sse + nc * ssn,
                      K, zero, BITS, GS, HAS_Z, BLOCK_K, FP32)
    u = _gq_tile_gemm(xu_ptr + xo, valid[:, None], qw_ptr, s_ptr, z_ptr, e * sqe + (nc + I) * sqn,
                      e * sse + (nc + I) * ssn, K, zero, BITS, GS, HAS_Z, BLOCK_K, FP32)
    h = g / (1.0 + tl.exp(-g)) * u
    tl.store(h_ptr + rc[:, None] * sh + nn[None, :], h.to(h_ptr.dtype.element_ty),
             mask=valid[:, None] & nmask[None, :])


@triton.jit(do_not_specialize=["num_pairs"])
def _gq_grouped_down_kernel(h_ptr, qw_ptr, s_ptr, z_ptr, pairs_ptr, tile_e_ptr, tw_ptr, out_ptr, num_pairs, N, K,
                            sh, sqe, sqn, sse, ssn, so, BITS: tl.constexpr, GS: tl.constexpr, HAS_Z: tl.constexpr,
                            BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr, BLOCK_K: tl.constexpr,
                            FP32: tl.constexpr):
    pm = tl.program_id(0)
    e = tl.load(tile_e_ptr + pm).to(tl.int64)
    if e < 0:
        return
    valid, rc = _tile_pairs(pairs_ptr, pm, num_pairs, BLOCK_M)
    nn, nmask, nc = _tile_cols(N, BLOCK_N)
    acc = _gq_tile_gemm(h_ptr + rc[:, None] * sh, valid[:, None], qw_ptr, s_ptr, z_ptr, e * sqe + nc * sqn,
                        e * sse + nc * ssn, K, tl.zeros([BLOCK_M, BLOCK_N], tl.float32), BITS, GS, HAS_Z,
                        BLOCK_K, FP32)
    wt = tl.load(tw_ptr + rc, mask=valid, other=0.0).to(tl.float32)
    tl.store(out_ptr + rc[:, None] * so + nn[None, :], acc * wt[:, None],
             mask=valid[:, None] & nmask[None, :])


def _ok(w) -> bool:
    if not isinstance(w, GroupQuantExperts):
        return False
    gs = w.group_size
    return (w.bits in (4, 8) and w.shape[2] % w.pack == 0
            and (w.per_channel or (gs >= 16 and gs & (gs - 1) == 0))
            and w.qweight.is_contiguous() and w.scales.is_contiguous()
            and (w.zeros is None or (w.zeros.is_contiguous() and w.zeros.shape == w.scales.shape)))


def supports(x, w_gate_up, w_down) -> bool:
    """Both projections group-quantized in the kernels' range (4 or 8 bits; groups of a power of
    two of at least 16 features, or one per row; contiguous planes)."""
    return _ok(w_gate_up) and _ok(w_down)


def _weight_args(w: GroupQuantExperts):
    z = w.zeros if w.zeros is not None else w.scales           # unread without zero points
    return (w.qweight, w.scales, z, w.qweight.stride(0), w.qweight.stride(1), w.scales.stride(0),
            w.scales.stride(1))


def _block_k(w: GroupQuantExperts, want: int) -> int:
    return want if w.per_channel else min(want, w.group_size)


def _per_pair(x: torch.Tensor, perm: torch.Tensor, section: int, flat_ids: torch.Tensor, k: int) -> torch.Tensor:
    """[T * k, K]: row p = x[p // k] in the column order of expert flat_ids[p]'s section."""
    rows = x.repeat_interleave(k, dim=0) if k > 1 else x
    return rows.gather(1, perm[:, section].index_select(0, flat_ids)).contiguous()


def moe_experts(x, w_gate_up: GroupQuantExperts, w_down: GroupQuantExperts, topk_ids, topk_weights, **cfg):
    """The routed experts (see reference.moe_experts) over group-quantized experts."""
    r = routing(x, w_gate_up, topk_ids, topk_weights)
    T, H, k, E, inter, y, ids, tw = r
    if T == 0:
        return y
    per_pair = w_gate_up.perm is not None
    if per_pair:
        flat = ids.long()
        xg = _per_pair(x, w_gate_up.perm, 0, flat, k)
        xu = xg if w_gate_up.perm.shape[1] == 1 else _per_pair(x, w_gate_up.perm, 1, flat, k)
    else:
        xg = xu = x
    qg, sg, zg, sqe_g, sqn_g, sse_g, ssn_g = _weight_args(w_gate_up)
    qd, sd, zd, sqe_d, sqn_d, sse_d, ssn_d = _weight_args(w_down)
    gate_q = dict(BITS=w_gate_up.bits, GS=w_gate_up.group_size, HAS_Z=w_gate_up.zeros is not None)
    down_q = dict(BITS=w_down.bits, GS=w_down.group_size, HAS_Z=w_down.zeros is not None)
    h = empty((T * k, inter), x.dtype, x.device)
    gemv = T <= GEMV_MAX_TOKENS
    gpu = x.device.type == "cuda"
    bn = cfg.get("BLOCK_N", 16 if gemv or not gpu else 64)
    bk = cfg.get("BLOCK_K", 64 if gemv else 32)
    warps = cfg.get("num_warps", 4)
    if gemv:
        _gq_routed_gate_up_kernel[(T * k, triton.cdiv(inter, bn))](
            xg, xu, qg, sg, zg, ids, h, inter, H, xg.stride(0), sqe_g, sqn_g, sse_g, ssn_g, h.stride(0),
            TOPK=k, X_PER_PAIR=per_pair, BLOCK_N=bn, BLOCK_K=_block_k(w_gate_up, bk), num_warps=warps, **gate_q)
    else:
        bm = cfg.get("BLOCK_M", 32 if gpu else 16)
        pairs, tile_e = sort_by_expert(topk_ids, E, bm)
        fp32 = x.dtype == torch.float32
        _gq_grouped_gate_up_kernel[(tile_e.numel(), triton.cdiv(inter, bn))](
            xg, xu, qg, sg, zg, pairs, tile_e, h, T * k, inter, H, xg.stride(0), sqe_g, sqn_g, sse_g, ssn_g,
            h.stride(0), TOPK=k, X_PER_PAIR=per_pair, BLOCK_M=bm, BLOCK_N=bn, BLOCK_K=_block_k(w_gate_up, bk),
            FP32=fp32, num_warps=warps, **gate_q)
    if w_down.perm is not None:          # h rows in the chosen expert's column order of down_proj
        h = h.gather(1, w_down.perm[:, 0].index_select(0, ids.long())).contiguous()
    if gemv:
        _gq_routed_down_kernel[(T, triton.cdiv(H, bn))](
            h, qd, sd, zd, ids, tw, y, H, inter, h.stride(0), sqe_d, sqn_d, sse_d, ssn_d, y.stride(0),
            TOPK=k, BLOCK_N=bn, BLOCK_K=_block_k(w_down, bk), num_warps=warps, **down_q)
        return y
    out = empty((T * k, H), torch.float32, x.device)
    _gq_grouped_down_kernel[(tile_e.numel(), triton.cdiv(H, bn))](
        h, qd, sd, zd, pairs, tile_e, tw, out, T * k, H, inter, h.stride(0), sqe_d, sqn_d, sse_d, ssn_d,
        out.stride(0), BLOCK_M=bm, BLOCK_N=bn, BLOCK_K=_block_k(w_down, bk), FP32=fp32, num_warps=warps,
        **down_q)
    return sum_pairs(out, r, x.dtype)
