"""Token embedding over a GGUF-quantized table: the rows of the step's tokens dequantized
straight from their GGUF blocks, one kernel (the reference gathers the rows' blocks and
dequantizes them with a few dozen small torch ops every decode step)."""

from __future__ import annotations

import torch
import triton
import triton.language as tl

from .._triton_util import empty
from ..pdl import pdl_args, pdl_start
from ..linear.gguf_decode import QTYPES, STEP_BYTES, _dequant_step


@triton.jit
def _embedding_kernel(ids_ptr, w_ptr, out_ptr, sw_n, so, QT: tl.constexpr, STEP_B: tl.constexpr,
                      PDL: tl.constexpr = False):
    """Super-block program_id(1) (256 elements) of token program_id(0)'s row."""
    pdl_start(PDL)
    t = tl.program_id(0)
    st = tl.program_id(1)
    row = tl.load(ids_ptr + t).to(tl.int64)
    rowp = w_ptr + row * sw_n + st * STEP_B + tl.zeros([1, 1, 1], tl.int64)
    w0, e0, w1, e1 = _dequant_step(rowp, QT)
    o = out_ptr + t.to(tl.int64) * so + st * 256
    tl.store(o + e0, w0.to(out_ptr.dtype.element_ty))
    tl.store(o + e1, w1.to(out_ptr.dtype.element_ty))


def embedding(weight, ids: torch.Tensor, dtype: torch.dtype) -> torch.Tensor:
    """Rows ids (int [T]) of a QuantizedTensor [vocab, K] (K % 256 == 0) as dense [T, K]."""
    K = weight.shape[1]
    data = weight.data
    out = empty((ids.numel(), K), dtype, data.device)
    if ids.numel():
        _embedding_kernel[(ids.numel(), K // 256)](
            ids, data, out, data.stride(0), out.stride(0), QT=QTYPES[weight.qtype],
            STEP_B=STEP_BYTES[weight.qtype], num_warps=4, **pdl_args(data.device))
    return out
