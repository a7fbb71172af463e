"""Dequant-GEMV (T <= 16) and dequant-GEMM (prefill) straight from raw GGUF blocks.

Each step of the K loop decodes 256 weight elements per row (gguf_decode.py); the GEMV
multiplies the tiles with activations gathered in their order, the GEMM flattens them to
[BLOCK_N, 128] and uses tl.dot. On a GPU weights are normally repacked at load (repack.py,
packed.py); these kernels serve those left as GGUF blocks.
"""

from __future__ import annotations

import torch
import triton
import triton.language as tl

from .._triton_util import empty, next_pow2
from .gguf_decode import PART_SHAPE, QTYPES, STEP_BYTES, _dequant_step


QINFLIGHT_BYTES = 8 << 20


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
    """T == 1: reduce each step's products to [BLOCK_N] at once (faster than the 4-D
    accumulator for the K-quants and Q8_0 at one row)."""
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
        # 16 rows, 8 warps: the fastest for Q8_0 / Q4_K / Q5_K, close to it for Q6_K
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
