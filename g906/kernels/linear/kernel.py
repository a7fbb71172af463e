"""Triton kernels for linear layers.

- Dense skinny GEMM (T <= 16 rows, fp16/fp32 weights [N, K]): each program owns BLOCK_N
  output features and streams their weight rows once, for all T input rows.
- GGUF dequant-GEMV (T <= 16) and dequant-GEMM (prefill): each step of the K loop decodes
  256 weight elements per row (one K-quant super-block, or 8 blocks of 32) as two register
  tiles of shape [BLOCK_N, P, Q] (P*Q = 128) whose element order follows the block's byte
  order; the activations are gathered in the same order, so no shuffle is needed. The GEMM
  flattens the tiles to [BLOCK_N, 128] and uses tl.dot.

All weight bytes are read from the raw GGUF blocks (uint8 [rows, row_bytes]); scales are fp16
read byte-wise, so no alignment beyond one byte is assumed.

- Repacked weights (PackedQuant, g906/kernels/linear/repack.py, made once at load time on GPUs):
  `packed_matmul` below, with 16-byte loads and whole-word decoding (docs/kernels-linear.md).
"""

from __future__ import annotations

import functools
import math

import torch
import triton
import triton.language as tl

from .._triton_util import empty, is_rocm, next_pow2, num_sms
from ..pdl import pdl_args, pdl_start
from .residual_norm import add_norm_load, add_norm_store, rms_partials, rms_scale

QTYPES = {"Q8_0": 0, "Q4_0": 1, "Q4_K": 2, "Q5_K": 3, "Q6_K": 4}
# bytes of one 256-element step for each type
STEP_BYTES = {"Q8_0": 8 * 34, "Q4_0": 8 * 18, "Q4_K": 144, "Q5_K": 176, "Q6_K": 210}
# shape [P, Q] of the two register tiles one step decodes into (P * Q = 128)
PART_SHAPE = {"Q8_0": (4, 32), "Q4_0": (8, 16), "Q4_K": (4, 32), "Q5_K": (4, 32), "Q6_K": (8, 16)}
# weight bytes to keep in flight over the whole device per K step (H200-measured: ~3-6 MB)
INFLIGHT_BYTES = 3 << 20
QINFLIGHT_BYTES = 8 << 20
# dense decode GEMVs up to this many weights (0.8B's projections: <= 8.4M; 9B's: >= 16.8M)
# take the short-row config (_gemv_config_cached)
SMALL_GEMV_ELEMENTS = 12 << 20


@triton.jit
def _f16_at(p):
    lo = tl.load(p).to(tl.uint16)
    hi = tl.load(p + 1).to(tl.uint16)
    return (lo | (hi << 8)).to(tl.float16, bitcast=True).to(tl.float32)


@triton.jit
def _u8(p):
    return tl.load(p).to(tl.int32)


@triton.jit
def _k_scale_min(base, j):
    """6-bit scale and min of sub-block j (any int tensor) of a Q4_K/Q5_K super-block."""
    lo = j < 4
    jm = tl.where(lo, j, j - 4)
    s_j = _u8(base + 4 + jm)          # scales[j] (j<4) | scales[j-4] (j>=4)
    s_j4 = _u8(base + 4 + jm + 4)     # scales[j+4] (j<4) | scales[j] (j>=4)
    s_j8 = _u8(base + 4 + jm + 8)     # scales[j+4] for j>=4
    sc = tl.where(lo, s_j & 63, (s_j8 & 15) | ((s_j >> 6) << 4))
    m = tl.where(lo, s_j4 & 63, (s_j8 >> 4) | ((s_j4 >> 6) << 4))
    return sc.to(tl.float32), m.to(tl.float32)


