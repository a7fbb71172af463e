"""PyTorch reference for rotary_ (NeoX / rotate_half style on the first rot_dim of head_dim)."""

from __future__ import annotations

import torch


def _rotate(x, cos, sin, rot_dim):
    half = rot_dim // 2
    x1 = x[..., :half].float()
    x2 = x[..., half:rot_dim].float()
    o1 = x1 * cos - x2 * sin
    o2 = x2 * cos + x1 * sin
    x[..., :half] = o1.to(x.dtype)
    x[..., half:rot_dim] = o2.to(x.dtype)


def rotary_(q, k, positions, cos_sin_cache, rot_dim):
    half = rot_dim // 2
    cs = cos_sin_cache.index_select(0, positions.long()).float()  # [T, rot_dim]
    cos = cs[:, None, :half]
    sin = cs[:, None, half:rot_dim]
    _rotate(q, cos, sin, rot_dim)
    _rotate(k, cos, sin, rot_dim)
    return q, k


def qk_norm_rotary(q, k, q_weight, k_weight, eps, positions, cos_sin_cache, rot_dim, *,
                   zero_centred=False, kv_store=None):
    """(rotary(rms_norm(q)), rotary(rms_norm(k))) as new [T, H, D] tensors: the per-head q/k
    norms (weights [D]) and the rotary of the gated attention, in one op. kv_store = (v,
    k_cache, v_cache, slot_mapping): then also store_kv(k, v, ...) of the new k."""
    from ..kv_cache.reference import store_kv
    from ..norm.reference import rms_norm

    qn = rms_norm(q, q_weight, eps, zero_centred=zero_centred).contiguous()
    kn = rms_norm(k, k_weight, eps, zero_centred=zero_centred).contiguous()
    qn, kn = rotary_(qn, kn, positions, cos_sin_cache, rot_dim)
    if kv_store is not None:
        v, k_cache, v_cache, slots = kv_store
        store_kv(kn, v, k_cache, v_cache, slots)
    return qn, kn


def make_cos_sin_cache(max_pos, rot_dim, base=10_000_000.0, device=None, dtype=torch.float32):
    """Rows [cos(pos * inv_freq) | sin(pos * inv_freq)], inv_freq = base^(-2i/rot_dim)."""
    inv = 1.0 / (base ** (torch.arange(0, rot_dim, 2, dtype=torch.float64) / rot_dim))
    ang = torch.arange(max_pos, dtype=torch.float64)[:, None] * inv[None, :]
    return torch.cat([ang.cos(), ang.sin()], dim=-1).to(device=device, dtype=dtype)
