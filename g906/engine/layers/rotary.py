"""Partial NeoX rotary embedding on the first rotary_dim dims of each head.

Text-only positions: Qwen3.5's interleaved M-RoPE reduces to plain rotary when the three
position streams are equal, which they are for text tokens. The cos/sin table covers
max_positions rows ([cos | sin] per row, fp32) and is built once on the model's device."""

from __future__ import annotations

import torch

from g906.engine.layers import ops


class RotaryEmbedding:
    def __init__(self, rotary_dim: int, theta: float, max_positions: int, device):
        self.rotary_dim = rotary_dim
        self.theta = theta
        self.cos_sin_cache = ops.make_cos_sin_cache(max_positions, rotary_dim, theta, device=device)

    def __call__(self, q: torch.Tensor, k: torch.Tensor, positions: torch.Tensor) -> None:
        ops.rotary_(q, k, positions, self.cos_sin_cache, self.rotary_dim)

    def norm_and_rotate(self, q, k, q_norm, k_norm, positions, kv_store=None):
        """(self(q_norm(q)), self(k_norm(k))) for per-head RMSNorms of one eps and weight
        convention: one kernel on GPUs (ops.qk_norm_rotary), which also writes the new k and v
        into the paged cache when kv_store = (v, k_cache, v_cache, slot_mapping)."""
        return ops.qk_norm_rotary(q, k, q_norm.weight, k_norm.weight, q_norm.eps, positions,
                                  self.cos_sin_cache, self.rotary_dim, zero_centred=q_norm.zero_centred,
                                  kv_store=kv_store)