@triton.jit
def _dequant_step(rowp, QT: tl.constexpr):
    """Decode 256 elements of each row. rowp: [BN, 1, 1] uint8 pointers at the step's first byte.
    Returns (w0, e0, w1, e1): fp32 tiles [BN, P, Q] and their element offsets [1, P, Q]."""
    if QT == 0:  # Q8_0: 8 blocks of 34 bytes, parts = blocks 0-3 and 4-7
        p = tl.arange(0, 4)[None, :, None]
        l = tl.arange(0, 32)[None, None, :]
        b0 = rowp + p * 34
        b1 = rowp + (p + 4) * 34
        w0 = tl.load(b0 + 2 + l).to(tl.int8, bitcast=True).to(tl.float32) * _f16_at(b0)
        w1 = tl.load(b1 + 2 + l).to(tl.int8, bitcast=True).to(tl.float32) * _f16_at(b1)
        e0 = p * 32 + l
        e1 = (p + 4) * 32 + l
    elif QT == 1:  # Q4_0: 8 blocks of 18 bytes; low nibbles = elements 0-15, high = 16-31
        p = tl.arange(0, 8)[None, :, None]
        l = tl.arange(0, 16)[None, None, :]
        bb = rowp + p * 18
        d = _f16_at(bb)
        qs = _u8(bb + 2 + l)
        w0 = ((qs & 15) - 8).to(tl.float32) * d
        w1 = ((qs >> 4) - 8).to(tl.float32) * d
        e0 = p * 32 + l
        e1 = p * 32 + 16 + l
    elif QT == 2 or QT == 3:  # Q4_K / Q5_K: groups g of 64 = (sub-block 2g: low, 2g+1: high)
        g = tl.arange(0, 4)[None, :, None]
        l = tl.arange(0, 32)[None, None, :]
        d = _f16_at(rowp)
        dmin = _f16_at(rowp + 2)
        sc0, m0 = _k_scale_min(rowp, 2 * g)
        sc1, m1 = _k_scale_min(rowp, 2 * g + 1)
        if QT == 2:
            qs = _u8(rowp + 16 + g * 32 + l)
            q0 = qs & 15
            q1 = qs >> 4
        else:
            qs = _u8(rowp + 48 + g * 32 + l)
            qh = _u8(rowp + 16 + l)
            q0 = (qs & 15) | (((qh >> (2 * g)) & 1) << 4)
            q1 = (qs >> 4) | (((qh >> (2 * g + 1)) & 1) << 4)
        w0 = (d * sc0) * q0.to(tl.float32) - dmin * m0
        w1 = (d * sc1) * q1.to(tl.float32) - dmin * m1
        e0 = g * 64 + l
        e1 = g * 64 + 32 + l
    else:  # Q6_K: s in 0..7 = (half h = s//4, quarter s%4), r in 0..15
        s = tl.arange(0, 8)[None, :, None]
        r = tl.arange(0, 16)[None, None, :]
        h = s // 4
        s4 = s % 4
        d = _f16_at(rowp + 208)
        ql = _u8(rowp + 16 * s + r)
        qh = _u8(rowp + 128 + 32 * h + 16 * (s4 % 2) + r)
        sh = 2 * (s4 // 2)
        q0 = ((ql & 15) | (((qh >> sh) & 3) << 4)) - 32
        q1 = ((ql >> 4) | (((qh >> (sh + 4)) & 3) << 4)) - 32
        sc0 = tl.load(rowp + 192 + 8 * h + s4).to(tl.int8, bitcast=True).to(tl.float32)
        sc1 = tl.load(rowp + 196 + 8 * h + s4).to(tl.int8, bitcast=True).to(tl.float32)
        w0 = (d * sc0) * q0.to(tl.float32)
        w1 = (d * sc1) * q1.to(tl.float32)
        e0 = 128 * h + 16 * s4 + r
        e1 = 128 * h + 64 + 16 * s4 + r
    return w0, e0, w1, e1


@triton.jit
def _qgemv_kernel(x_ptr, w_ptr, out_ptr, N, K, T, sx_t, sw_n, so_t, n_steps,
                  QT: tl.constexpr, STEP_B: tl.constexpr, BLOCK_N: tl.constexpr,
                  BLOCK_T: tl.constexpr, P: tl.constexpr, Q: tl.constexpr,
                  UNROLL: tl.constexpr):
    # Partial products accumulate in a [BLOCK_T, BLOCK_N, P, Q] register tile and are reduced
    # once at the end (no cross-lane reduction inside the loop); UNROLL steps per iteration
    # keep enough weight bytes in flight (about N * UNROLL * STEP_B over the whole chip).
    pid = tl.program_id(0)
    nn = pid * BLOCK_N + tl.arange(0, BLOCK_N)
    nmask = nn < N
    nc = tl.where(nmask, nn, 0).to(tl.int64)          # clamp: rows past N read row 0
    rowp = w_ptr + nc[:, None, None] * sw_n
    tt = tl.arange(0, BLOCK_T)
    tm = (tt < T)[:, None, None, None]
    xrow = x_ptr + tt.to(tl.int64)[:, None, None, None] * sx_t
    acc = tl.zeros([BLOCK_T, BLOCK_N, P, Q], tl.float32)
    for st0 in range(0, n_steps, UNROLL):
        for j in tl.static_range(UNROLL):
            st = st0 + j
            w0, e0, w1, e1 = _dequant_step(rowp + st * STEP_B, QT)
            kb = st * 256
            x0 = tl.load(xrow + kb + e0[None], mask=tm, other=0.0).to(tl.float32)
            x1 = tl.load(xrow + kb + e1[None], mask=tm, other=0.0).to(tl.float32)
            acc += w0[None] * x0 + w1[None] * x1
    res = tl.sum(tl.sum(acc, axis=3), axis=2)
    tl.store(out_ptr + tt[:, None] * so_t + nn[None, :], res.to(out_ptr.dtype.element_ty),
             mask=(tt[:, None] < T) & nmask[None, :])


@triton.jit
def _qgemv_row_kernel(x_ptr, w_ptr, out_ptr, N, sw_n, n_steps, QT: tl.constexpr,
                      STEP_B: tl.constexpr, BLOCK_N: tl.constexpr):
    """T == 1: reduce each step's products to [BLOCK_N] at once (measured faster on H200 than
    the 4-D accumulator for the K-quants and Q8_0 at one row)."""
    pid = tl.program_id(0)
    nn = pid * BLOCK_N + tl.arange(0, BLOCK_N)
    nmask = nn < N
    nc = tl.where(nmask, nn, 0).to(tl.int64)          # clamp: rows past N read row 0
    rowp = w_ptr + nc[:, None, None] * sw_n
    acc = tl.zeros([BLOCK_N], tl.float32)
    for st in range(0, n_steps):
        w0, e0, w1, e1 = _dequant_step(rowp + st * STEP_B, QT)
        kb = st * 256
        x0 = tl.load(x_ptr + kb + e0).to(tl.float32)
        x1 = tl.load(x_ptr + kb + e1).to(tl.float32)
        acc += tl.sum(tl.sum(w0 * x0 + w1 * x1, axis=2), axis=1)
    tl.store(out_ptr + nn, acc.to(out_ptr.dtype.element_ty), mask=nmask)


@triton.jit(do_not_specialize=["M"])
def _qgemm_kernel(x_ptr, w_ptr, out_ptr, M, N, sx_t, sw_n, so_t, n_steps,
                  QT: tl.constexpr, STEP_B: tl.constexpr, BLOCK_M: tl.constexpr,
                  BLOCK_N: tl.constexpr, FP32: tl.constexpr):
    pm = tl.program_id(0)
    pn = tl.program_id(1)
    mm = pm * BLOCK_M + tl.arange(0, BLOCK_M)
    nn = pn * BLOCK_N + tl.arange(0, BLOCK_N)
    mmask = mm < M
    nmask = nn < N
    nc = tl.where(nmask, nn, 0).to(tl.int64)
    rowp = w_ptr + nc[:, None, None] * sw_n
    xrow = x_ptr + mm.to(tl.int64)[:, None] * sx_t
    acc = tl.zeros([BLOCK_M, BLOCK_N], tl.float32)
    for st in range(0, n_steps):
        w0, e0, w1, e1 = _dequant_step(rowp + st * STEP_B, QT)
        kb = st * 256
        e0f = tl.reshape(e0, (1, 128))
        e1f = tl.reshape(e1, (1, 128))
        x0 = tl.load(xrow + kb + e0f, mask=mmask[:, None], other=0.0)
        x1 = tl.load(xrow + kb + e1f, mask=mmask[:, None], other=0.0)
        w0f = tl.reshape(w0, (BLOCK_N, 128))
        w1f = tl.reshape(w1, (BLOCK_N, 128))
        if FP32:
            acc += tl.dot(x0, tl.trans(w0f), input_precision="ieee")
            acc += tl.dot(x1, tl.trans(w1f), input_precision="ieee")
        else:
            acc += tl.dot(x0, tl.trans(w0f.to(x0.dtype)))
            acc += tl.dot(x1, tl.trans(w1f.to(x1.dtype)))
    tl.store(out_ptr + mm.to(tl.int64)[:, None] * so_t + nn[None, :],
             acc.to(out_ptr.dtype.element_ty), mask=mmask[:, None] & nmask[None, :])


@triton.jit
def _load_silu_mul(x_ptr, p, m, K):
    """silu(x[p]) * x[p + K] (rows hold [gate | up], K apart), fp32 math rounded to x's dtype like
    the silu-mul kernel's output: the MLP's down projection fed without that kernel."""
    g = tl.load(p, mask=m, other=0.0).to(tl.float32)
    u = tl.load(p + K, mask=m, other=0.0).to(tl.float32)
    return (g / (1.0 + tl.exp(-g)) * u).to(x_ptr.dtype.element_ty)


@triton.jit
def _gemv_input(x_ptr, xrow, ks, xm, K, z_ptr, nw_ptr, tt, sz_t, sz_h, eps,
                PRO: tl.constexpr, G: tl.constexpr, BLOCK_T: tl.constexpr, BLOCK_K: tl.constexpr):
    """The [BLOCK_T, BLOCK_K] activations at columns ks, after the op that fed them (fused here
    so that op needs no kernel of its own; each program recomputes it for its K range, a few
    flops per weight row it streams). PRO 0: x itself. 1: silu(x[:, k]) * x[:, K + k] (rows
    hold [gate | up]). 2: gated RMSNorm per group of G columns (one head): norm(x) * nw *
    silu(z), z [T, K / G, G] with strides (sz_t, sz_h, 1). fp32 math, rounded to x's dtype
    like the separate kernels' outputs."""
    if PRO == 1:
        return _load_silu_mul(x_ptr, xrow + ks[None, :], xm, K)
    if PRO == 2:
        o = tl.reshape(tl.load(xrow + ks[None, :], mask=xm, other=0.0).to(tl.float32),
                       (BLOCK_T, BLOCK_K // G, G))
        r = tl.rsqrt(tl.sum(o * o, axis=2) / G + eps)                     # per (token, head)
        h = tl.reshape(o * r[:, :, None], (BLOCK_T, BLOCK_K))
        zp = z_ptr + tt.to(tl.int64)[:, None] * sz_t + (ks // G)[None, :] * sz_h + (ks % G)[None, :]
        z = tl.load(zp, mask=xm, other=0.0).to(tl.float32)
        nw = tl.load(nw_ptr + ks % G).to(tl.float32)
        return (h * nw[None, :] * (z / (1.0 + tl.exp(-z)))).to(x_ptr.dtype.element_ty)
    return tl.load(xrow + ks[None, :], mask=xm, other=0.0)


@triton.jit
def _gemv_weights(wrow, ks, K, EVEN_K: tl.constexpr):
    if EVEN_K:
        w = tl.load(wrow + ks[None, :])
    else:
        w = tl.load(wrow + ks[None, :], mask=(ks < K)[None, :], other=0.0)
    return w


@triton.jit
def _gemv_step(acc, w, x_ptr, xrow, ks, tmask, K, z_ptr, nw_ptr, tt, sz_t, sz_h, eps,
               PRO: tl.constexpr, G: tl.constexpr, BLOCK_T: tl.constexpr, BLOCK_K: tl.constexpr,
               USE_DOT: tl.constexpr, EVEN_K: tl.constexpr):
    """acc plus the products of one K block: weights w [BLOCK_N, BLOCK_K] at columns ks."""
    if EVEN_K:
        xm = tmask[:, None]
    else:
        xm = tmask[:, None] & (ks < K)[None, :]
    x = _gemv_input(x_ptr, xrow, ks, xm, K, z_ptr, nw_ptr, tt, sz_t, sz_h, eps,
                    PRO, G, BLOCK_T, BLOCK_K)
    if USE_DOT:
        acc += tl.dot(x, tl.trans(w.to(x.dtype)))
    else:
        acc += x.to(tl.float32)[:, None, :] * w.to(tl.float32)[None, :, :]
    return acc


@triton.jit
def _gemv_kernel(x_ptr, w_ptr, out_ptr, N, K, T, sx_t, sw_n, so_t, z_ptr, nw_ptr, sz_t, sz_h, eps,
                 r_ptr, sr, hn_ptr, anw_ptr, ss_out_ptr, ss_in_ptr, P_in, eps_in,
                 BLOCK_N: tl.constexpr, BLOCK_K: tl.constexpr, BLOCK_T: tl.constexpr,
                 USE_DOT: tl.constexpr, EVEN_K: tl.constexpr, PRO: tl.constexpr = 0,
                 G: tl.constexpr = 1, ADD_NORM: tl.constexpr = 0, RMS_IN: tl.constexpr = False,
                 BLOCK_P: tl.constexpr = 1, PDL: tl.constexpr = False):
    """ADD_NORM (1; 2: zero-centred weight): out is h = y + r; hn = h * anw and the partial
    sums of h * h go to hn_ptr, ss_out_ptr (residual_norm.py). RMS_IN: x is such an hn, each
    token's sums are scaled by 1 / rms from its P_in (<= BLOCK_P) partial sums at ss_in_ptr.
    The first K block of weights is loaded before the PDL wait: weights are constants, so
    while the kernel before finishes, the weight stream already runs (no restart of it at
    every kernel boundary of a decode step)."""
    pid = tl.program_id(0)
    nn = pid * BLOCK_N + tl.arange(0, BLOCK_N)
    nmask = nn < N
    nc = tl.where(nmask, nn, 0).to(tl.int64)
    kk = tl.arange(0, BLOCK_K)
    wrow = w_ptr + nc[:, None] * sw_n
    w0 = _gemv_weights(wrow, kk, K, EVEN_K)
    pdl_start(PDL)
    tt = tl.arange(0, BLOCK_T)
    tmask = tt < T
    xrow = x_ptr + tt[:, None] * sx_t
    if ADD_NORM:
        r_an, w_an = add_norm_load(tt, nn, T, N, r_ptr, sr, anw_ptr, ADD_NORM == 2)
    if RMS_IN:
        parts = rms_partials(ss_in_ptr, P_in, tt, T, BLOCK_T, BLOCK_P)
    if USE_DOT:
        acc = tl.zeros([BLOCK_T, BLOCK_N], tl.float32)
    else:
        acc = tl.zeros([BLOCK_T, BLOCK_N, BLOCK_K], tl.float32)
    acc = _gemv_step(acc, w0, x_ptr, xrow, kk, tmask, K, z_ptr, nw_ptr, tt, sz_t, sz_h, eps,
                     PRO, G, BLOCK_T, BLOCK_K, USE_DOT, EVEN_K)
    for k0 in range(BLOCK_K, K, BLOCK_K):
        ks = k0 + kk
        acc = _gemv_step(acc, _gemv_weights(wrow, ks, K, EVEN_K), x_ptr, xrow, ks, tmask, K,
                         z_ptr, nw_ptr, tt, sz_t, sz_h, eps, PRO, G, BLOCK_T, BLOCK_K, USE_DOT,
                         EVEN_K)
    if not USE_DOT:
        acc = tl.sum(acc, axis=2)
    if RMS_IN:
        acc = acc * rms_scale(parts, K, eps_in)[:, None]
    if ADD_NORM:
        add_norm_store(acc, r_an, w_an, tt, nn, T, N, out_ptr, hn_ptr, so_t, ss_out_ptr)
    else:
        tl.store(out_ptr + tt[:, None] * so_t + nn[None, :], acc.to(out_ptr.dtype.element_ty),
                 mask=tmask[:, None] & nmask[None, :])


def _gemv_config(T, N, K, device, dtype):
    return dict(_gemv_config_cached(T, N, K, device, dtype))      # callers update their copy


@functools.lru_cache(maxsize=4096)
def _gemv_config_cached(T, N, K, device, dtype):
    bt = next_pow2(T)
    use_dot = (device.type == "cuda" and not is_rocm() and bt > 4 and dtype == torch.float16)
    if use_dot:  # H200: 91% of copy bandwidth at 12288x4096, T=8 (docs/PERF.md)
        return dict(BLOCK_T=max(16, bt), BLOCK_N=32, BLOCK_K=128, USE_DOT=True, num_warps=4)
    if bt == 1 and N * K <= SMALL_GEMV_ELEMENTS:
        # 0.8B-sized weights: 4 rows x 1024 columns (2048 for N < 4096) per program step. H200,
        # seventh session: best of 24 configs or within 3% on every 0.8B projection alone, and
        # the 0.8B decode row 1,150 -> 1,198 tok/s. The 9B projections were 6-28% faster alone
        # with it too, but the 9B decode row went 224 -> 218: there every GEMV carries the split
        # RMSNorm, whose partial sums grow with the programs on both sides (residual_norm.py)
        block_k = min(next_pow2(K), 1024 if N >= 4096 else 2048)
        block_n = 4
    elif bt == 1:
        # keep about INFLIGHT_BYTES of weights in flight: N * BLOCK_K * elem bytes per K step
        esize = 2 if dtype == torch.float16 else 4
        block_k = next_pow2(max(1, INFLIGHT_BYTES // (N * esize)))
        block_k = max(min(256, next_pow2(K)), min(2048, block_k, next_pow2(K)))
        block_n = max(1, min(16, 4096 // block_k))
    else:
        block_k = 128 if bt <= 2 else 64
        # broadcast path: BLOCK_T * BLOCK_N * BLOCK_K fp32 partial sums in registers
        block_n = max(1, min(16, 4096 // (bt * block_k)))
    return dict(BLOCK_T=bt, BLOCK_N=block_n, BLOCK_K=block_k, USE_DOT=False, num_warps=4)


def dense_gemv(x, weight, *, prologue=None, add_norm=None, rms_of=None, **cfg):
    """x [T, K] @ weight^T for T <= 16. prologue: None, ("silu_mul",) with x [T, 2K] holding
    [gate | up], or ("gated_norm", z, norm_weight, eps) with x [T, K] = heads of G =
    norm_weight.numel() columns and z [T, K/G, G] (see _gemv_input). add_norm, rms_of: the
    RMSNorm split over two GEMVs (residual_norm.py); add_norm returns (h, hn, partial sums)."""
    T = x.shape[0]
    K = weight.shape[1]
    N = weight.shape[0]
    assert weight.stride(1) == 1 and x.stride(1) == 1
    x, rms_of = _rms_in_registers(x, rms_of)
    out = empty((T, N), x.dtype, x.device)
    c = _gemv_config(T, N, K, x.device, x.dtype)
    c.update(cfg)
    pro, G, z, nw, sz_t, sz_h, eps = 0, 1, x, x, 0, 0, 0.0
    if prologue is not None and prologue[0] == "silu_mul":
        assert x.shape[1] == 2 * K
        pro = 1
    elif prologue is not None:
        _, z, nw, eps = prologue
        pro, G = 2, nw.numel()
        assert z.stride(2) == 1 and z.shape[1] * G == K and x.shape[1] == K
        sz_t, sz_h = z.stride(0), z.stride(1)
        if c["BLOCK_K"] % G:           # whole heads per K block
            c["BLOCK_K"] = G
            if not c["USE_DOT"]:
                c["BLOCK_N"] = max(1, min(c["BLOCK_N"], 4096 // (c["BLOCK_T"] * G)))
    else:
        assert x.shape[1] == K
    hn, r, sr, anw, ss_out, zc = _add_norm_args(add_norm, out, triton.cdiv(N, c["BLOCK_N"]))
    ss_in, p_in, eps_in = _rms_of_args(rms_of, x)
    warps = c.pop("num_warps")
    if T > 0:
        _gemv_kernel[(triton.cdiv(N, c["BLOCK_N"]),)](
            x, weight, out, N, K, T, x.stride(0), weight.stride(0), out.stride(0), z, nw, sz_t,
            sz_h, float(eps), r, sr, hn, anw, ss_out, ss_in, p_in, eps_in,
            EVEN_K=K % c["BLOCK_K"] == 0, PRO=pro, G=G, ADD_NORM=zc, RMS_IN=rms_of is not None,
            BLOCK_P=next_pow2(p_in), num_warps=warps, **c, **pdl_args(x.device))
    return (out, hn, ss_out) if add_norm is not None else out


def _add_norm_args(add_norm, out, programs):
    """(hn, residual, its row stride, norm weight, partial sums [T, programs], ADD_NORM) for a
    GEMV of `programs` programs along N whose out is h."""
    if add_norm is None:
        return out, out, 0, out, out, 0
    residual, nw, zero_centred = add_norm
    assert residual.shape == out.shape and residual.stride(-1) == 1 and nw.numel() == out.shape[1]
    ss = empty((out.shape[0], programs), torch.float32, out.device)
    return (empty(out.shape, out.dtype, out.device), residual, residual.stride(0), nw, ss,
            2 if zero_centred else 1)


def _rms_in_registers(x, rms_of):
    """rms_of, or None with x scaled first (reference.rms_in) where its partial sums are too
    many to hold in registers through the GEMV's loop (rms_partials)."""
    if rms_of is not None and next_pow2(x.shape[0]) * next_pow2(rms_of[0].shape[1]) > 4096:
        from .reference import rms_in

        return rms_in(x, rms_of), None
    return x, rms_of


def _rms_of_args(rms_of, x):
    """(partial sums [T, P], P, eps) for a GEMV whose activations are hn (residual_norm.py)."""
    if rms_of is None:
        return x, 1, 0.0
    ss, eps = rms_of
    assert ss.dim() == 2 and ss.shape[0] == x.shape[0] and ss.is_contiguous()
    return ss, ss.shape[1], float(eps)


# A fused op is recomputed by every program for its whole K range: programs x K x T elements,
# each an exp and a reciprocal (the SFU: 16 per clock per SM on the H200). Measured there
# (engine profile, decode): 0.8B's down and output projections (0.9-1.8M elements) run faster
# fused than as two kernels; 9B's (2.1-12.6M) lose 4-7 us per call, more than the separate
# kernel's 2-3 us. Above this many the two ops run separately.
FUSED_RECOMPUTE_MAX = 2_000_000


def _recompute_ok(T, N, K, block_n) -> bool:
    return triton.cdiv(N, block_n) * K * T <= FUSED_RECOMPUTE_MAX


def _gemv_fusable(x, weight) -> bool:
    if not (isinstance(weight, torch.Tensor) and 0 < x.shape[0] <= 16 and x.dim() == 2
            and weight.dtype == x.dtype and weight.stride(1) == 1):
        return False
    N, K = weight.shape
    c = _gemv_config(x.shape[0], N, K, x.device, x.dtype)
    return _recompute_ok(x.shape[0], N, K, c["BLOCK_N"])


def _packed_silu_pays(x, pw) -> bool:
    N, K = pw.shape
    c = _pq_gemv_config(x.shape[0], N, K, pw.qtype, x.device)
    return _recompute_ok(x.shape[0], N, K, c["BLOCK_N"])


def silu_mul_linear(x, weight, *, add_norm=None):
    """linear(silu_and_mul(x), weight): one GEMV kernel for dense weights and T <= 16 (decode),
    else the two ops as the registry picks them. add_norm: as linear's."""
    if _gemv_fusable(x, weight) and x.stride(1) == 1:
        return dense_gemv(x, weight, prologue=("silu_mul",), add_norm=add_norm)
    if (getattr(weight, "planes", None) is not None and x.stride(1) == 1 and x.shape[0] <= 16
            and x.dtype in (torch.float16, torch.float32) and _packed_silu_pays(x, weight)):
        return packed_matmul(x, weight, silu=True, add_norm=add_norm)  # its GEMV fuses it
    from .. import ops

    return ops.linear(ops.silu_and_mul(x), weight, add_norm=add_norm)


def gated_norm_linear(o, z, norm_weight, eps, weight, *, add_norm=None):
    """linear(gated_rms_norm(o, z, norm_weight, eps) as [T, H * D], weight) for o, z [T, H, D]:
    one GEMV kernel for dense weights, T <= 16 and a power-of-two D, else the two ops.
    add_norm: as linear's."""
    T, H, D = o.shape
    x = o.reshape(T, H * D)
    if (_gemv_fusable(x, weight) and x.stride(1) == 1 and z.stride(-1) == 1
            and D & (D - 1) == 0 and norm_weight.numel() == D):
        return dense_gemv(x, weight, prologue=("gated_norm", z, norm_weight, eps),
                          add_norm=add_norm)
    from .. import ops

    return ops.linear(ops.gated_rms_norm(o, z, norm_weight, eps).reshape(T, H * D), weight,
                      add_norm=add_norm)


def quant_matmul(x, qweight, **cfg):
    """x [T, K] @ dequant(qweight)^T -> [T, N] (GEMV for T <= 16, tiled GEMM above)."""
    T, K = x.shape
    N = qweight.shape[0]
    qt = QTYPES[qweight.qtype]
    data = qweight.data
    assert data.stride(1) == 1 and x.stride(1) == 1
    assert K % 256 == 0, "fused GGUF kernels need in_features % 256 == 0"
    out = empty((T, N), x.dtype, x.device)
    if T == 0:
        return out
    n_steps = K // 256
    if T == 1 and qweight.qtype != "Q4_0" and not cfg.get("UNROLL"):
        # H200 sweep (docs/PERF.md): 16 rows, 8 warps best for Q8_0 / Q4_K / Q5_K, close for Q6_K
        block_n = cfg.pop("BLOCK_N", 16)
        warps = cfg.pop("num_warps", 8)
        _qgemv_row_kernel[(triton.cdiv(N, block_n),)](
            x, data, out, N, data.stride(0), n_steps, QT=qt, STEP_B=STEP_BYTES[qweight.qtype],
            BLOCK_N=block_n, num_warps=warps)
        return out
    if T <= 16:
        bt = next_pow2(T)
        block_n = cfg.pop("BLOCK_N", max(1, min(4, 32 // bt)))
        unroll = cfg.pop("UNROLL", None)
        if unroll is None:
            want = max(1, QINFLIGHT_BYTES // max(1, N * STEP_BYTES[qweight.qtype]))
            unroll = 1
            while unroll * 2 <= min(want, 16) and n_steps % (unroll * 2) == 0:
                unroll *= 2
        assert n_steps % unroll == 0, "UNROLL must divide in_features / 256"
        warps = cfg.pop("num_warps", 4)
        P, Q = PART_SHAPE[qweight.qtype]
        _qgemv_kernel[(triton.cdiv(N, block_n),)](
            x, data, out, N, K, T, x.stride(0), data.stride(0), out.stride(0), n_steps,
            QT=qt, STEP_B=STEP_BYTES[qweight.qtype], BLOCK_N=block_n, BLOCK_T=bt, P=P, Q=Q,
            UNROLL=unroll, num_warps=warps)
        return out
    block_m = cfg.pop("BLOCK_M", 64 if x.device.type == "cuda" else 16)
    block_n = cfg.pop("BLOCK_N", 64 if x.device.type == "cuda" else 16)
    warps = cfg.pop("num_warps", 4)
    _qgemm_kernel[(triton.cdiv(T, block_m), triton.cdiv(N, block_n))](
        x, data, out, T, N, x.stride(0), data.stride(0), out.stride(0), n_steps,
        QT=qt, STEP_B=STEP_BYTES[qweight.qtype], BLOCK_M=block_m, BLOCK_N=block_n,
        FP32=x.dtype == torch.float32, num_warps=warps)
    return out


def linear(x, weight, *, add_norm=None, rms_of=None, **cfg):
    """add_norm, rms_of (residual_norm.py): inside the GEMV where linear_fuses_norm, else
    computed around the product as reference.py defines them."""
    dense = isinstance(weight, torch.Tensor)
    if dense and x.shape[0] <= 16:
        return dense_gemv(x, weight, add_norm=add_norm, rms_of=rms_of, **cfg)
    if getattr(weight, "planes", None) is not None:  # PackedQuant (repack.prepare)
        return packed_matmul(x, weight, add_norm=add_norm, rms_of=rms_of, **cfg)
    if add_norm is not None or rms_of is not None:
        return _around(linear, x, weight, add_norm, rms_of, **cfg)
    if dense:  # prefill: the vendor GEMM (rocBLAS / cuBLAS) is the right tool
        return x @ weight.t()
    return quant_matmul(x, weight, **cfg)


def linear_glu(x, weight, *, rms_of=None):
    """silu(x @ gate^T) * (x @ up^T) for weight = [gate; up]: in the epilogue of the packed
    GEMV at decode sizes (packed_matmul's glu), else the product then the silu-mul. rms_of:
    as linear's."""
    if getattr(weight, "planes", None) is not None:
        return packed_matmul(x, weight, glu=True, rms_of=rms_of)
    from .. import ops

    return ops.silu_and_mul(linear(x, weight, rms_of=rms_of))


# Packed types whose GEMVs take the split RMSNorm on CUDA: measured on the H200 with the
# norm's loads after the loop (9B Q4_K_M decode 436 -> 445 tok/s, docs/PERF.md E21). Q8_0
# measured 2% slower with it (E13, 1-warp GEMVs; not re-measured since) and ROCm is
# unmeasured (no gfx906 here): they keep the norm kernels.
SPLIT_NORM_QTYPES = ("Q4_K", "Q5_K", "Q6_K")


def linear_fuses_norm(x, weight) -> bool:
    """Whether linear(x, weight) takes add_norm / rms_of inside its GEMV: the dense GEMV
    (decode sizes), and on CUDA the packed GEMV of a SPLIT_NORM_QTYPES weight where one
    program sums a whole row (T <= 16 off the tensor-core path, one split of K)."""
    if getattr(weight, "planes", None) is not None:
        return (weight.qtype in SPLIT_NORM_QTYPES and not is_rocm()
                and _pq_whole_rows(x, weight))
    return (isinstance(weight, torch.Tensor) and 0 < x.shape[0] <= 16
            and weight.dtype == x.dtype and weight.stride(1) == 1)


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


def _around(fn, x, weight, add_norm, rms_of, **kw):
    """fn(x, weight) with add_norm / rms_of computed outside it (reference.py's definition):
    calls whose kernel cannot take them in."""
    from .reference import add_norm_out, rms_in

    return add_norm_out(fn(rms_in(x, rms_of), weight, **kw), add_norm)


# ----------------------------------------------------------------------------------------
# Kernels over repacked weights (g906/kernels/linear/repack.py: PackedQuant).
#
# A row is read as vectors of 4 int32 words (16 bytes) holding EV = 4 * E elements (E = 4
# for 8-bit quants, 8 for 4-bit); field j of word w is element 4j + w of the vector, so the
# activations that field j meets are 4 consecutive elements (one 8-byte load) and every tile
# keeps the words' layout ([H, T, BN, 4], H = threads): no layout shuffles, the sum over a vector is
# inside one thread. Each field becomes a float in [1, 2) by placing its bits under the
# exponent (f = 1 + q / 2^bits: a shift and an and/or, no int->float conversion); per
# vector, S = sum(f * x) and X = sum(x) give the exact dot product with the dequantized
# weights as A * S + B * X, A and B per (row, vector) from the scales (fp32, exact).
# ----------------------------------------------------------------------------------------

PQ_QTYPES = {"Q8_0": 0, "Q4_0": 1, "Q4_K": 2, "Q5_K": 3, "Q6_K": 4}
PQ_E = {"Q8_0": 4, "Q4_0": 8, "Q4_K": 8, "Q5_K": 8, "Q6_K": 8}      # elements per word


@triton.jit
def _pq_field(words, hi, J: tl.constexpr, QT: tl.constexpr, one, CVT: tl.constexpr = False):
    """Field J of every word (Q5_K/Q6_K: with its high bits) as a float in [1, 2).
    `one` = 0x3F800000 (1.0f): passed at run time on NVIDIA, where the mask and the exponent
    then fold into one LOP3 (two immediates would not); an immediate on gfx9 (ONE_IMM), where
    1.0f is an inline constant, so the literal mask and it fit v_and_or_b32's one constant-bus
    operand (a run-time `one` would be a second: an and and an or)."""
    if CVT and QT != 1 and QT != 2:   # a byte per field: the byte itself as a float (CVT)
        if QT != 0 and J % 2 == 1:    # Q5_K/Q6_K odd fields: in hi (_q5_bytes, _q6_bytes)
            c = hi
        else:
            c = words
        B: tl.constexpr = J if QT == 0 else J // 2
        return ((c >> (8 * B)) & 255).to(tl.float32)
    if QT == 0:  # int8: q + 128 (sign bit flipped) as 8 bits under the exponent
        m8 = one ^ (128 << 15)
        f = (((words >> (8 * J)) << 15) & (255 << 15)) ^ m8             # 1 + (q + 128) / 256
        return f.to(tl.float32, bitcast=True)
    if QT == 3:  # words/hi = _q5_bytes: 5 bits in byte J // 2 of one of them: 1 + q / 32
        if J % 2 == 0:
            c = words
        else:
            c = hi
        f = (((c >> (8 * (J // 2))) << 18) & (31 << 18)) | one
    elif QT == 4:  # words/hi = _q6_bytes: field J is byte J // 2 of one of them; 1 + q / 64
        if J % 2 == 0:
            c = words
        else:
            c = hi
        f = (((c >> (8 * (J // 2))) << 17) & (63 << 17)) | one
    else:  # 4 bits: 1 + q / 16
        f = (((words >> (4 * J)) << 19) & (15 << 19)) | one
    f = f.to(tl.float32, bitcast=True)
    return f


@triton.jit
def _nibble_pair(words, J: tl.constexpr, one):
    """4-bit fields J and J + 1 of every word as floats: one shift puts field J at bits 15-18
    and J + 1 at 19-22, then an and-or each: 1 + q / 256 and 1 + q / 16."""
    if J < 4:
        sw = words << (15 - 4 * J)
    else:
        sw = words >> (4 * J - 15)
    f0 = ((sw & (15 << 15)) | one).to(tl.float32, bitcast=True)
    f1 = ((sw & (15 << 19)) | one).to(tl.float32, bitcast=True)
    return f0, f1


@triton.jit
def _q5_bytes(words, hv, w3):
    """Q5_K: the 5-bit quants of the even / odd fields of each word, one per byte. `hv` is the
    vector's int32 of 5th bits (repack._q5_pos), broadcast over its 4 words."""
    g = tl.where(w3 == 3, hv >> 2, hv << (4 - 2 * tl.minimum(w3, 2)))
    even = (words & 0x0F0F0F0F) | (g & 0x10101010)
    odd = ((words >> 4) & 0x0F0F0F0F) | ((g >> 1) & 0x10101010)
    return even, odd


@triton.jit
def _q6_bytes(words, hi, w3):
    """Q6_K: the 6-bit quants of the even / odd fields of each word, one per byte (low nibble |
    2 high bits << 4), so a field then costs a shift and an and-or like Q8_0. `hi` is the
    int32 high word shared by words 2p and 2p+1 (repack._q6_pos: bits already in place; the
    odd word's sit 4 bits lower)."""
    g = hi << ((w3 % 2) * 4)
    even = (words & 0x0F0F0F0F) | (g & 0x30303030)
    odd = ((words >> 4) & 0x0F0F0F0F) | ((g >> 2) & 0x30303030)
    return even, odd


@triton.jit
def _split4(t):
    """A tensor whose last axis has 4 elements -> the 4 tensors without it (in registers)."""
    a, b = tl.split(tl.reshape(t, t.shape[:-1] + [2, 2]))
    t0, t2 = tl.split(a)
    t1, t3 = tl.split(b)
    return t0, t1, t2, t3


@triton.jit
def _small_int_f32(v):
    """An int in [0, 2^23) as fp32 through the exponent (an or and a subtract: int->float
    conversions run at a quarter of the FMA rate on NVIDIA)."""
    return (v | 0x4B000000).to(tl.float32, bitcast=True) - 8388608.0


@triton.jit
def _pq_scale_raw(a_ptr, b_ptr, n2, sa, sb, k0, v2, QT: tl.constexpr):
    """The scale planes' values for vector v2 of rows n2 as loaded ([H, BN] each): (ra, rb, ra1)
    for _pq_scale_values; ra1 is Q6_K's second half (others: ra again)."""
    if QT == 0:
        ra = tl.load(a_ptr + n2 * sa + (k0 // 32 + v2 // 2))
        return ra, ra, ra
    elif QT == 1:
        ra = tl.load(a_ptr + n2 * sa + (k0 // 32 + (v2 * 4) // 4))
        return ra, ra, ra
    elif QT == 2 or QT == 3:
        dm = tl.load(a_ptr + n2 * sa + (k0 + v2 * 32) // 256)
        # (v2 * 4) // 4: an index Triton does not see as contiguous along the vector axis, so
        # the load keeps the layout of the words instead of a vectorized one converted later
        scm = tl.load(b_ptr + n2 * sb + (k0 // 32 + (v2 * 4) // 4))
        return dm, scm, dm
    else:
        sc0 = tl.load(a_ptr + n2 * sa + (k0 // 16 + 2 * v2))
        sc1 = tl.load(a_ptr + n2 * sa + (k0 // 16 + 2 * v2 + 1))
        d = tl.load(b_ptr + n2 * sb + (k0 + v2 * 32) // 256)
        return sc0, d, sc1


@triton.jit
def _d_dmin(dm):
    """Q4_K / Q5_K: the int32 of a super-block's fp16 d (low half) and dmin (high) as fp32."""
    d = (dm & 0xFFFF).to(tl.int16).to(tl.float16, bitcast=True).to(tl.float32)
    dmin = ((dm >> 16) & 0xFFFF).to(tl.int16).to(tl.float16, bitcast=True).to(tl.float32)
    return d, dmin


@triton.jit
def _pq_scale_values(ra, rb, QT: tl.constexpr, CVT: tl.constexpr = False):
    """(A, B) fp32 [H, BN] from _pq_scale_raw's values: dot(w, x) over a vector (Q6_K: over the
    half whose scale ra is) = A * sum(f * x) + B * sum(x). CVT (Q8_0, Q5_K, Q6_K): f is the
    field's byte as an integer (Q8_0: q + 128), not 1 + q / 2^bits."""
    if QT == 0 and CVT:    # q = f - 128
        d = ra.to(tl.float32)
        A = d
        B = -128.0 * d
    elif QT == 0:    # q = 256 f - 384
        d = ra.to(tl.float32)
        A = 256.0 * d
        B = -384.0 * d
    elif QT == 1:  # q - 8 = 16 f - 24
        d = ra.to(tl.float32)
        A = 16.0 * d
        B = -24.0 * d
    elif QT == 2 or QT == 3:  # d*sc*q - dmin*m; Q4_K q = 16 f - 16, Q5_K q = 32 f - 32
        d, dmin = _d_dmin(ra)
        scm = rb.to(tl.int32)
        ds = d * _small_int_f32(scm & 255)
        m = _small_int_f32((scm >> 8) & 255)
        if QT == 2:
            A = 16.0 * ds
            B = -16.0 * ds - dmin * m
        elif CVT:             # Q5_K q = f
            A = ds
            B = -dmin * m
        else:
            A = 32.0 * ds
            B = -32.0 * ds - dmin * m
    else:          # Q6_K: q - 32 = 64 f - 96, one int8 scale per 16 elements
        sc = _small_int_f32(ra.to(tl.int32) + 128) - 128.0
        ds = rb.to(tl.float32) * sc
        if CVT:               # q - 32 = f - 32
            A = ds
            B = -32.0 * ds
        else:
            A = 64.0 * ds
            B = -96.0 * ds
    return A, B


@triton.jit
def _pq_scales(a_ptr, b_ptr, n2, sa, sb, k0, v2, QT: tl.constexpr, HALF: tl.constexpr):
    """(A, B) fp32 [BN, H] of vector v2 (Q6_K: of its half HALF, 16 elements)."""
    ra, rb, ra1 = _pq_scale_raw(a_ptr, b_ptr, n2, sa, sb, k0, v2, QT)
    if HALF == 1:
        ra = ra1
    return _pq_scale_values(ra, rb, QT)


@triton.jit
def _q4k_values(dm, scm, QT: tl.constexpr = 2):
    """Q4_K (DS, DM) fp32 [H, BN]: dot(w, x) over a vector = DS * (sum(f x) - sum(x)) -
    DM * sum(x) with f = 1 + q / 16: DS = 16 d sc, DM = dmin m. Q5_K (QT 3): DS = 32 d sc
    (f = 1 + q / 32)."""
    d, dmin = _d_dmin(dm)
    scm = scm.to(tl.int32)
    # 16 sc: under 2^27's exponent the mantissa's last bit is worth 16 (2^28: 32)
    if QT == 3:
        sc16 = ((scm & 255) | 0x4D800000).to(tl.float32, bitcast=True) - 268435456.0
    else:
        sc16 = ((scm & 255) | 0x4D000000).to(tl.float32, bitcast=True) - 134217728.0
    m = _small_int_f32((scm >> 8) & 255)
    return d * sc16, dmin * m


@triton.jit
def _pq_hi(qh_ptr, n3, sh, kw, v3, w3, words, QT: tl.constexpr, mask3=None):
    """Q5_K / Q6_K: the high-bit plane's int32 for each word of vectors v3 (others: words)."""
    hi = words
    if QT == 3 or QT == 4:
        if QT == 3:  # an int32 per vector, shared by its 4 words (index written so the load
            # is not seen as contiguous along H: it keeps the words' layout)
            hptr = qh_ptr + n3 * sh + (kw // 4 + (v3 * 4 + w3) // 4)
        else:        # an int32 per two quant words
            hptr = qh_ptr + n3 * sh + (kw // 2 + v3 * 2 + w3 // 2)
        if mask3 is None:
            hi = tl.load(hptr).to(tl.int32)
        else:
            hi = tl.load(hptr, mask=mask3, other=0).to(tl.int32)
    return hi


@triton.jit
def _pq_x16(x_ptr, p, xm, KX, SILU: tl.constexpr):
    """Activations for the packed GEMV in x's dtype; SILU: silu(x[k]) * x[KX + k]
    (_load_silu_mul)."""
    if SILU:
        return _load_silu_mul(x_ptr, p, xm, KX)
    return tl.load(p, mask=xm, other=0.0)


@triton.jit
def _pq_x(x_ptr, p, xm, KX, SILU: tl.constexpr):
    """_pq_x16 as fp32."""
    return _pq_x16(x_ptr, p, xm, KX, SILU).to(tl.float32)


@triton.jit
def _half2(v):
    """int32 -> its two halves as fp16 (low, high) on a new last axis of 2: the pair stays in
    the one 32-bit register, so fp16 math on it issues as packed (HFMA2, v_pk_fma_f16)."""
    return tl.join(v.to(tl.int16), (v >> 16).to(tl.int16)).to(tl.float16, bitcast=True)


@triton.jit
def _even_odd_rows(words, H: tl.constexpr, BLOCK_N: tl.constexpr):
    """Words [H, BN, 4] -> those of rows 2i and of rows 2i + 1, each [H, BN / 2, 4]."""
    return tl.split(tl.permute(tl.reshape(words, [H, BLOCK_N // 2, 2, 4]), [0, 1, 3, 2]))


@triton.jit
def _row_pair_words(words, H: tl.constexpr, BLOCK_N: tl.constexpr):
    """Words [H, BN, 4] of BN rows -> (lo, hi) [H, BN / 2, 4]: for rows 2i and 2i + 1, lo holds
    both rows' fields 0-3 (row 2i's in its low half) and hi their fields 4-7."""
    a, b = _even_odd_rows(words, H, BLOCK_N)
    lo = (a & 0xFFFF) | (b << 16)
    hi = ((a >> 16) & 0xFFFF) | (b & -65536)
    return lo, hi


@triton.jit
def _swap_row_halves(words, H: tl.constexpr, BLOCK_N: tl.constexpr):
    """Words [H, BN, 4] of row-paired Q4_K (repack.py, row_pairs) <-> the rows' own words:
    _row_pair_words, interleaved back into rows (it is its own inverse)."""
    lo, hi = _row_pair_words(words, H, BLOCK_N)
    return tl.reshape(tl.permute(tl.join(lo, hi), [0, 1, 3, 2]), [H, BLOCK_N, 4])


@triton.jit
def _row_pair_sums(ph, H: tl.constexpr, BLOCK_T: tl.constexpr, BLOCK_N: tl.constexpr):
    """fp16 products [H, BT, BN / 2, 4 words, 2 rows] -> each row's sum in fp32 [H, BT, BN]."""
    w0, w1, w2, w3 = _split4(tl.permute(ph, [0, 1, 2, 4, 3]))
    return tl.reshape(((w0 + w1) + (w2 + w3)).to(tl.float32), [H, BLOCK_T, BLOCK_N])


@triton.jit
def _centred_nibbles(pw, J: tl.constexpr, magic):
    """Field J of both halves of row-paired words (_row_pair_words) as fp16 pairs q / 16 - 0.5
    (exact): fields 0 and 1 sit at bits 0-3 and 4-7 of each half, 2 and 3 there after one shift
    of 8 (shared, CSE); an and-or puts 1024's exponent over them (magic = 0x64006400 at run
    time: one LOP3), giving 1024 + q or 1024 + 16 q, and one packed FMA scales and centres."""
    if J >= 2:
        pw = pw >> 8
    if J % 2 == 0:
        f = _half2((pw & 0x000F000F) | magic)
        return f * 0.0625 - 64.5
    f = _half2((pw & 0x00F000F0) | magic)
    return f * 0.00390625 - 4.5


@triton.jit
def _centred_fives(pb, B: tl.constexpr, magic):
    """Byte B (0 or 1) of both halves of row-paired Q5_K bytes (_q5_bytes, then
    _row_pair_words) as fp16 pairs q / 32 - 0.5 (exact): 1024 + q under the magic, one FMA."""
    if B == 1:
        pb = pb >> 8
    return _half2((pb & 0x001F001F) | magic) * 0.03125 - 32.5


@triton.jit
def _centred_sixes(pb, B: tl.constexpr, magic):
    """Byte B (0 or 1) of both halves of row-paired Q6_K bytes (_q6_bytes, then
    _row_pair_words) as fp16 pairs (q - 32) / 64 (exact, its zero point: no sum(x) term)."""
    if B == 1:
        pb = pb >> 8
    return _half2((pb & 0x003F003F) | magic) * 0.015625 - 16.5


@triton.jit
def _pq_fp16_field(lo, hi, odd_lo, odd_hi, F: tl.constexpr, QT: tl.constexpr, magic):
    """Field F (0-7) of rows 2i and 2i + 1 as a centred fp16 pair, from their regrouped
    words: Q4_K nibbles (lo: fields 0-3, hi: 4-7; _centred_nibbles), Q5_K / Q6_K bytes (lo /
    hi: the even fields 0, 2 / 4, 6, odd_lo / odd_hi: 1, 3 / 5, 7; _centred_fives,
    _centred_sixes)."""
    if QT == 2:
        if F < 4:
            return _centred_nibbles(lo, F, magic)
        return _centred_nibbles(hi, F - 4, magic)
    if F % 2 == 0:
        src = lo
        if F >= 4:
            src = hi
    else:
        src = odd_lo
        if F >= 4:
            src = odd_hi
    if QT == 4:
        return _centred_sixes(src, (F % 4) // 2, magic)
    return _centred_fives(src, (F % 4) // 2, magic)


@triton.jit
def _nibble_pair_fma(p, words, J: tl.constexpr, x0, x1, one):
    """p + fields J and J + 1 of every row's word(s) (_nibble_pair) times their activations
    (x0 meets f = 1 + q/256, hence 16 x0)."""
    f0, f1 = _nibble_pair(words, J, one)
    p += f0[:, None] * (x0 * 16.0)                 # separate statements: FMAs into p
    p += f1[:, None] * x1
    return p


@triton.jit
def _field_fma(p, words, hi, J: tl.constexpr, x, QT: tl.constexpr, one, CVT: tl.constexpr = False):
    """p + field J of every row's word(s) (_pq_field) times its activation."""
    return p + _pq_field(words, hi, J, QT, one, CVT)[:, None] * x


@triton.jit
def _split_field_fma(p, c0, c1, c2, c3, h0, h1, h2, h3, J: tl.constexpr, x0, x1, x2, x3,
                     QT: tl.constexpr, one, CVT: tl.constexpr):
    """_field_fma over the 4 split words of a vector and their activations."""
    p = _field_fma(p, c0, h0, J, x0, QT, one, CVT)
    p = _field_fma(p, c1, h1, J, x1, QT, one, CVT)
    p = _field_fma(p, c2, h2, J, x2, QT, one, CVT)
    return _field_fma(p, c3, h3, J, x3, QT, one, CVT)


@triton.jit
def _pq_vector_dot(acc, words, hi, ra, rb, ra1, x_ptr, xrow, k0, xoff, xm, KX, w3, one,
                   QT: tl.constexpr, E: tl.constexpr, H: tl.constexpr, BLOCK_T: tl.constexpr,
                   BLOCK_N: tl.constexpr, PAIRS: tl.constexpr, SILU: tl.constexpr,
                   WSPLIT: tl.constexpr, CVT: tl.constexpr, ROWPAIRED: tl.constexpr = False):
    """acc [H, BT, BN] + each thread's vector of every row (words [H, BN, 4], high bits,
    raw scales) dotted with its activations (_pq_gemv_kernel's loop body after the loads).
    ROWPAIRED: Q4_K words stored row-paired (repack.py): packed fp16 takes them as they are,
    the other paths swap them back into rows."""
    if ROWPAIRED and PAIRS != 3:
        words = _swap_row_halves(words, H, BLOCK_N)
    if QT == 0 and CVT:
        words = words ^ -2139062144         # 0x80808080: q + 128 in each byte, unsigned
    if QT == 3:
        words, hi = _q5_bytes(words, hi, w3)
    if QT == 4:
        words, hi = _q6_bytes(words, hi, w3)
    if (QT == 2 and PAIRS >= 2) or (QT == 3 and PAIRS == 3):
        DS, DM = _q4k_values(ra, rb, QT)
    else:
        A, B = _pq_scale_values(ra, rb, QT, CVT)
    if QT == 4:
        A1, B1 = _pq_scale_values(ra1, rb, QT, CVT)
    if PAIRS == 3:
        # fields in packed fp16 (Q4_K / Q5_K / Q6_K, below): two rows' words regrouped so one
        # int32 holds the same fields of both (_row_pair_words; Q5_K / Q6_K: their even
        # fields' byte words, and the odd ones' from hi; Q4_K off ROCm is stored so,
        # ROWPAIRED: sm_90 loop at 8 rows 767 -> 703 instructions, docs/PERF.md E28).
        # 0x64006400 (fp16 1024 in both halves) from the run-time `one` (0x3F800000): a
        # register, so each field's mask and it fit one LOP3 (two immediates would not)
        magic = one ^ 0x5B806400
        if ROWPAIRED:   # stored that way (repack.py): the loads are the pairs
            pair_lo, pair_hi = _even_odd_rows(words, H, BLOCK_N)
        else:
            pair_lo, pair_hi = _row_pair_words(words, H, BLOCK_N)
        odd_lo, odd_hi = pair_lo, pair_hi
        if QT != 2:
            odd_lo, odd_hi = _row_pair_words(hi, H, BLOCK_N)
    if QT == 4 and PAIRS == 3:
        # Q6_K as Q4_K / Q5_K below, centred at its zero point: (q - 32) / 64, exact, so no
        # sum(x) term; fields 0-3 and 4-7 of a vector have their own scales (A, A1): two sums
        p0 = tl.zeros([H, BLOCK_T, BLOCK_N // 2, 4, 2], tl.float16)
        p1 = tl.zeros([H, BLOCK_T, BLOCK_N // 2, 4, 2], tl.float16)
        for j in tl.static_range(4):
            xa = _pq_x16(x_ptr, xrow + k0 + xoff + 4 * j, xm, KX, SILU)
            xb = _pq_x16(x_ptr, xrow + k0 + xoff + 4 * (j + 4), xm, KX, SILU)
            fa = _pq_fp16_field(pair_lo, pair_hi, odd_lo, odd_hi, j, QT, magic)
            fb = _pq_fp16_field(pair_lo, pair_hi, odd_lo, odd_hi, j + 4, QT, magic)
            p0 += fa[:, None] * xa[:, :, :, :, None]
            p1 += fb[:, None] * xb[:, :, :, :, None]
            if j == 0:   # (the anchor below)
                x4 = tl.sum(xa.to(tl.float32), 3)
        # + 0 * x4 (4 activations' sum): a term in the activations' layout, which Triton then
        # gives the fp16 sums too; without one (Q6_K needs no sum(x)) it spreads them across
        # lanes and converts every product through shared memory (sm_90 4 rows: 7.1
        # instructions a weight against 5.7)
        acc += (A[:, None] * _row_pair_sums(p0, H, BLOCK_T, BLOCK_N)
                + A1[:, None] * _row_pair_sums(p1, H, BLOCK_T, BLOCK_N)) + x4 * 0.0
    elif (QT == 2 or QT == 3) and PAIRS == 3:
        # Q4_K / Q5_K on fp16 activations in packed fp16: each field of the regrouped words
        # an fp16 pair (row 2i, row 2i + 1) meeting one activation (the pair LLVM's
        # vectorizer forms: one register, no byte permutes): per 2 weights a LOP3, a centring
        # FMA and the product's HFMA2 (_pq_fp16_field; sm_90 loop at 8 rows: Q4_K 3.2
        # instructions a weight against 3.8 with fp32 fields, Q5_K 4.4 against 5.1). Centred
        # (|f| <= 0.5, 8 products a lane) the fp16 sums stay near fp16 rounding (relative
        # error 2.5-7e-4 in the tests; Q4_K's uncentred 1 + q / 16 summed to 1.4-2.7e-3);
        # each row's sum goes to fp32 once a vector
        ph = tl.zeros([H, BLOCK_T, BLOCK_N // 2, 4, 2], tl.float16)
        X = tl.zeros([H, BLOCK_T, 1], tl.float32)
        for j in tl.static_range(4):
            # two fields a step: Q4_K's j and 4 + j (lo's and hi's), Q5_K's 2j and 2j + 1
            Fa = j if QT == 2 else 2 * j
            Fb = j + 4 if QT == 2 else 2 * j + 1
            xa = _pq_x16(x_ptr, xrow + k0 + xoff + 4 * Fa, xm, KX, SILU)      # 4F + w
            xb = _pq_x16(x_ptr, xrow + k0 + xoff + 4 * Fb, xm, KX, SILU)
            X += tl.sum(xa.to(tl.float32), 3) + tl.sum(xb.to(tl.float32), 3)
            fa = _pq_fp16_field(pair_lo, pair_hi, odd_lo, odd_hi, Fa, QT, magic)
            fb = _pq_fp16_field(pair_lo, pair_hi, odd_lo, odd_hi, Fb, QT, magic)
            ph += fa[:, None] * xa[:, :, :, :, None]
            ph += fb[:, None] * xb[:, :, :, :, None]
        # sum(q / 2^b x) = ps + X / 2; DS = 2^b d sc (b = 4, 5)
        acc += DS[:, None] * (_row_pair_sums(ph, H, BLOCK_T, BLOCK_N) + 0.5 * X)
        acc -= DM[:, None] * X
    elif QT == 2 and PAIRS == 2:
        # Q4_K, fields two at a time as below, with the scales folded: the f = 1 parts of
        # the sums (16 x for even fields, x for odd: M) and sum(x) (X) are per thread, shared
        # by all rows, so each row's vector costs a subtract and two FMAs (_q4k_values).
        # The 4 words of the vector and their activations are separate tensors (as WSPLIT)
        ws0, ws1, ws2, ws3 = _split4(words)
        X = tl.zeros([H, BLOCK_T, 1], tl.float32)
        M = tl.zeros([H, BLOCK_T, 1], tl.float32)
        p = tl.zeros([H, BLOCK_T, BLOCK_N], tl.float32)
        for j in tl.static_range(0, E, 2):
            e0, e1, e2, e3 = _split4(_pq_x(x_ptr, xrow + k0 + xoff + 4 * j, xm, KX, SILU))
            o0, o1, o2, o3 = _split4(_pq_x(x_ptr, xrow + k0 + xoff + 4 * j + 4, xm, KX, SILU))
            se = (e0 + e1) + (e2 + e3)
            so4 = (o0 + o1) + (o2 + o3)
            X += se + so4
            M += se * 16.0 + so4
            p = _nibble_pair_fma(p, ws0, j, e0, o0, one)
            p = _nibble_pair_fma(p, ws1, j, e1, o1, one)
            p = _nibble_pair_fma(p, ws2, j, e2, o2, one)
            p = _nibble_pair_fma(p, ws3, j, e3, o3, one)
        acc += DS[:, None] * (p - M) - DM[:, None] * X
    elif WSPLIT or QT == 4:
        # the 4 words of each vector (and their activations) as separate tensors: one
        # accumulator per row and vector instead of one per word (fewer registers, no
        # word reduction); Q6_K's fields 0-3 and 4-7 have their own scales (p, q)
        c0, c1, c2, c3 = _split4(words)
        h0, h1, h2, h3 = _split4(hi)
        p = tl.zeros([H, BLOCK_T, BLOCK_N], tl.float32)
        q = tl.zeros([H, BLOCK_T, BLOCK_N], tl.float32)   # Q6_K: fields 4-7
        X = tl.zeros([H, BLOCK_T, 1], tl.float32)
        X1 = tl.zeros([H, BLOCK_T, 1], tl.float32)
        for j in tl.static_range(E):
            x0, x1, x2, x3 = _split4(_pq_x(x_ptr, xrow + k0 + xoff + 4 * j, xm, KX, SILU))
            sj = (x0 + x1) + (x2 + x3)
            if QT == 4 and j >= 4:
                X1 += sj
                q = _split_field_fma(q, c0, c1, c2, c3, h0, h1, h2, h3, j, x0, x1, x2, x3, QT, one, CVT)
            else:
                X += sj
                p = _split_field_fma(p, c0, c1, c2, c3, h0, h1, h2, h3, j, x0, x1, x2, x3, QT, one, CVT)
        acc += A[:, None] * p + B[:, None] * X
        if QT == 4:
            acc += A1[:, None] * q + B1[:, None] * X1
    else:
        p = tl.zeros([H, BLOCK_T, BLOCK_N, 4], tl.float32)
        xs = tl.zeros([H, BLOCK_T, 1, 4], tl.float32)
        if (QT == 1 or QT == 2) and PAIRS:
            # 4-bit fields two at a time: one shift puts field j at bits 15-18 and j + 1 at
            # 19-22, each then needs only an and-or (half the shifts): f_j = 1 + q/256 meets
            # 16 x (exact), so f x = x + q x / 16 + 15 x for even j; the 15 x terms (xe, per
            # thread, shared by all rows) are taken off each row's sum below
            xe = tl.zeros([H, BLOCK_T, 1, 4], tl.float32)
            for j in tl.static_range(0, E, 2):
                x0 = _pq_x(x_ptr, xrow + k0 + xoff + 4 * j, xm, KX, SILU)
                x1 = _pq_x(x_ptr, xrow + k0 + xoff + 4 * j + 4, xm, KX, SILU)
                p = _nibble_pair_fma(p, words, j, x0, x1, one)
                xs += x0
                xs += x1
                xe += x0
            p -= 15.0 * xe
        else:
            for j in tl.static_range(E):
                xj = _pq_x(x_ptr, xrow + k0 + xoff + 4 * j, xm, KX, SILU)
                p = _field_fma(p, words, hi, j, xj, QT, one, CVT)
                xs += xj
        acc += A[:, None] * tl.sum(p, axis=3) + B[:, None] * tl.sum(xs, axis=3)
    return acc


@triton.jit
def _pq_step_loads(qs_ptr, qh_ptr, a_ptr, b_ptr, n3, n2, v3, w3, v2, sq, sh, sa, sb, kw, kwend,
                   tm, QT: tl.constexpr, E: tl.constexpr, EVEN: tl.constexpr):
    """One iteration's weight planes at word kw of every row (words [H, BN, 4], high bits,
    raw scales) and the activations' mask: vectors past kwend (not EVEN) load as zeros."""
    if EVEN:
        words = tl.load(qs_ptr + n3 * sq + (kw + v3 * 4 + w3))     # [H, BN, 4] int32
        hi = _pq_hi(qh_ptr, n3, sh, kw, v3, w3, words, QT)
        xm = tm
        vs = v2
    else:
        vm3 = (kw + v3 * 4) < kwend
        words = tl.load(qs_ptr + n3 * sq + (kw + v3 * 4 + w3), mask=vm3, other=0)
        hi = _pq_hi(qh_ptr, n3, sh, kw, v3, w3, words, QT, vm3)
        xm = tm & vm3[:, None]
        vs = tl.where(kw + v2 * 4 < kwend, v2, 0)  # masked vectors' terms are 0 anyway
    ra, rb, ra1 = _pq_scale_raw(a_ptr, b_ptr, n2, sa, sb, kw * E, vs, QT)
    return words, hi, ra, rb, ra1, xm


@triton.jit
def _glu_row(j, ROWPAIRED: tl.constexpr):
    """The output row (from the program's first) of a GLU GEMV's weight row j: rows go gate,
    up of one output row, or (ROWPAIRED: the stored pairs stay pairs) gate, gate, up, up of
    two."""
    if ROWPAIRED:
        return j // 4 * 2 + j % 2
    return j // 2


@triton.jit
def _glu_up(j, ROWPAIRED: tl.constexpr):
    """1 where a GLU GEMV's weight row j is an up row (_glu_row)."""
    if ROWPAIRED:
        return (j // 2) % 2
    return j % 2


@triton.jit
def _pq_gemv_kernel(x_ptr, qs_ptr, qh_ptr, a_ptr, b_ptr, out_ptr, N, T, KW, sx,
                    sq: tl.constexpr, sh: tl.constexpr, sa: tl.constexpr, sb: tl.constexpr,
                    so, so_split, kw_len, one, r_ptr, sr, hn_ptr, anw_ptr, ss_out_ptr, ss_in_ptr,
                    P_in, eps_in,
                    QT: tl.constexpr, E: tl.constexpr, H: tl.constexpr,
                    BLOCK_N: tl.constexpr, BLOCK_T: tl.constexpr, EVEN: tl.constexpr,
                    PREFETCH: tl.constexpr = False, PAIRS: tl.constexpr = 1,
                    SILU: tl.constexpr = False, PDL: tl.constexpr = False,
                    WSPLIT: tl.constexpr = False, ONE_IMM: tl.constexpr = False,
                    CVT: tl.constexpr = False, TOKEN_BLOCKS: tl.constexpr = False,
                    PRELOAD: tl.constexpr = False, GLU: tl.constexpr = False,
                    ADD_NORM: tl.constexpr = 0, RMS_IN: tl.constexpr = False,
                    BLOCK_P: tl.constexpr = 1, EVEN_N: tl.constexpr = False,
                    ROWPAIRED: tl.constexpr = False):
    """The packed GEMV: rows block program_id(0), split-K part program_id(1)
    (_pq_gemv_program)."""
    _pq_gemv_program(tl.program_id(0), tl.program_id(1), x_ptr, qs_ptr, qh_ptr, a_ptr, b_ptr,
                     out_ptr, N, T, KW, sx, sq, sh, sa, sb, so, so_split, kw_len, one,
                     r_ptr, sr, hn_ptr, anw_ptr, ss_out_ptr, ss_in_ptr, P_in, eps_in, QT, E, H,
                     BLOCK_N, BLOCK_T, EVEN, PREFETCH, PAIRS, SILU, PDL, WSPLIT, ONE_IMM, CVT,
                     TOKEN_BLOCKS, PRELOAD, GLU, ADD_NORM, RMS_IN, BLOCK_P, EVEN_N, ROWPAIRED)


@triton.jit
def _pq_gemv_pair_kernel(x_ptr, out_ptr, T, sx, so, one, progs, ss_in_ptr, P_in, eps_in,
                         qs_ptr, qh_ptr, a_ptr, b_ptr, N, KW, sq: tl.constexpr,
                         sh: tl.constexpr, sa: tl.constexpr, sb: tl.constexpr,
                         qs2_ptr, qh2_ptr, a2_ptr, b2_ptr, N2, KW2, sq2: tl.constexpr,
                         sh2: tl.constexpr, sa2: tl.constexpr, sb2: tl.constexpr,
                         QT: tl.constexpr, E: tl.constexpr, BLOCK_N: tl.constexpr,
                         EVEN: tl.constexpr, PREFETCH: tl.constexpr, PAIRS: tl.constexpr,
                         WSPLIT: tl.constexpr, PRELOAD: tl.constexpr,
                         QT2: tl.constexpr, E2: tl.constexpr, BLOCK_N2: tl.constexpr,
                         EVEN2: tl.constexpr, PREFETCH2: tl.constexpr, PAIRS2: tl.constexpr,
                         WSPLIT2: tl.constexpr, PRELOAD2: tl.constexpr,
                         H: tl.constexpr, BLOCK_T: tl.constexpr, PDL: tl.constexpr = False,
                         ONE_IMM: tl.constexpr = False, CVT: tl.constexpr = False,
                         TOKEN_BLOCKS: tl.constexpr = False, RMS_IN: tl.constexpr = False,
                         BLOCK_P: tl.constexpr = 1, EVEN_N: tl.constexpr = False,
                         EVEN_N2: tl.constexpr = False, ROWPAIRED: tl.constexpr = False,
                         ROWPAIRED2: tl.constexpr = False):
    """Two packed GEMVs of one input in one launch: programs [0, progs)
    compute the first weight's N rows into out[:, :N], the others the second's N2 rows into
    out[:, N:], each with its own type and rows per program (one split of K each; linear_pair).
    RMS_IN: x is an hn (residual_norm.py), both scale their sums by its 1 / rms."""
    pid = tl.program_id(0)
    if pid < progs:
        _pq_gemv_program(pid, 0, x_ptr, qs_ptr, qh_ptr, a_ptr, b_ptr, out_ptr, N, T, KW, sx,
                         sq, sh, sa, sb, so, 0, KW, one, x_ptr, 0, x_ptr, x_ptr, x_ptr, ss_in_ptr,
                         P_in, eps_in, QT, E, H, BLOCK_N, BLOCK_T, EVEN, PREFETCH, PAIRS, False,
                         PDL, WSPLIT, ONE_IMM, CVT, TOKEN_BLOCKS, PRELOAD, False, 0, RMS_IN,
                         BLOCK_P, EVEN_N, ROWPAIRED)
    else:
        _pq_gemv_program(pid - progs, 0, x_ptr, qs2_ptr, qh2_ptr, a2_ptr, b2_ptr, out_ptr + N,
                         N2, T, KW2, sx, sq2, sh2, sa2, sb2, so, 0, KW2, one, x_ptr, 0, x_ptr,
                         x_ptr, x_ptr, ss_in_ptr, P_in, eps_in, QT2, E2, H, BLOCK_N2, BLOCK_T,
                         EVEN2, PREFETCH2, PAIRS2, False, PDL, WSPLIT2, ONE_IMM, CVT,
                         TOKEN_BLOCKS, PRELOAD2, False, 0, RMS_IN, BLOCK_P, EVEN_N2, ROWPAIRED2)


@triton.jit
def _pq_gemv_program(pid_n, pid_k, x_ptr, qs_ptr, qh_ptr, a_ptr, b_ptr, out_ptr, N, T, KW, sx,
                     sq, sh, sa, sb, so, so_split, kw_len, one, r_ptr, sr, hn_ptr, anw_ptr,
                     ss_out_ptr, ss_in_ptr, P_in, eps_in,
                     QT: tl.constexpr, E: tl.constexpr, H: tl.constexpr,
                     BLOCK_N: tl.constexpr, BLOCK_T: tl.constexpr, EVEN: tl.constexpr,
                     PREFETCH: tl.constexpr, PAIRS: tl.constexpr, SILU: tl.constexpr,
                     PDL: tl.constexpr, WSPLIT: tl.constexpr, ONE_IMM: tl.constexpr,
                     CVT: tl.constexpr, TOKEN_BLOCKS: tl.constexpr, PRELOAD: tl.constexpr,
                     GLU: tl.constexpr, ADD_NORM: tl.constexpr, RMS_IN: tl.constexpr,
                     BLOCK_P: tl.constexpr, EVEN_N: tl.constexpr,
                     ROWPAIRED: tl.constexpr = False):
    """out[t, n] (or split-K partial pid_k) = x[t] . w[n] over words [pid_k * kw_len, +kw_len),
    for the BLOCK_T tokens of block program_id(2) (TOKEN_BLOCKS: there are several).
    GLU (one split): w is [gate; up], N rows, and out[t, r] = silu(x . w[r]) * (x . w[r + N/2])
    for r < N/2: a program's rows are BLOCK_N / 2 such pairs, interleaved gate, up (ROWPAIRED:
    two gate rows then their up rows, _glu_row).
    ROWPAIRED: Q4_K's words stored as row pairs (repack.py): the fp16 fields (PAIRS = 3) take
    them as loaded, the other paths swap them back (_pq_vector_dot); BLOCK_N is even (GLU: a
    multiple of 4; packed_matmul) so that programs hold whole pairs.
    ADD_NORM / RMS_IN (one split): the RMSNorm split over two GEMVs (residual_norm.py): out is
    h = y + residual, with hn and the program's partial sums of h * h (ADD_NORM; 2: the weight
    zero-centred), or x is such an hn and each token's sums are scaled by 1 / rms from its P_in
    partial sums (RMS_IN, before GLU's silu).

    H = threads per program. Tiles are [H, BLOCK_T, BLOCK_N, 4] with the vector axis first,
    so Triton puts every thread on it and keeps tokens, rows and the 4 words of a vector in
    registers: the activations a thread loads and converts serve all its rows, words and
    activations share one layout, and nothing crosses threads until after the loop.
    PREFETCH: the next iteration's words, high bits and scales are loaded before this one is
    decoded (EVEN only; ptxas places those loads late in the body, so it pays only in some
    configs: _pq_cuda_decode). PAIRS: 4-bit fields two per shift (1), and for Q4_K with the
    scales folded (2), or Q4_K / Q5_K / Q6_K in packed fp16 with rows in pairs (3: fp16 x,
    BLOCK_N even; _pq_pairs); 0: one at a time.
    WSPLIT (always for Q6_K and Q4_K's PAIRS = 2): the 4 words of each vector and their
    activations are split into separate tensors, so each row keeps one accumulator per vector
    instead of one per word: no reduction over the words, and fewer registers (sm_90: Q4_K 8
    rows 128 -> 96, Q6_K 4 rows 128 -> 72), which pays for Q5_K/Q6_K; Q8_0 is as fast without.
    SILU: x rows hold [gate | up] (K apart), the GEMV runs on silu(gate) * up (_pq_x).
    ONE_IMM: 1.0f's bits as an immediate instead of the run-time `one` (gfx9: _pq_field).
    CVT: Q8_0 / Q5_K / Q6_K fields converted from their bytes (v_cvt_f32_ubyteN on gfx9, full
    rate there; a quarter-rate I2F on NVIDIA), one instruction per field.
    Under PREFETCH or PRELOAD (set with PDL) the first iteration's weight planes are loaded
    before the PDL wait (they are constants: their stream starts while the kernel before
    finishes); PRELOAD peels that iteration, for programs too short for PREFETCH (it loads
    each iteration's successor, the last its own again; _pq_loop_flags).
    The planes' row strides (sq, sh, sa, sb) are compile-time constants and, where the rows
    fill every program (EVEN_N), each row's offset from the program's first row is too: every
    load of a plane then takes one base address and an immediate per row (sm_90: Q4_K's loop
    813 -> 771 instructions, no per-row address arithmetic; the 9B Q4_K_M decode 475.5 ->
    492 tok/s, docs/PERF.md E27). Partial row blocks clamp their rows (read row 0) instead."""
    KX = KW * E
    EV: tl.constexpr = 4 * E
    if ONE_IMM:
        one = 0x3F800000
    if GLU:
        jj = tl.arange(0, BLOCK_N)
        nr = pid_n * (BLOCK_N // 2) + _glu_row(jj, ROWPAIRED)   # each weight row's output row
        nn = nr + _glu_up(jj, ROWPAIRED) * (N // 2)
        nmask = nr < N // 2
    else:
        nn = pid_n * BLOCK_N + tl.arange(0, BLOCK_N)
        nmask = nn < N
    # rows relative to the program's first (64-bit offsets, the strides constexpr: each row's
    # address is one base plus an immediate, no per-row address arithmetic in the loop)
    row0 = (pid_n * (BLOCK_N // 2 if GLU else BLOCK_N)).to(tl.int64)
    qs_ptr += row0 * sq
    qh_ptr += row0 * sh
    a_ptr += row0 * sa
    b_ptr += row0 * sb
    if EVEN_N:   # (written as constants: nn - row0 would not fold)
        jr = tl.arange(0, BLOCK_N)
        if GLU:
            nc = (_glu_row(jr, ROWPAIRED) + _glu_up(jr, ROWPAIRED) * (N // 2)).to(tl.int64)
        else:
            nc = jr.to(tl.int64)
    else:
        nc = tl.where(nmask, nn, 0).to(tl.int64) - row0   # clamp: rows past N read row 0
    v = tl.arange(0, H)
    v3 = v[:, None, None]                             # [H, 1, 1]
    n3 = nc[None, :, None]                            # [1, BN, 1]
    w3 = tl.arange(0, 4)[None, None, :]               # [1, 1, 4]
    v2 = v[:, None]                                   # [H, 1]
    n2 = nc[None, :]                                  # [1, BN]
    if TOKEN_BLOCKS:   # (a compile-time switch: the offset would cost the pointers' alignment)
        t0 = tl.program_id(2) * BLOCK_T               # this program's first token
        x_ptr += t0 * sx
        out_ptr += t0 * so
        T -= t0
        if ADD_NORM:
            r_ptr += t0 * sr
            hn_ptr += t0 * so
            ss_out_ptr += t0 * tl.num_programs(0)
        if RMS_IN:
            ss_in_ptr += t0 * P_in
    tt = tl.arange(0, BLOCK_T)
    t4 = tt[None, :, None, None]                      # [1, BT, 1, 1]
    xoff = v3[:, None] * EV + w3[:, None]             # [H, 1, 1, 4]: field 0 of each word
    xrow = x_ptr + t4.to(tl.int64) * sx
    tm = t4 < T
    acc = tl.zeros([H, BLOCK_T, BLOCK_N], tl.float32)
    kwbeg = pid_k * kw_len
    kwend = tl.minimum(kwbeg + kw_len, KW)
    if PREFETCH:  # the first iteration's loads; each iteration then issues the next one's
        wn = tl.load(qs_ptr + n3 * sq + (kwbeg + v3 * 4 + w3))
        hn = _pq_hi(qh_ptr, n3, sh, kwbeg, v3, w3, wn, QT)
        an, bn, an1 = _pq_scale_raw(a_ptr, b_ptr, n2, sa, sb, kwbeg * E, v2, QT)
    elif PRELOAD:  # the first iteration's planes, before the PDL wait (they are constants)
        w0, h0, a0, b0, a10, xm0 = _pq_step_loads(qs_ptr, qh_ptr, a_ptr, b_ptr, n3, n2, v3, w3,
                                                  v2, sq, sh, sa, sb, kwbeg, kwend, tm, QT, E,
                                                  EVEN)
    pdl_start(PDL)
    first = kwbeg
    if PRELOAD and not PREFETCH:
        acc = _pq_vector_dot(acc, w0, h0, a0, b0, a10, x_ptr, xrow, kwbeg * E, xoff, xm0, KX, w3,
                             one, QT, E, H, BLOCK_T, BLOCK_N, PAIRS, SILU, WSPLIT, CVT, ROWPAIRED)
        first = kwbeg + H * 4
    for kw in range(first, kwend, H * 4):      # vector 0 of every iteration is in the row
        k0 = kw * E
        if PREFETCH:
            words, hi, ra, rb, ra1 = wn, hn, an, bn, an1
            # the last iteration loads its own vectors again (cached) instead of masking
            nxt = tl.where(kw + H * 4 < kwend, kw + H * 4, kw)
            wn = tl.load(qs_ptr + n3 * sq + (nxt + v3 * 4 + w3))
            hn = _pq_hi(qh_ptr, n3, sh, nxt, v3, w3, wn, QT)
            an, bn, an1 = _pq_scale_raw(a_ptr, b_ptr, n2, sa, sb, nxt * E, v2, QT)
            xm = tm
        else:
            words, hi, ra, rb, ra1, xm = _pq_step_loads(qs_ptr, qh_ptr, a_ptr, b_ptr, n3, n2, v3,
                                                        w3, v2, sq, sh, sa, sb, kw, kwend, tm,
                                                        QT, E, EVEN)
        acc = _pq_vector_dot(acc, words, hi, ra, rb, ra1, x_ptr, xrow, k0, xoff, xm, KX, w3, one,
                             QT, E, H, BLOCK_T, BLOCK_N, PAIRS, SILU, WSPLIT, CVT, ROWPAIRED)
    res = tl.sum(acc, axis=0)                                               # [BT, BN]
    # the norm's operands after the loop, unlike the dense GEMV: held through it they took
    # registers (sm_90: Q4_K GLU 96 -> 128, Q5_K 123 -> 152), and the H200 measured the 9B
    # Q4_K_M decode at 441 tok/s with them before the loop, 445 after
    if RMS_IN:
        parts = rms_partials(ss_in_ptr, P_in, tt, T, BLOCK_T, BLOCK_P)
        res = res * rms_scale(parts, KX, eps_in)[:, None]
    if GLU:   # the sums of the gate and the up row side by side: silu(gate) * up, in fp32
        if ROWPAIRED:   # gate rows r, r + 1, then their up rows
            res = tl.reshape(tl.permute(tl.reshape(res, [BLOCK_T, BLOCK_N // 4, 2, 2]),
                                        [0, 1, 3, 2]), [BLOCK_T, BLOCK_N // 2, 2])
        g, u = tl.split(tl.reshape(res, [BLOCK_T, BLOCK_N // 2, 2]))
        res = g * tl.sigmoid(g) * u
        nn = pid_n * (BLOCK_N // 2) + tl.arange(0, BLOCK_N // 2)
        nmask = nn < N // 2
    if ADD_NORM:
        r_an, w_an = add_norm_load(tt, nn, T, N, r_ptr, sr, anw_ptr, ADD_NORM == 2)
        add_norm_store(res, r_an, w_an, tt, nn, T, N, out_ptr, hn_ptr, so, ss_out_ptr)
    else:
        optr = out_ptr + pid_k * so_split + tt[:, None] * so + nn[None, :]
        tl.store(optr, res.to(out_ptr.dtype.element_ty), mask=(tt[:, None] < T) & nmask[None, :])


@triton.jit(do_not_specialize=["M"])
def _pq_gemm_kernel(x_ptr, qs_ptr, qh_ptr, a_ptr, b_ptr, out_ptr, M, N, KW, sx, sq, sh, sa, sb,
                    so, so_split, kw_len, one, QT: tl.constexpr, E: tl.constexpr,
                    H: tl.constexpr, BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr,
                    FP32: tl.constexpr, ROWPAIRED: tl.constexpr = False):
    """Prefill (and decode T = 2..16 on CUDA, BLOCK_M = 16): per field j, the [BN, 4H] weights
    (w = A f + B) times the matching [BM, 4H] activations with tl.dot (the K terms may come
    in any order). Program (m, n, k) covers words [k * kw_len, +kw_len) (split K)."""
    EV: tl.constexpr = 4 * E
    pm = tl.program_id(0)
    pn = tl.program_id(1)
    pk = tl.program_id(2)
    mm = pm * BLOCK_M + tl.arange(0, BLOCK_M)
    nn = pn * BLOCK_N + tl.arange(0, BLOCK_N)
    mmask = mm < M
    nmask = nn < N
    nc = tl.where(nmask, nn, 0).to(tl.int64)
    n3 = nc[:, None, None]
    n2 = nc[:, None]
    v = tl.arange(0, H)
    v3 = v[None, :, None]
    v2 = v[None, :]
    w3 = tl.arange(0, 4)[None, None, :]
    xoff = tl.reshape(v3 * EV + w3, (1, 4 * H))
    xrow = x_ptr + mm.to(tl.int64)[:, None] * sx
    acc = tl.zeros([BLOCK_M, BLOCK_N], tl.float32)
    kwbeg = pk * kw_len
    kwend = tl.minimum(kwbeg + kw_len, KW)
    for kw in range(kwbeg, kwend, H * 4):
        k0 = kw * E
        vm3 = (kw + v3 * 4) < kwend
        words = tl.load(qs_ptr + n3 * sq + (kw + v3 * 4 + w3), mask=vm3, other=0)
        if ROWPAIRED:   # [BN, H, 4]: rows first here
            words = tl.permute(_swap_row_halves(tl.permute(words, [1, 0, 2]), H, BLOCK_N),
                               [1, 0, 2])
        if QT == 3:
            hi = tl.load(qh_ptr + n3 * sh + (kw // 4 + (v3 * 4 + w3) // 4), mask=vm3, other=0)
        elif QT == 4:
            hi = tl.load(qh_ptr + n3 * sh + (kw // 2 + v3 * 2 + w3 // 2), mask=vm3, other=0)
        else:
            hi = words
        if QT == 3:
            words, hi = _q5_bytes(words, hi, w3)
        if QT == 4:
            words, hi = _q6_bytes(words, hi, w3)
        vs = tl.where(kw + v2 * 4 < kwend, v2, 0)
        A, B = _pq_scales(a_ptr, b_ptr, n2, sa, sb, k0, vs, QT, 0)
        if QT == 4:
            A1, B1 = _pq_scales(a_ptr, b_ptr, n2, sa, sb, k0, vs, QT, 1)
        else:
            A1, B1 = A, B
        xm = mmask[:, None] & tl.reshape(tl.broadcast_to(vm3, (1, H, 4)), (1, 4 * H))
        for j in tl.static_range(E):
            f = _pq_field(words, hi, j, QT, one)
            if j < 4 or QT != 4:
                w = f * A[:, :, None] + B[:, :, None]
            else:
                w = f * A1[:, :, None] + B1[:, :, None]
            w2 = tl.reshape(w, (BLOCK_N, 4 * H))
            xt = tl.load(xrow + k0 + xoff + 4 * j, mask=xm, other=0.0)
            if FP32:
                acc += tl.dot(xt, tl.trans(w2), input_precision="ieee")
            else:
                acc += tl.dot(xt, tl.trans(w2.to(xt.dtype)))
    optr = out_ptr + pk * so_split + mm.to(tl.int64)[:, None] * so + nn[None, :]
    tl.store(optr, acc.to(out_ptr.dtype.element_ty), mask=mmask[:, None] & nmask[None, :])


@triton.jit
def _pq_dequant_kernel(qs_ptr, qh_ptr, a_ptr, b_ptr, out_ptr, N, KW, sq, sh, sa, sb, so, one,
                       QT: tl.constexpr, E: tl.constexpr, H: tl.constexpr, BLOCK_N: tl.constexpr,
                       FIELD_MAJOR: tl.constexpr, ROWPAIRED: tl.constexpr = False):
    """The dense weights of rows [BLOCK_N] over H vectors: element 4j + w of a vector is field j
    of its word w, worth A * f + B (the GEMV's A * sum(f x) + B * sum(x), per x).
    FIELD_MAJOR: column j * KW + (word index) instead of the natural one, so that each field's
    store is contiguous across threads (the matmul then reads x in that column order)."""
    EV: tl.constexpr = 4 * E
    nn = tl.program_id(0) * BLOCK_N + tl.arange(0, BLOCK_N)
    nmask = nn < N
    nc = tl.where(nmask, nn, 0).to(tl.int64)
    v = tl.arange(0, H)
    v3 = v[:, None, None]                             # [H, 1, 1]
    n3 = nc[None, :, None]                            # [1, BN, 1]
    w3 = tl.arange(0, 4)[None, None, :]               # [1, 1, 4]
    kw = tl.program_id(1) * H * 4
    vm3 = (kw + v3 * 4) < KW
    words = tl.load(qs_ptr + n3 * sq + (kw + v3 * 4 + w3), mask=vm3, other=0)
    if ROWPAIRED:
        words = _swap_row_halves(words, H, BLOCK_N)
    if QT == 3:
        hi = tl.load(qh_ptr + n3 * sh + (kw // 4 + (v3 * 4 + w3) // 4), mask=vm3, other=0).to(tl.int32)
        words, hi = _q5_bytes(words, hi, w3)
    elif QT == 4:
        hi = tl.load(qh_ptr + n3 * sh + (kw // 2 + v3 * 2 + w3 // 2), mask=vm3, other=0).to(tl.int32)
        words, hi = _q6_bytes(words, hi, w3)
    else:
        hi = words
    v2 = tl.where(kw + v[:, None] * 4 < KW, v[:, None], 0)
    n2 = nc[None, :]
    A0, B0 = _pq_scales(a_ptr, b_ptr, n2, sa, sb, kw * E, v2, QT, 0)      # [H, BN]
    A1, B1 = A0, B0
    if QT == 4:
        A1, B1 = _pq_scales(a_ptr, b_ptr, n2, sa, sb, kw * E, v2, QT, 1)
    if FIELD_MAJOR:
        optr = out_ptr + n3 * so + (kw + v3 * 4 + w3)
        jstep = KW
    else:
        optr = out_ptr + n3 * so + (kw * E + v3 * EV + w3)
        jstep = 4
    m = vm3 & nmask[None, :, None]
    for j in tl.static_range(E):
        f = _pq_field(words, hi, j, QT, one)
        if j < 4:
            w = A0[:, :, None] * f + B0[:, :, None]
        else:
            w = A1[:, :, None] * f + B1[:, :, None]
        tl.store(optr + j * jstep, w.to(out_ptr.dtype.element_ty), mask=m)


def packed_to_dense(pw, dtype=torch.float16, rows: tuple[int, int] | None = None, *,
                    field_major: bool = False):
    """The dense [rows, K] weights of a PackedQuant (all rows, or rows r0:r1); field_major:
    columns in field_major_order (the layout the prefill matmul uses)."""
    r0, r1 = rows if rows is not None else (0, pw.shape[0])
    K = pw.shape[1]
    qt = pw.qtype
    QT, E = PQ_QTYPES[qt], PQ_E[qt]
    qs, qh, a, b = _pq_args(pw)
    out = torch.empty((r1 - r0, K), dtype=dtype, device=qs.device)
    if r1 <= r0:
        return out
    # row r0 of every plane: plane views start there (planes are [N, ...] row-major)
    qs, qh, a, b = (t[r0:] for t in (qs, qh, a, b))
    assert not (pw.row_pairs and r0 % 2), "row-paired weights start at even rows"
    H, BN = 32, 4
    KW = K // E
    _pq_dequant_kernel[(triton.cdiv(r1 - r0, BN), triton.cdiv(KW, 4 * H))](
        qs, qh, a, b, out, r1 - r0, KW, qs.stride(0), qh.stride(0), a.stride(0), b.stride(0),
        out.stride(0), 0x3F800000, QT=QT, E=E, H=H, BLOCK_N=BN, FIELD_MAJOR=field_major,
        ROWPAIRED=pw.row_pairs, num_warps=4)
    return out


@functools.lru_cache(maxsize=64)
def field_major_order(K: int, E: int, device) -> torch.Tensor:
    """Column c = j * KW + u of the field-major layout holds element (u // 4) * 4E + 4j + u % 4
    (word u, field j) of the natural one: x[:, order] meets packed_to_dense(field_major=True)."""
    KW = K // E
    u = torch.arange(KW)
    j = torch.arange(E)
    nat = (u // 4 * 4 * E + u % 4)[None, :] + 4 * j[:, None]
    return nat.reshape(-1).to(device)


DEQUANT_CHUNK = 1 << 27          # weights dequantized at a time for a prefill matmul (256 MB fp16):
                                 # every 9B/27B matrix but the LM head (never a prefill GEMM) in one block
DEQUANT_ROWS = 256               # row blocks are multiples of this


def _pq_dequant_matmul(x, pw, out):
    """Prefill: the weights dequantized to fp16 a row block at a time (field-major columns, so
    the dequant's stores coalesce; x is gathered into the same order once), then the vendor
    GEMM (cuBLAS / rocBLAS), written transposed so that each row block lands contiguously:
    far faster than a tiled dequant-GEMM in Triton, and the fp16 copy is transient."""
    N, K = pw.shape
    T = x.shape[0]
    step = max(DEQUANT_ROWS, (DEQUANT_CHUNK // K) // DEQUANT_ROWS * DEQUANT_ROWS)
    xw = x.index_select(1, field_major_order(K, PQ_E[pw.qtype], x.device)).to(torch.float16)
    if N <= step:
        w = packed_to_dense(pw, field_major=True)
        if out.dtype == torch.float16:
            torch.mm(xw, w.t(), out=out)
        else:
            out.copy_(torch.mm(xw, w.t()))
        return out
    out_t = torch.empty((N, T), dtype=torch.float16, device=x.device)
    for r0 in range(0, N, step):
        r1 = min(N, r0 + step)
        w = packed_to_dense(pw, torch.float16, (r0, r1), field_major=True)
        torch.mm(w, xw.t(), out=out_t[r0:r1])
    out.copy_(out_t.t())
    return out


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
        # Q4_K's 8 rows take 134 VGPRs at 2 warps against 126 at 1 or 4 (gfx908 code): one
        # wave per SIMD instead of two
        warps = 1 if qtype == "Q4_K" and fit == 2 else fit
    elif rocm:
        # at most 4 tokens a program, more token blocks beyond: from 8 tokens on the gfx908 code
        # uses AGPRs (spills on a gfx906, which has none) and at 16 scratch; 2 tokens x 4 rows
        # or 4 x 2 take 88-133 VGPRs and ~3 VALU instructions per weight and token
        # (docs/PERF.md "gfx9 code")
        block_n = 4 if bt == 2 else 2
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
    """Whether a packed GEMV loads its first iteration before the PDL wait (PRELOAD, decode
    graphs on sm_90): H200, kernel run 11, Q4_K gate/up 62.2 -> 69.0% of the copy rate,
    4096 x 4096 34 -> 47%, Q6_K and Q8_0 8192 x 4096 48 -> 60% and 66 -> 77%. Q5_K at 4 rows
    lost 1-4 points (fp32 fields, 123 -> 128 registers); at 8 rows (packed fp16, 167
    registers either way) its 8192-row qkv gained: the 9B Q4_K_M decode 452.3 -> 463.8 tok/s
    (E25). Loading a second iteration too lost everywhere (E25)."""
    return qtype != "Q5_K" or block_n >= 8


def _pq_rocm_decode(qtype):
    """(rows, PAIRS, WSPLIT) of a T = 1 GEMV on ROCm. Not measured on a gfx906: chosen from the
    compiled gfx908 code (benchmarks/sass.py --target gfx908, docs/PERF.md "gfx9 code"), the
    nearest target upstream Triton 3.5 compiles, with gfx906's wave64 VALU and 256 VGPRs.
    A gfx906 issues 64 lanes x 60 CUs per clock, about 6.6e12 lane-instructions/s against 1 TB/s,
    so a 4.5-bit Q4_K weight may cost at most ~3.7 VALU instructions before issue, not memory,
    bounds the GEMV (Q5_K ~4.5, Q6_K ~5.4, Q8_0 ~7). Per weight, with ONE_IMM:
    - Q4_K: 8 rows, scales folded, words split: 3.61 (4 rows unsplit: 4.35), 126 VGPRs;
    - Q4_0: 8 rows, words split: 3.66 (4 rows: 3.98), 124 VGPRs;
    - Q5_K: 4 rows, split, CVT: 4.28 (2 rows without CVT: 6.09), 94 VGPRs;
    - Q6_K: 4 rows, CVT: 4.47 (2 rows without: 6.34), 104 VGPRs;
    - Q8_0: 4 rows, split, CVT: 3.59 (unsplit without: 5.14), 55 VGPRs instead of 97.
    All stay at or under 128 VGPRs: two waves per SIMD, each keeping rows x 16 bytes per lane in
    flight."""
    if qtype == "Q4_K":
        return 8, 2, True
    if qtype == "Q4_0":
        return 8, 1, True
    return 4, 1, True


def _pq_cuda_decode(qtype, N, K, sms):
    """(rows, warps, PREFETCH, PAIRS, WSPLIT) of a T = 1 GEMV on CUDA, from H200 sweeps on the
    9B's shapes (docs/PERF.md, kernel runs 9 and 10; within 2% of the best on each; run 11 for
    the Q4_K rows swept under PDL, as the decode graphs launch them):
    - Q4_K / Q4_0: 8 rows; 2 warps from N = 8192 (gate/up 24576: 21.8 us against 24.5 at 1
      warp), 4 below 8192 and at N = 12288 (under PDL 11.7 us against 15.4 with the 1 warp and
      PREFETCH swept without it); Q4_K folds its scales and splits its words (PAIRS = 2), but
      not in the down projections (N < 8192, K >= 12288: under PDL 11.1 us against 12.7),
      whose 3 iterations a program take PREFETCH (E29: 4096 x 12288 10.1 -> 9.2 us, 66 -> 73%
      of the copy rate; the 9B Q4_K_M decode 505.2 -> 508.5 tok/s);
    - Q5_K: from N = 8192 8 rows, 2 warps, split words (fp16 activations: in packed fp16,
      PAIRS = 3; the 9B Q4_K_M decode with its 8192-row qkv 452.6 -> 461.3 tok/s against the
      4 rows and 1 warp of fp32 fields, 460.3 at 8 rows and 1 warp, 452.8 at 4 warps; E24);
      below, 4 rows, 1 warp, fp32 fields (8192: 11.2 us against 12.2 at 8 rows unsplit):
      the output projections that take the split norm's epilogue are there, under its
      128-register cap (8 rows need 168 in packed fp16, 255 with fp32 fields);
    - Q6_K: 4 rows, split words from N = 2048 (4096 x 12288 18.3 us against 18.9, 12288 x 4096
      17.8 against 19.0); 2 warps with PREFETCH, 4 warps at N <= 1024 (4.3 us, where the
      unsplit kernel took 4.0; it is gone). The LM head (N >= 16384), the down projections
      (K >= 12288) and N = 12288-16383 take 8 rows (2, 4 and 1 warps, the last with
      PREFETCH) for their fields in packed fp16 (_pq_pairs; E25: the 9B Q4_K_M decode 462.8
      -> 477.1 tok/s against 4 rows of fp32 fields at 1 and 4 warps, 8 x 2 for the downs
      442.3; alone under PDL 4096 x 12288 72.0% of the copy rate, 12288 x 4096 69.6% against
      63.1%; not at 8192 x 4096, 51.6% against 60.5%, nor 4096 x 4096); with fp32 fields (fp32
      activations, the SwiGLU epilogue) they run 4 rows (_pq_rows; the downs' fp32 fields at 8
      rows x 2 warps, 168 registers: 427 tok/s against 463);
    - Q8_0: 4 rows, unsplit; from N = 16384 2 warps with PREFETCH (24576: 28.5 us against
      30.3), else warps so that the grid holds about 24 warps per SM (N = 12288: 1, N = 4096:
      4, with PREFETCH).
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
    return 4, warps, warps == 4, 1, False    # PREFETCH: N = 4096 x 12288, 16.1 against 16.9


def packed_matmul(x, pw, *, silu=False, glu=False, add_norm=None, rms_of=None, **cfg):
    """x [T, K] @ dequant(pw)^T -> [T, N] for a PackedQuant pw (GEMV for T <= 16).
    silu: x is [T, 2K] = [gate | up] and the product is with silu(gate) * up (applied on load
    by the GEMV; other paths run the silu-mul first).
    glu: pw is [gate; up] (N = 2I rows) and the result [T, I] is silu(x @ gate^T) * (x @ up^T),
    computed by the GEMV's epilogue (one split of K), else by a silu-mul after the product.
    add_norm, rms_of: as linear's, inside the GEMV (one split of K), else around the product."""
    T = x.shape[0]
    K = pw.shape[1]
    N = pw.shape[0]
    assert x.stride(1) == 1 and x.shape[1] == (2 * K if silu else K) and K % 256 == 0
    assert not (glu and add_norm is not None)
    qt = pw.qtype
    QT, E = PQ_QTYPES[qt], PQ_E[qt]
    dot = cfg.pop("DOT", None)
    if dot is None:
        dot = _pq_takes_dot(x)
    gemv = 0 < T <= 16 and not dot
    if gemv:
        c = _pq_gemv_config(T, N, K, qt, x.device)
        c.update(cfg)
        c["PAIRS"] = _pq_pairs(x, qt, c, "PAIRS" in cfg, glu)
        c["BLOCK_N"] = _pq_rows(qt, c, "BLOCK_N" in cfg)
        if pw.row_pairs:   # whole stored pairs a program; GLU: a gate pair and its up pair
            unit = 4 if glu else 2
            c["BLOCK_N"] = triton.cdiv(c["BLOCK_N"], unit) * unit
        BN, warps, split = c["BLOCK_N"], c["num_warps"], c["SPLIT"]
        H = c.get("H") or warp_size(x.device) * warps
        KW = K // E
        kw_len, split = _pq_splits(KW, split)
        # the silu of GLU, the residual add and the 1 / rms need whole sums; GLU pairs rows
        whole = glu or add_norm is not None or rms_of is not None
        # (row-paired GLU: an odd number of gate rows would put a pair across gate and up)
        gemv = (not (glu and (BN % 2 or (pw.row_pairs and (N // 2) % 2)))
                and (split == 1 or not whole))
    if not gemv and (add_norm is not None or rms_of is not None):
        return _around(functools.partial(packed_matmul, silu=silu, glu=glu, DOT=dot), x, pw,
                       add_norm, rms_of, **cfg)
    out = empty((T, N // 2 if glu else N), x.dtype, x.device)
    if T == 0:
        return out
    if not gemv and (silu or glu):   # the silu-mul as its own op, before or after
        from .. import ops

        if silu:
            return packed_matmul(ops.silu_and_mul(x), pw, DOT=dot, **cfg)
        return ops.silu_and_mul(packed_matmul(x, pw, DOT=dot, **cfg))
    if gemv:
        x, rms_of = _rms_in_registers(x, rms_of)
        qs, qh, a, b = _pq_args(pw)
        bt = c["BLOCK_T"]
        pdl = pdl_args(x.device)
        # the peeled first iteration pays only before a PDL wait (cfg may force it: tests)
        preload = cfg["PRELOAD"] if "PRELOAD" in cfg else c["PRELOAD"] and bool(pdl)
        even, prefetch, preload = _pq_loop_flags(KW, kw_len, H, c.get("PREFETCH"), preload, qt)
        if split == 1:
            dst, so_split = out, 0
        else:
            dst = torch.empty((split, T, N), dtype=torch.float32, device=x.device)
            so_split = T * N
        hn, r, sr, anw, ss_out, zc = _add_norm_args(add_norm, out, triton.cdiv(N, BN))
        ss_in, p_in, eps_in = _rms_of_args(rms_of, x)
        _pq_gemv_kernel[(triton.cdiv(N, BN), split, triton.cdiv(T, bt))](
            x, qs, qh, a, b, dst, N, T, KW, x.stride(0), qs.stride(0), qh.stride(0),
            a.stride(0), b.stride(0), dst.stride(-2), so_split, kw_len, 0x3F800000,
            r, sr, hn, anw, ss_out, ss_in, p_in, eps_in,
            QT=QT, E=E, H=H, BLOCK_N=BN, BLOCK_T=bt, EVEN=even, PREFETCH=prefetch,
            PAIRS=c["PAIRS"], SILU=silu, WSPLIT=c["WSPLIT"], ONE_IMM=c["ONE_IMM"], CVT=c["CVT"],
            TOKEN_BLOCKS=T > bt, num_warps=warps, PRELOAD=preload, GLU=glu, ADD_NORM=zc,
            RMS_IN=rms_of is not None, BLOCK_P=next_pow2(p_in), **pdl,
            EVEN_N=_whole_row_blocks(N, BN, glu), ROWPAIRED=pw.row_pairs,
            **_launch_regs(x.device, zc, glu, QT, c["PAIRS"], preload))
        if split > 1:
            torch.sum(dst, 0, out=out) if out.dtype == torch.float32 else out.copy_(dst.sum(0))
        return (out, hn, ss_out) if add_norm is not None else out
    if T > 16 and x.device.type == "cuda" and x.dtype != torch.float32 and not cfg:
        return _pq_dequant_matmul(x, pw, out)
    return _pq_gemm(x, pw, out, **cfg)


def _pq_pairs(x, qtype, c, forced: bool, glu: bool = False) -> int:
    """The PAIRS a packed GEMV runs with: its config's, or 3 (fields in packed fp16) for Q4_K,
    Q5_K and Q6_K decode with fp16 activations off ROCm, one token a program and rows in pairs.
    H200 (docs/PERF.md E23; graph-replayed, weights from HBM): 24576x4096 with the SwiGLU 21.9
    -> 19.1 us, 12288x4096 13.8 -> 11.3, 4096x12288 13.1 -> 11.7, 4096x4096 6.5 -> 6.1; the 9B
    Q4_K_M decode 449 -> 453 tok/s, and 452.6 -> 461.3 with its Q5_K qkv too (E24). Q4_K not
    in linear_pair's launch (449 -> 445 there; its Q5_K segment yes), nor on ROCm (gfx908
    code: 3.44 VALU a weight against 3.61 but 138 VGPRs against 126; unmeasured on a gfx906).
    At 2 or 4 rows the row regrouping compiles to byte permutes (sm_90: Q4_K 4 rows 4.3
    instructions a weight, Q5_K 5.6), so the default asks for 8 or more. Q6_K (E25): its LM
    head and down projections at 8 rows, 4.46 instructions a weight against 5.85 (4 rows of
    fp32 fields), the 9B Q4_K_M decode 462.8 -> 477.1 tok/s; not under the SwiGLU epilogue
    (glu), where its symmetric quants' fp16 rounding shows through silu(g) * u (relative error
    up to 6e-3 against 3-9e-4 plain). A PAIRS of 3 asked for where it does not apply (fp32 x,
    odd BLOCK_N, Q6_K's glu) runs the fp32 fields (Q4_K 2, the others 1)."""
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
    - Q4_K's SwiGLU epilogue in packed fp16 (the gate/up GEMV): 96. With the compile-time row
      offsets ptxas takes 128 (sm_90, 8 rows x 2 warps: eight programs per SM instead of ten);
      at 96 no spills, 817 loop instructions against 786, and the 9B Q4_K_M decode 491.6 /
      492.8 -> 502.2 / 501.8 tok/s (H200, docs/PERF.md E27).
    - ADD_NORM: 128. ptxas gives the epilogue's kernel 168 (sm_90, Q4_K 8 rows folded scales:
      96 without it; Q6_K 4 rows: 128), three 4-warp programs per SM where four or five fit
      (the 4096-row projections then take two waves); at 128 neither spills. Not where 128
      would spill: Q4_K / Q4_0's unfolded scales (PAIRS < 2), already at 168 without the
      epilogue (at 128: 8-84 bytes), and Q6_K's packed fp16 without PRELOAD (152-212 bytes,
      some in the loop; with PRELOAD, as the decode graphs launch it on sm_90, 128 and none)."""
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


# The fewest whole iterations a program needs for PREFETCH (H200: with 2, Q8_0 4096x4096 lost
# 3% and Q4_K's gate/up 79 -> 73%; with 3, Q4_K 4096x12288 gained 66 -> 73%, docs/PERF.md
# E29; 3 is unmeasured for the other types, which keep 4).
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
    per program differ by type; unmeasured on a gfx906, so they run one launch each)."""
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


def linear_pair(x, w0, w1, *, rms_of=None):
    """(linear(x, w0), linear(x, w1)): two packed weights of different types read by one launch
    (_pq_gemv_pair_kernel) where _pq_pair_configs allows (the outputs are then views of one
    [T, N0 + N1] tensor), else one linear each. A GGUF mix's projections of one input (Q4_K_M's
    linear attention: the Q5_K qkv and the Q4_K z / b / a) then cost one GEMV's start and tail.
    rms_of: as linear's (x an hn; both GEMVs apply its 1 / rms)."""
    pws = (w0, w1)
    cs = _pq_pair_configs(x, pws)
    if cs is None:
        return linear(x, w0, rms_of=rms_of), linear(x, w1, rms_of=rms_of)
    x, rms_of = _rms_in_registers(x, rms_of)
    ss_in, p_in, eps_in = _rms_of_args(rms_of, x)
    T, K = x.shape
    (a, b), (ca, cb) = pws, cs
    out = empty((T, a.shape[0] + b.shape[0]), x.dtype, x.device)
    progs = triton.cdiv(a.shape[0], ca["BLOCK_N"])
    bt = ca["BLOCK_T"]
    grid = (progs + triton.cdiv(b.shape[0], cb["BLOCK_N"]), 1, triton.cdiv(T, bt))

    def seg(w, c, suffix):
        qs, qh, pa, pb = _pq_args(w)
        args = [qs, qh, pa, pb, w.shape[0], K // PQ_E[w.qtype], qs.stride(0), qh.stride(0),
                pa.stride(0), pb.stride(0)]
        const = {k + suffix: v for k, v in dict(
            QT=PQ_QTYPES[w.qtype], E=PQ_E[w.qtype], BLOCK_N=c["BLOCK_N"], EVEN=c["EVEN"],
            PREFETCH=c["PREFETCH"], PAIRS=c["PAIRS"], WSPLIT=c["WSPLIT"],
            PRELOAD=c["PRELOAD"], EVEN_N=_whole_row_blocks(w.shape[0], c["BLOCK_N"]),
            ROWPAIRED=w.row_pairs).items()}
        return args, const

    args_a, const_a = seg(a, ca, "")
    args_b, const_b = seg(b, cb, "2")
    _pq_gemv_pair_kernel[grid](
        x, out, T, x.stride(0), out.stride(0), 0x3F800000, progs, ss_in, p_in, eps_in,
        *args_a, *args_b, H=warp_size(x.device) * ca["num_warps"], BLOCK_T=bt,
        ONE_IMM=ca["ONE_IMM"], CVT=ca["CVT"], TOKEN_BLOCKS=T > bt, num_warps=ca["num_warps"],
        RMS_IN=rms_of is not None, BLOCK_P=next_pow2(p_in), **const_a, **const_b,
        **pdl_args(x.device))
    return out[:, :a.shape[0]], out[:, a.shape[0]:]


def _pq_gemm(x, pw, out, **cfg):
    """Tiled tl.dot path: prefill (T > 16), and T = 2..16 fp16 on CUDA (tensor cores; the
    broadcast GEMV costs T FMAs per weight). Split K when the tiles do not fill the GPU."""
    T, K = x.shape
    N = pw.shape[0]
    qt = pw.qtype
    QT, E = PQ_QTYPES[qt], PQ_E[qt]
    qs, qh, a, b = _pq_args(pw)
    cuda = x.device.type == "cuda"
    small = T <= 16
    if small:
        # sm_90 register use with BLOCK_N=64: Q8_0 H=16 4 warps 145 regs (128 B of weights per
        # thread and iteration), Q4 H=16 8 warps 102, Q5_K/Q6_K H=8 4 warps 133: enough bytes
        # in flight per SM with 2-3 programs resident
        d_h, d_w = {"Q8_0": (16, 4), "Q5_K": (8, 4), "Q6_K": (8, 4)}.get(qt, (16, 8))
        d_m, d_n = 16, 64
    else:
        d_h, d_w = (8 if E == 4 else 4), 4
        d_m, d_n = (64, 64) if cuda else (16, 16)
    block_m = cfg.pop("BLOCK_M", d_m)
    block_n = cfg.pop("BLOCK_N", d_n)
    H = cfg.pop("H", d_h)
    warps = cfg.pop("num_warps", d_w)
    split = cfg.pop("SPLIT", None)
    assert not (pw.row_pairs and block_n % 2), "row-paired weights take whole pairs"
    KW = K // E
    progs = triton.cdiv(T, block_m) * triton.cdiv(N, block_n)
    if split is None:
        split = 1
        while progs * split * 2 <= 4 * num_sms(x.device) and KW // (split * 2) >= 8 * H:
            split *= 2
    step = 4 * H
    kw_len = triton.cdiv(triton.cdiv(KW, split), step) * step
    split = triton.cdiv(KW, kw_len)
    if split == 1:
        dst, so_split = out, 0
    else:
        dst = torch.empty((split, T, N), dtype=torch.float32, device=x.device)
        so_split = T * N
    _pq_gemm_kernel[(triton.cdiv(T, block_m), triton.cdiv(N, block_n), split)](
        x, qs, qh, a, b, dst, T, N, KW, x.stride(0), qs.stride(0), qh.stride(0), a.stride(0),
        b.stride(0), dst.stride(-2), so_split, kw_len, 0x3F800000, QT=QT, E=E, H=H,
        BLOCK_M=block_m, BLOCK_N=block_n, FP32=x.dtype == torch.float32,
        ROWPAIRED=pw.row_pairs, num_warps=warps)
    if split > 1:
        torch.sum(dst, 0, out=out) if out.dtype == torch.float32 else out.copy_(dst.sum(0))
    return out
