"""Triton kernel writing new K/V rows into the paged cache through a slot mapping."""

from __future__ import annotations

import triton
import triton.language as tl

from .._triton_util import next_pow2
from ..pdl import pdl_args, pdl_start


@triton.jit
def store_rows(kc_ptr, vc_ptr, slot, block_size, sc_blk, sc_off, sc_h, svc_blk, svc_off, svc_h,
               h, d, k, v, m):
    """One token's k and v rows ([BLOCK_H, BLOCK_D] at heads h [BLOCK_H, 1], dims d [1, BLOCK_D],
    mask m) into the paged caches at flat slot >= 0 (block slot // block_size, offset
    slot % block_size). Also called by the q/k norm + rotary kernel, which has k in registers."""
    blk = slot // block_size
    off = slot % block_size
    tl.store(kc_ptr + blk * sc_blk + off * sc_off + h * sc_h + d, k.to(kc_ptr.dtype.element_ty), mask=m)
    tl.store(vc_ptr + blk * svc_blk + off * svc_off + h * svc_h + d, v.to(vc_ptr.dtype.element_ty),
             mask=m)


@triton.jit
def _store_kv_kernel(k_ptr, v_ptr, kc_ptr, vc_ptr, slot_ptr, H, D, sk_t, sk_h, sv_t, sv_h,
                     sc_blk, sc_off, sc_h, svc_blk, svc_off, svc_h, block_size,
                     BLOCK_H: tl.constexpr, BLOCK_D: tl.constexpr, PDL: tl.constexpr = False):
    pdl_start(PDL)
    t = tl.program_id(0)
    slot = tl.load(slot_ptr + t).to(tl.int64)
    if slot < 0:
        return
    h = tl.arange(0, BLOCK_H)[:, None]
    d = tl.arange(0, BLOCK_D)[None, :]
    m = (h < H) & (d < D)
    t64 = t.to(tl.int64)
    k = tl.load(k_ptr + t64 * sk_t + h * sk_h + d, mask=m)
    v = tl.load(v_ptr + t64 * sv_t + h * sv_h + d, mask=m)
    store_rows(kc_ptr, vc_ptr, slot, block_size, sc_blk, sc_off, sc_h, svc_blk, svc_off, svc_h,
               h, d, k, v, m)


def store_kv(k, v, k_cache, v_cache, slot_mapping):
    T, H, D = k.shape
    if T == 0:
        return
    assert k.stride(-1) == 1 and v.stride(-1) == 1 and k_cache.stride(-1) == 1
    _store_kv_kernel[(T,)](k, v, k_cache, v_cache, slot_mapping, H, D, k.stride(0), k.stride(1),
                           v.stride(0), v.stride(1), k_cache.stride(0), k_cache.stride(1),
                           k_cache.stride(2), v_cache.stride(0), v_cache.stride(1),
                           v_cache.stride(2), k_cache.shape[1], BLOCK_H=next_pow2(H),
                           BLOCK_D=next_pow2(D), num_warps=4, **pdl_args(k.device))
