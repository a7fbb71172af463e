"""Triton kernels for RMSNorm (+ fused residual add) and gated RMSNorm. fp32 math."""

from __future__ import annotations

import triton
import triton.language as tl

from .._triton_util import next_pow2, row_warps, empty
from ..pdl import pdl_args, pdl_start


@triton.jit
def _rms_norm_kernel(x_ptr, r_ptr, w_ptr, out_ptr, res_out_ptr, H, stride_x, stride_r,
                     stride_o, stride_ro, eps, HAS_RES: tl.constexpr, ZERO_CENTRED: tl.constexpr,
                     BLOCK: tl.constexpr, PDL: tl.constexpr = False):
    pdl_start(PDL)
    row = tl.program_id(0).to(tl.int64)
    cols = tl.arange(0, BLOCK)
    mask = cols < H
    # the weight first: loaded after the reduction it would be a second memory round trip in
    # the compiled code
    w = tl.load(w_ptr + cols, mask=mask, other=0.0).to(tl.float32)
    x = tl.load(x_ptr + row * stride_x + cols, mask=mask, other=0.0).to(tl.float32)
    if HAS_RES:
        r = tl.load(r_ptr + row * stride_r + cols, mask=mask, other=0.0).to(tl.float32)
        h = (x + r).to(res_out_ptr.dtype.element_ty)
        tl.store(res_out_ptr + row * stride_ro + cols, h, mask=mask)
        x = h.to(tl.float32)
    var = tl.sum(x * x, axis=0) / H
    rstd = 1.0 / tl.sqrt(var + eps)
    if ZERO_CENTRED:
        w = w + 1.0
    tl.store(out_ptr + row * stride_o + cols, (x * rstd * w).to(out_ptr.dtype.element_ty), mask=mask)


def rms_norm(x, weight, eps, *, residual=None, zero_centred=False):
    shape = x.shape
    x2 = x.reshape(-1, shape[-1])
    if x2.stride(-1) != 1:
        x2 = x2.contiguous()
    T, H = x2.shape
    out = empty((T, H), x.dtype, x.device)
    if residual is not None:
        r2 = residual.reshape(-1, H)
        if r2.stride(-1) != 1:
            r2 = r2.contiguous()
        res_out = empty((T, H), x.dtype, x.device)
    else:
        r2, res_out = x2, out
    if T > 0:
        BLOCK = next_pow2(H)
        _rms_norm_kernel[(T,)](x2, r2, weight, out, res_out, H, x2.stride(0), r2.stride(0),
                               out.stride(0), res_out.stride(0), float(eps),
                               HAS_RES=residual is not None, ZERO_CENTRED=bool(zero_centred),
                               BLOCK=BLOCK, num_warps=row_warps(BLOCK), **pdl_args(x.device))
    if residual is not None:
        return out.view(shape), res_out.view(shape)
    return out.view(shape)


@triton.jit(do_not_specialize=["N"])
def _gated_rms_norm_kernel(x_ptr, z_ptr, w_ptr, out_ptr, N, D, stride_x, stride_z, stride_zh, ZH,
                           stride_o, eps, BLOCK_N: tl.constexpr, BLOCK_D: tl.constexpr,
                           PDL: tl.constexpr = False):
    """Row r of z sits at (r // ZH) * stride_z + (r % ZH) * stride_zh: a [T, ZH, D] view of
    a wider projection output (the GDN's z) is read in place, without a copy."""
    pdl_start(PDL)
    pid = tl.program_id(0)
    rows = pid * BLOCK_N + tl.arange(0, BLOCK_N)
    cols = tl.arange(0, BLOCK_D)
    rmask = rows < N
    cmask = cols < D
    m = rmask[:, None] & cmask[None, :]
    r64 = rows.to(tl.int64)[:, None]
    x = tl.load(x_ptr + r64 * stride_x + cols[None, :], mask=m, other=0.0).to(tl.float32)
    zrow = (r64 // ZH) * stride_z + (r64 % ZH) * stride_zh
    z = tl.load(z_ptr + zrow + cols[None, :], mask=m, other=0.0).to(tl.float32)
    w = tl.load(w_ptr + cols, mask=cmask, other=0.0).to(tl.float32)
    var = tl.sum(x * x, axis=1) / D
    rstd = 1.0 / tl.sqrt(var + eps)
    silu = z / (1.0 + tl.exp(-z))
    y = x * rstd[:, None] * w[None, :] * silu
    tl.store(out_ptr + r64 * stride_o + cols[None, :], y.to(out_ptr.dtype.element_ty), mask=m)


def gated_rms_norm(x, z, weight, eps):
    shape = x.shape
    D = shape[-1]
    x2 = x.reshape(-1, D)
    if x2.stride(-1) != 1:
        x2 = x2.contiguous()
    if z.dim() == 3 and z.stride(-1) == 1:       # [T, H, D] rows with two strides: no copy
        z2, zh, sz, szh = z, z.shape[1], z.stride(0), z.stride(1)
    else:
        z2 = z.reshape(-1, D)
        if z2.stride(-1) != 1:
            z2 = z2.contiguous()
        zh, sz, szh = 1, z2.stride(0), 0
    N = x2.shape[0]
    out = empty((N, D), x.dtype, x.device)
    if N == 0:
        return out.view(shape)
    BLOCK_D = next_pow2(D)
    # up to 2048 elements a program; a decode step's few rows (one per head) one a program, as
    # a few programs of many rows each leave the GPU idle
    BLOCK_N = max(1, min(16, 2048 // BLOCK_D, next_pow2(N) // 32))
    _gated_rms_norm_kernel[(triton.cdiv(N, BLOCK_N),)](
        x2, z2, weight, out, N, D, x2.stride(0), sz, szh, zh, out.stride(0), float(eps),
        BLOCK_N=BLOCK_N, BLOCK_D=BLOCK_D, num_warps=row_warps(BLOCK_N * BLOCK_D),
        **pdl_args(x.device))
    return out.view(shape)
