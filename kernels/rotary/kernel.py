"""Triton kernel for partial NeoX rotary embedding, in place on q and k (one program per token)."""

from __future__ import annotations

import triton
import triton.language as tl

from .._triton_util import next_pow2
from ..pdl import pdl_args, pdl_start


@triton.jit
def _rotary_kernel(q_ptr, k_ptr, pos_ptr, cs_ptr, Hq, Hk, sq_t, sq_h, sk_t, sk_h, s_cs,
                   HALF: tl.constexpr, BLOCK_H: tl.constexpr, BLOCK_R: tl.constexpr,
                   PDL: tl.constexpr = False):
    pdl_start(PDL)
    t = tl.program_id(0)
    pos = tl.load(pos_ptr + t).to(tl.int64)
    r = tl.arange(0, BLOCK_R)
    rmask = r < HALF
    cos = tl.load(cs_ptr + pos * s_cs + r, mask=rmask, other=0.0).to(tl.float32)[None, :]
    sin = tl.load(cs_ptr + pos * s_cs + HALF + r, mask=rmask, other=0.0).to(tl.float32)[None, :]
    h = tl.arange(0, BLOCK_H)
    t64 = t.to(tl.int64)
    # q
    m = (h < Hq)[:, None] & rmask[None, :]
    p1 = q_ptr + t64 * sq_t + h[:, None] * sq_h + r[None, :]
    x1 = tl.load(p1, mask=m, other=0.0).to(tl.float32)
    x2 = tl.load(p1 + HALF, mask=m, other=0.0).to(tl.float32)
    tl.store(p1, (x1 * cos - x2 * sin).to(q_ptr.dtype.element_ty), mask=m)
    tl.store(p1 + HALF, (x2 * cos + x1 * sin).to(q_ptr.dtype.element_ty), mask=m)
    # k
    m = (h < Hk)[:, None] & rmask[None, :]
    p1 = k_ptr + t64 * sk_t + h[:, None] * sk_h + r[None, :]
    x1 = tl.load(p1, mask=m, other=0.0).to(tl.float32)
    x2 = tl.load(p1 + HALF, mask=m, other=0.0).to(tl.float32)
    tl.store(p1, (x1 * cos - x2 * sin).to(k_ptr.dtype.element_ty), mask=m)
    tl.store(p1 + HALF, (x2 * cos + x1 * sin).to(k_ptr.dtype.element_ty), mask=m)


def rotary_(q, k, positions, cos_sin_cache, rot_dim):
    T, Hq, D = q.shape
    Hk = k.shape[1]
    assert q.stride(-1) == 1 and k.stride(-1) == 1, "rotary_: head_dim must be contiguous"
    if T == 0:
        return q, k
    half = rot_dim // 2
    _rotary_kernel[(T,)](q, k, positions, cos_sin_cache, Hq, Hk, q.stride(0), q.stride(1),
                         k.stride(0), k.stride(1), cos_sin_cache.stride(0), HALF=half,
                         BLOCK_H=next_pow2(max(Hq, Hk)), BLOCK_R=next_pow2(half), num_warps=2,
                         **pdl_args(q.device))
    return q, k
