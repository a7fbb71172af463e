"""Triton dequant-matmul over GroupQuantWeight (weight.py): a GEMV for decode (T <= 16); for
prefill on a GPU the weights dequantized a row block at a time for the vendor GEMM, elsewhere
a tiled GEMM (tl.dot, which has a non-matrix-core lowering on gfx906).

Both read the packed words of BLOCK_N rows and BLOCK_K input features a step (the GEMV each
word once, its values shifted out along a third axis; the GEMM per value, as tl.dot wants a
[BLOCK_K, BLOCK_N] tile), shift each value out of its word, and dequantize it as (q - z) * s in the activations' dtype (fp16 on gfx906:
(q - z) is exact there, one rounding for the scale) before the product, accumulated in fp32. A
step never straddles two groups (BLOCK_K divides the group size), so each row loads one scale
(and zero point) per step; a per-channel weight loads them once. Act-order weights are
reordered at load: the activations are permuted once per call (reference.permute_input) and
the loop reads the weight in order."""

from __future__ import annotations

import torch
import triton
import triton.language as tl

from .._triton_util import dequant_matmul, empty, next_pow2
from .reference import permute_input
from .weight import GroupQuantWeight


@triton.jit
def _dequant_tile(qw_ptr, s_ptr, z_ptr, rn, nm, k, km, k0, sq, ss, sz, s_one, z_one,
                  BITS: tl.constexpr, GS: tl.constexpr, ONE_GROUP: tl.constexpr,
                  HAS_Z: tl.constexpr, WT: tl.constexpr):
    """[BLOCK_N, BLOCK_K] dequantized weights of rows rn, features k (in WT)."""
    PACK: tl.constexpr = 32 // BITS
    MASK: tl.constexpr = (1 << BITS) - 1
    words = tl.load(qw_ptr + rn[:, None] * sq + (k // PACK)[None, :],
                    mask=nm[:, None] & km[None, :], other=0)
    q = (words >> ((k % PACK) * BITS)[None, :]) & MASK
    if ONE_GROUP:
        s = s_one
        z = z_one
    else:
        g = k0 // GS
        s = tl.load(s_ptr + rn * ss + g, mask=nm, other=0.0).to(WT)
        if HAS_Z:
            z = tl.load(z_ptr + rn * sz + g, mask=nm, other=0).to(tl.int32)
        else:
            z = tl.zeros_like(rn) + (1 << (BITS - 1))
    return (q - z[:, None]).to(WT) * s[:, None]


@triton.jit
def _row_params(s_ptr, z_ptr, rn, nm, ss, sz, BITS: tl.constexpr, HAS_Z: tl.constexpr, WT: tl.constexpr):
    """One group per row: its scale and zero point, loaded once for the whole K loop."""
    s = tl.load(s_ptr + rn * ss, mask=nm, other=0.0).to(WT)
    if HAS_Z:
        z = tl.load(z_ptr + rn * sz, mask=nm, other=0).to(tl.int32)
    else:
        z = tl.zeros_like(rn) + (1 << (BITS - 1))
    return s, z


@triton.jit
def _gq_gemv_kernel(x_ptr, qw_ptr, s_ptr, z_ptr, y_ptr, T, N, K, sx, sq, ss, sz, sy,
                    BITS: tl.constexpr, GS: tl.constexpr, ONE_GROUP: tl.constexpr,
                    HAS_Z: tl.constexpr, BLOCK_T: tl.constexpr, BLOCK_N: tl.constexpr,
                    BLOCK_K: tl.constexpr):
    """Each word is loaded once ([BLOCK_N, BLOCK_K / P] contiguous words a step, so the loads
    vectorise) and its P values shifted out along a third axis; x is read in the same
    [word, value] shape."""
    WT = x_ptr.dtype.element_ty
    PACK: tl.constexpr = 32 // BITS
    MASK: tl.constexpr = (1 << BITS) - 1
    BKW: tl.constexpr = BLOCK_K // PACK
    rn = tl.program_id(0) * BLOCK_N + tl.arange(0, BLOCK_N)
    rt = tl.arange(0, BLOCK_T)
    rw = tl.arange(0, BKW)
    ri = tl.arange(0, PACK)
    nm = rn < N
    tm = rt < T
    KW = K // PACK
    s, z = _row_params(s_ptr, z_ptr, rn, nm, ss, sz, BITS, HAS_Z, WT)
    acc = tl.zeros((BLOCK_T, BLOCK_N), dtype=tl.float32)
    for k0 in range(0, K, BLOCK_K):
        w = k0 // PACK + rw
        wm = w < KW
        words = tl.load(qw_ptr + rn[:, None] * sq + w[None, :], mask=nm[:, None] & wm[None, :], other=0)
        q = (words[:, :, None] >> (ri * BITS)[None, None, :]) & MASK           # [BN, BKW, P]
        if not ONE_GROUP:
            g = k0 // GS
            s = tl.load(s_ptr + rn * ss + g, mask=nm, other=0.0).to(WT)
            if HAS_Z:
                z = tl.load(z_ptr + rn * sz + g, mask=nm, other=0).to(tl.int32)
        wq = (q - z[:, None, None]).to(WT) * s[:, None, None]
        k = w[:, None] * PACK + ri[None, :]                                    # [BKW, P]
        xk = tl.load(x_ptr + rt[:, None, None] * sx + k[None, :, :],
                     mask=tm[:, None, None] & wm[None, :, None], other=0.0)    # [BT, BKW, P]
        prod = (xk[:, None, :, :] * wq[None, :, :, :]).to(tl.float32)           # [BT, BN, BKW, P]
        acc += tl.sum(tl.sum(prod, axis=3), axis=2)
    tl.store(y_ptr + rt[:, None] * sy + rn[None, :], acc.to(y_ptr.dtype.element_ty),
             mask=tm[:, None] & nm[None, :])


@triton.jit
def _gq_gemm_kernel(x_ptr, qw_ptr, s_ptr, z_ptr, y_ptr, T, N, K, sx, sq, ss, sz, sy,
                    BITS: tl.constexpr, GS: tl.constexpr, ONE_GROUP: tl.constexpr,
                    HAS_Z: tl.constexpr, IEEE: tl.constexpr, BLOCK_M: tl.constexpr,
                    BLOCK_N: tl.constexpr, BLOCK_K: tl.constexpr):
    WT = x_ptr.dtype.element_ty
    rm = tl.program_id(0) * BLOCK_M + tl.arange(0, BLOCK_M)
    rn = tl.program_id(1) * BLOCK_N + tl.arange(0, BLOCK_N)
    mm = rm < T
    nm = rn < N
    s_one, z_one = _row_params(s_ptr, z_ptr, rn, nm, ss, sz, BITS, HAS_Z, WT)
    acc = tl.zeros((BLOCK_M, BLOCK_N), dtype=tl.float32)
    for k0 in range(0, K, BLOCK_K):
        k = k0 + tl.arange(0, BLOCK_K)
        km = k < K
        w = _dequant_tile(qw_ptr, s_ptr, z_ptr, rn, nm, k, km, k0, sq, ss, sz, s_one, z_one,
                          BITS, GS, ONE_GROUP, HAS_Z, WT)
        xk = tl.load(x_ptr + rm[:, None] * sx + k[None, :], mask=mm[:, None] & km[None, :], other=0.0)
        if IEEE:
            acc += tl.dot(xk, tl.trans(w), input_precision="ieee")
        else:
            acc += tl.dot(xk, tl.trans(w))
    tl.store(y_ptr + rm[:, None] * sy + rn[None, :], acc.to(y_ptr.dtype.element_ty),
             mask=mm[:, None] & nm[None, :])


@triton.jit
def _gq_dequant_kernel(qw_ptr, s_ptr, z_ptr, out_ptr, N, K, sq, ss, sz, so,
                       BITS: tl.constexpr, GS: tl.constexpr, ONE_GROUP: tl.constexpr, HAS_Z: tl.constexpr,
                       BLOCK_N: tl.constexpr, BLOCK_K: tl.constexpr):
    """out [N, K] = the dense weights (in out's dtype), a [BLOCK_N, BLOCK_K] tile a program."""
    WT = out_ptr.dtype.element_ty
    rn = tl.program_id(0) * BLOCK_N + tl.arange(0, BLOCK_N)
    k0 = tl.program_id(1) * BLOCK_K
    k = k0 + tl.arange(0, BLOCK_K)
    nm = rn < N
    km = k < K
    s_one, z_one = _row_params(s_ptr, z_ptr, rn, nm, ss, sz, BITS, HAS_Z, WT)
    w = _dequant_tile(qw_ptr, s_ptr, z_ptr, rn, nm, k, km, k0, sq, ss, sz, s_one, z_one,
                      BITS, GS, ONE_GROUP, HAS_Z, WT)
    tl.store(out_ptr + rn[:, None].to(tl.int64) * so + k[None, :], w, mask=nm[:, None] & km[None, :])


def dequantize_rows(w: GroupQuantWeight, dtype: torch.dtype, rows: tuple[int, int] | None = None) -> torch.Tensor:
    """The dense [r1 - r0, K] weights of rows r0:r1 (all by default), in the weight's column
    order (an act-order weight's: the permuted input meets them)."""
    r0, r1 = rows if rows is not None else (0, w.shape[0])
    K = w.shape[1]
    out = torch.empty((r1 - r0, K), dtype=dtype, device=w.qweight.device)
    if r1 <= r0 or K == 0:
        return out
    zeros = w.zeros if w.zeros is not None else w.scales       # unread without zero points
    bn, bk = 16, block_k(w)
    _gq_dequant_kernel[(triton.cdiv(r1 - r0, bn), triton.cdiv(K, bk))](
        w.qweight[r0:], w.scales[r0:], zeros[r0:], out, r1 - r0, K, w.qweight.stride(0), w.scales.stride(0),
        zeros.stride(0), out.stride(0), BITS=w.bits, GS=w.group_size, ONE_GROUP=w.per_channel,
        HAS_Z=w.zeros is not None, BLOCK_N=bn, BLOCK_K=bk, num_warps=4)
    return out


GEMV_MAX_T = 16


def block_k(w: GroupQuantWeight) -> int:
    """Features a loop step reads: within one group (it divides the group size)."""
    return 64 if w.per_channel else min(64, w.group_size)


def supported(x: torch.Tensor, w: GroupQuantWeight) -> bool:
    """The kernels' range: fp16/fp32 activations [T, K], 4- or 8-bit words, groups of a power
    of two of at least 16 features (or one group per row)."""
    gs = w.group_size
    return (x.dim() == 2 and x.dtype in (torch.float16, torch.float32) and x.shape[1] == w.shape[1]
            and w.bits in (4, 8) and w.shape[1] % w.pack == 0
            and (w.per_channel or (gs >= 16 and gs & (gs - 1) == 0)))


def group_quant_matmul(x: torch.Tensor, w: GroupQuantWeight, *, block_n: int | None = None,
                       dense: bool | None = None) -> torch.Tensor:
    """x [T, K] @ dequantize(w)^T -> [T, N] in x's dtype. Above GEMV_MAX_T rows: the dense
    weights and the vendor GEMM (dense; default: on a GPU, for half-precision activations), else
    the tiled Triton GEMM."""
    xp = permute_input(x, w).contiguous()
    T, K = xp.shape
    N = w.shape[0]
    y = empty((T, N), x.dtype, x.device)
    if T == 0 or N == 0:
        return y
    zeros = w.zeros if w.zeros is not None else w.scales       # unread without zero points
    common = dict(BITS=w.bits, GS=w.group_size, ONE_GROUP=w.per_channel, HAS_Z=w.zeros is not None,
                  BLOCK_K=block_k(w))
    args = (xp, w.qweight, w.scales, zeros, y, T, N, K, xp.stride(0), w.qweight.stride(0),
            w.scales.stride(0), zeros.stride(0), y.stride(0))
    if T <= GEMV_MAX_T:
        bn = block_n or 32
        _gq_gemv_kernel[(triton.cdiv(N, bn),)](*args, BLOCK_T=next_pow2(T), BLOCK_N=bn, num_warps=4,
                                               **common)
    elif dense if dense is not None else (x.device.type == "cuda" and x.dtype != torch.float32):
        # prefill on a GPU: the vendor GEMM over dense row blocks, as the GGUF prefill does
        dequant_matmul(xp, N, K, lambda r0, r1: dequantize_rows(w, xp.dtype, (r0, r1)), y)
    else:
        bm, bn = 32, block_n or 64
        _gq_gemm_kernel[(triton.cdiv(T, bm), triton.cdiv(N, bn))](
            *args, IEEE=x.dtype == torch.float32, BLOCK_M=bm, BLOCK_N=bn, num_warps=4, **common)
    return y
