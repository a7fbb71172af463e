"""Triton kernel for SiLU-and-mul."""

from __future__ import annotations

import triton
import triton.language as tl

from .._triton_util import empty
from ..pdl import pdl_args, pdl_start


@triton.jit
def _silu_and_mul_kernel(x_ptr, out_ptr, I, stride_x, stride_o, BLOCK: tl.constexpr,
                         PDL: tl.constexpr = False):
    pdl_start(PDL)
    t = tl.program_id(0).to(tl.int64)
    cols = tl.program_id(1) * BLOCK + tl.arange(0, BLOCK)
    m = cols < I
    a = tl.load(x_ptr + t * stride_x + cols, mask=m, other=0.0).to(tl.float32)
    b = tl.load(x_ptr + t * stride_x + I + cols, mask=m, other=0.0).to(tl.float32)
    y = a / (1.0 + tl.exp(-a)) * b
    tl.store(out_ptr + t * stride_o + cols, y.to(out_ptr.dtype.element_ty), mask=m)


def silu_and_mul(x):
    shape = x.shape
    x2 = x.reshape(-1, shape[-1])
    if x2.stride(-1) != 1:
        x2 = x2.contiguous()
    T, I2 = x2.shape
    I = I2 // 2
    out = empty((T, I), x.dtype, x.device)
    if T == 0:
        return out.view(*shape[:-1], I)
    BLOCK = 1024
    _silu_and_mul_kernel[(T, triton.cdiv(I, BLOCK))](x2, out, I, x2.stride(0), out.stride(0),
                                                    BLOCK=BLOCK, num_warps=4, **pdl_args(x.device))
    return out.view(*shape[:-1], I)
