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
"""

from __future__ import annotations

import torch
import triton
import triton.language as tl

from .._triton_util import is_rocm, next_pow2, empty

QTYPES = {"Q8_0": 0, "Q4_0": 1, "Q4_K": 2, "Q5_K": 3, "Q6_K": 4}
# bytes of one 256-element step for each type
STEP_BYTES = {"Q8_0": 8 * 34, "Q4_0": 8 * 18, "Q4_K": 144, "Q5_K": 176, "Q6_K": 210}
# shape [P, Q] of the two register tiles one step decodes into (P * Q = 128)
PART_SHAPE = {"Q8_0": (4, 32), "Q4_0": (8, 16), "Q4_K": (4, 32), "Q5_K": (4, 32), "Q6_K": (8, 16)}
# weight bytes to keep in flight over the whole device per K step (H200-measured: ~3-6 MB)
INFLIGHT_BYTES = 3 << 20
QINFLIGHT_BYTES = 8 << 20


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


@triton.jit
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
def _gemv_kernel(x_ptr, w_ptr, out_ptr, N, K, T, sx_t, sw_n, so_t,
                 BLOCK_N: tl.constexpr, BLOCK_K: tl.constexpr, BLOCK_T: tl.constexpr,
                 USE_DOT: tl.constexpr, EVEN_K: tl.constexpr):
    pid = tl.program_id(0)
    nn = pid * BLOCK_N + tl.arange(0, BLOCK_N)
    nmask = nn < N
    nc = tl.where(nmask, nn, 0).to(tl.int64)
    tt = tl.arange(0, BLOCK_T)
    tmask = tt < T
    kk = tl.arange(0, BLOCK_K)
    wrow = w_ptr + nc[:, None] * sw_n
    xrow = x_ptr + tt[:, None] * sx_t
    if USE_DOT:
        acc = tl.zeros([BLOCK_T, BLOCK_N], tl.float32)
    else:
        acc3 = tl.zeros([BLOCK_T, BLOCK_N, BLOCK_K], tl.float32)
    for k0 in range(0, K, BLOCK_K):
        ks = k0 + kk
        if EVEN_K:
            w = tl.load(wrow + ks[None, :])
            x = tl.load(xrow + ks[None, :], mask=tmask[:, None], other=0.0)
        else:
            w = tl.load(wrow + ks[None, :], mask=(ks < K)[None, :], other=0.0)
            x = tl.load(xrow + ks[None, :], mask=tmask[:, None] & (ks < K)[None, :], other=0.0)
        if USE_DOT:
            acc += tl.dot(x, tl.trans(w.to(x.dtype)))
        else:
            acc3 += x.to(tl.float32)[:, None, :] * w.to(tl.float32)[None, :, :]
    if not USE_DOT:
        acc = tl.sum(acc3, axis=2)
    tl.store(out_ptr + tt[:, None] * so_t + nn[None, :], acc.to(out_ptr.dtype.element_ty),
             mask=tmask[:, None] & nmask[None, :])


def _gemv_config(T, N, K, device, dtype):
    bt = next_pow2(T)
    use_dot = (device.type == "cuda" and not is_rocm() and bt > 4 and dtype == torch.float16)
    if use_dot:  # H200: 91% of copy bandwidth at 12288x4096, T=8 (docs/PERF.md)
        return dict(BLOCK_T=max(16, bt), BLOCK_N=32, BLOCK_K=128, USE_DOT=True, num_warps=4)
    if bt == 1:
        # keep about INFLIGHT_BYTES of weights in flight: N * BLOCK_K * elem bytes per K step
        esize = 2 if dtype == torch.float16 else 4
        block_k = next_pow2(max(1, INFLIGHT_BYTES // (N * esize)))
        block_k = max(min(256, next_pow2(K)), min(2048, block_k, next_pow2(K)))
    else:
        block_k = 128 if bt <= 2 else 64
    # broadcast path: BLOCK_T * BLOCK_N * BLOCK_K fp32 partial sums in registers
    block_n = max(1, min(16, 4096 // (bt * block_k)))
    return dict(BLOCK_T=bt, BLOCK_N=block_n, BLOCK_K=block_k, USE_DOT=False, num_warps=4)


def dense_gemv(x, weight, **cfg):
    T, K = x.shape
    N = weight.shape[0]
    assert weight.stride(1) == 1 and x.stride(1) == 1
    out = empty((T, N), x.dtype, x.device)
    if T == 0:
        return out
    c = _gemv_config(T, N, K, x.device, x.dtype)
    c.update(cfg)
    warps = c.pop("num_warps")
    _gemv_kernel[(triton.cdiv(N, c["BLOCK_N"]),)](
        x, weight, out, N, K, T, x.stride(0), weight.stride(0), out.stride(0),
        EVEN_K=K % c["BLOCK_K"] == 0, num_warps=warps, **c)
    return out


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


def linear(x, weight, **cfg):
    if isinstance(weight, torch.Tensor):
        if x.shape[0] > 16:  # prefill: the vendor GEMM (rocBLAS / cuBLAS) is the right tool
            return x @ weight.t()
        return dense_gemv(x, weight, **cfg)
    return quant_matmul(x, weight, **cfg)
