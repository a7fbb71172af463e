"""Triton kernels for partial NeoX rotary embedding (one program per token): in place on q and k,
and fused with the per-head q/k RMSNorm that precedes it in the gated attention (two kernels
fewer per attention layer and step)."""

from __future__ import annotations

import triton
import triton.language as tl

from .._triton_util import empty, next_pow2
from ..kv_cache.kernel import store_rows
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


@triton.jit
def _norm_rotate_heads(x_ptr, o_ptr, w_ptr, H, D, s_t, s_h, t, d, part, rot, cos, ssin, eps,
                       h0, ZC: tl.constexpr, BLOCK_H: tl.constexpr):
    """Token t's heads [h0, h0 + BLOCK_H) of its H heads of x: RMSNorm over D (rounded to the
    output dtype, as the norm kernel's output), then rotary on the first dims; into o [T, H, D]
    contiguous, and returned with the heads' mask. part: the rotary partner of each dim (its
    other half), ssin: sin with the rotation's sign."""
    h = h0 + tl.arange(0, BLOCK_H)
    dm = d < D
    m = (h < H)[:, None] & dm[None, :]
    base = x_ptr + t.to(tl.int64) * s_t + h[:, None] * s_h
    x = tl.load(base + d[None, :], mask=m, other=0.0).to(tl.float32)
    xp = tl.load(base + part[None, :], mask=m & rot[None, :], other=0.0).to(tl.float32)
    w = tl.load(w_ptr + d, mask=dm, other=0.0).to(tl.float32)
    wp = tl.load(w_ptr + part, mask=rot, other=0.0).to(tl.float32)
    if ZC:
        w = w + 1.0
        wp = wp + 1.0
    rstd = 1.0 / tl.sqrt(tl.sum(x * x, axis=1) / D + eps)
    dt = o_ptr.dtype.element_ty
    y = (x * rstd[:, None] * w[None, :]).to(dt).to(tl.float32)
    yp = (xp * rstd[:, None] * wp[None, :]).to(dt).to(tl.float32)
    out = tl.where(rot[None, :], y * cos[None, :] + yp * ssin[None, :], y).to(dt)
    tl.store(o_ptr + (t.to(tl.int64) * H + h[:, None]) * D + d[None, :], out, mask=m)
    return out, m


@triton.jit
def _qk_norm_rotary_kernel(q_ptr, k_ptr, qo_ptr, ko_ptr, qw_ptr, kw_ptr, pos_ptr, cs_ptr, Hq, Hk,
                           D, sq_t, sq_h, sk_t, sk_h, s_cs, eps,
                           v_ptr, kc_ptr, vc_ptr, slot_ptr, sv_t, sv_h, skc_b, skc_o, skc_h,
                           svc_b, svc_o, svc_h, block_size, HALF: tl.constexpr,
                           ZC: tl.constexpr, BLOCK_HQ: tl.constexpr, BLOCK_HK: tl.constexpr,
                           BLOCK_D: tl.constexpr, STORE: tl.constexpr = False,
                           PDL: tl.constexpr = False):
    """Token program_id(0): program_id(1) < cdiv(Hq, BLOCK_HQ) does a block of its q heads, the
    last one its k heads. STORE: token t's new k (normed, rotated) and v rows also go into the
    paged caches at slot_ptr[t] (store_kv's job; slot -1 skips)."""
    pdl_start(PDL)
    t = tl.program_id(0)
    hb = tl.program_id(1)
    pos = tl.load(pos_ptr + t).to(tl.int64)
    d = tl.arange(0, BLOCK_D)
    rot = d < 2 * HALF
    part = tl.where(d < HALF, d + HALF, d - HALF)
    c = tl.where(rot, d % HALF, 0)
    cos = tl.load(cs_ptr + pos * s_cs + c, mask=rot, other=1.0).to(tl.float32)
    sin = tl.load(cs_ptr + pos * s_cs + HALF + c, mask=rot, other=0.0).to(tl.float32)
    ssin = tl.where(d < HALF, -sin, sin)
    if hb * BLOCK_HQ < Hq:
        _norm_rotate_heads(q_ptr, qo_ptr, qw_ptr, Hq, D, sq_t, sq_h, t, d, part, rot, cos, ssin,
                           eps, hb * BLOCK_HQ, ZC, BLOCK_HQ)
    else:
        kr, m = _norm_rotate_heads(k_ptr, ko_ptr, kw_ptr, Hk, D, sk_t, sk_h, t, d, part, rot,
                                   cos, ssin, eps, 0, ZC, BLOCK_HK)
        if STORE:
            slot = tl.load(slot_ptr + t).to(tl.int64)
            if slot >= 0:
                h = tl.arange(0, BLOCK_HK)[:, None]
                dd = d[None, :]
                vr = tl.load(v_ptr + t.to(tl.int64) * sv_t + h * sv_h + dd, mask=m)
                store_rows(kc_ptr, vc_ptr, slot, block_size, skc_b, skc_o, skc_h, svc_b, svc_o,
                           svc_h, h, dd, kr, vr, m)


def qk_norm_rotary(q, k, q_weight, k_weight, eps, positions, cos_sin_cache, rot_dim, *,
                   zero_centred=False, kv_store=None):
    """kv_store = (v, k_cache, v_cache, slot_mapping): also store_kv the new k and v rows (one
    kernel fewer per attention layer and step)."""
    T, Hq, D = q.shape
    Hk = k.shape[1]
    assert q.stride(-1) == 1 and k.stride(-1) == 1, "qk_norm_rotary: head_dim must be contiguous"
    qo = empty((T, Hq, D), q.dtype, q.device)
    ko = empty((T, Hk, D), k.dtype, k.device)
    if T == 0:
        return qo, ko
    if kv_store is not None:
        v, kc, vc, slots = kv_store
        assert v.stride(-1) == 1 and kc.stride(-1) == 1 and vc.stride(-1) == 1
        store = (v, kc, vc, slots, v.stride(0), v.stride(1), kc.stride(0), kc.stride(1),
                 kc.stride(2), vc.stride(0), vc.stride(1), vc.stride(2), kc.shape[1])
    else:  # not read (STORE=False)
        store = (k, k, k, positions) + (0,) * 8 + (1,)
    # q heads in blocks of about as many as the k heads: at decode's few tokens, a few small
    # programs per token finish sooner than one program walking every head
    bq = min(next_pow2(Hq), max(next_pow2(Hk), 4))
    _qk_norm_rotary_kernel[(T, triton.cdiv(Hq, bq) + 1)](
        q, k, qo, ko, q_weight, k_weight, positions, cos_sin_cache, Hq, Hk, D, q.stride(0),
        q.stride(1), k.stride(0), k.stride(1), cos_sin_cache.stride(0), float(eps), *store,
        HALF=rot_dim // 2, ZC=bool(zero_centred), BLOCK_HQ=bq, BLOCK_HK=next_pow2(Hk),
        BLOCK_D=next_pow2(D), STORE=kv_store is not None, num_warps=4, **pdl_args(q.device))
    return qo, ko
