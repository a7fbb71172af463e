"""Triton argmax over rows of logits, in two passes: P programs per row each reduce a slice to
(max, first index), then one program per row reduces the P pairs: a vocabulary-wide row is
spread over many programs instead of keeping one busy while the GPU idles."""

from __future__ import annotations

import torch
import triton
import triton.language as tl

from .._triton_util import empty, num_sms
from ..pdl import pdl_args, pdl_start

NO_INDEX: tl.constexpr = tl.constexpr(2**31 - 1)    # no column taken yet (int32 max)


@triton.jit
def _best(v, i):
    """(max of v, the smallest i where v is that max): first occurrence, as torch.argmax."""
    m = tl.max(v, axis=0)
    return m, tl.min(tl.where(v == m, i, NO_INDEX), axis=0)


@triton.jit
def _argmax_part_kernel(x_ptr, val_ptr, idx_ptr, V, sx, slice_len, P, BLOCK: tl.constexpr,
                        PDL: tl.constexpr = False):
    pdl_start(PDL)
    t = tl.program_id(0)
    p = tl.program_id(1)
    row = x_ptr + t.to(tl.int64) * sx
    cols = tl.arange(0, BLOCK)
    best_v = tl.full([BLOCK], float("-inf"), tl.float32)
    best_i = tl.full([BLOCK], NO_INDEX, tl.int32)
    for off in range(p * slice_len, tl.minimum(p * slice_len + slice_len, V), BLOCK):
        c = off + cols
        v = tl.load(row + c, mask=c < V, other=float("-inf")).to(tl.float32)
        take = v > best_v                          # strictly greater: earlier columns win ties
        best_v = tl.where(take, v, best_v)
        best_i = tl.where(take, c, best_i)
    m, i = _best(best_v, best_i)
    tl.store(val_ptr + t * P + p, m)
    tl.store(idx_ptr + t * P + p, i)


@triton.jit
def _argmax_final_kernel(val_ptr, idx_ptr, out_ptr, P, BLOCK_P: tl.constexpr,
                         PDL: tl.constexpr = False):
    pdl_start(PDL)
    t = tl.program_id(0)
    pp = tl.arange(0, BLOCK_P)
    m = pp < P
    v = tl.load(val_ptr + t * P + pp, mask=m, other=float("-inf"))
    i = tl.load(idx_ptr + t * P + pp, mask=m, other=NO_INDEX)
    _, best = _best(v, i)
    # a row of NaNs or -inf only: index 0, as no column was taken
    tl.store(out_ptr + t, tl.where(best == NO_INDEX, 0, best).to(tl.int64))


def argmax(x, *, block=1024, programs=None):
    T, V = x.shape
    assert x.stride(1) == 1 and V < NO_INDEX
    out = empty((T,), torch.int64, x.device)
    if T == 0:
        return out
    # about 2 programs per SM over the batch, each slice a whole number of blocks
    P = programs or max(1, min(triton.cdiv(V, block), triton.cdiv(2 * num_sms(x.device), T), 512))
    slice_len = triton.cdiv(triton.cdiv(V, P), block) * block
    P = triton.cdiv(V, slice_len)
    vals = empty((T, P), torch.float32, x.device)
    idx = empty((T, P), torch.int32, x.device)
    pdl = pdl_args(x.device)
    _argmax_part_kernel[(T, P)](x, vals, idx, V, x.stride(0), slice_len, P, BLOCK=block,
                                num_warps=4, **pdl)
    _argmax_final_kernel[(T,)](vals, idx, out, P, BLOCK_P=triton.next_power_of_2(P),
                               num_warps=4, **pdl)
    return out
