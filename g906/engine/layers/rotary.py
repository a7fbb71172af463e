"""Partial NeoX rotary embedding: cos/sin for the first rotary_dim dims of each head.

Text-only positions: Qwen3.5's interleaved M-RoPE reduces to plain rotary when the three
position streams are equal, which they are for text tokens."""

from __future__ import annotations

import torch

from g906.engine.layers import ops


class RotaryEmbedding:
    def __init__(self, rotary_dim: int, theta: float):
        self.rotary_dim = rotary_dim
        self.theta = theta

    def cos_sin(self, positions: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        return ops.rotary_cos_sin(positions, self.rotary_dim, self.theta)
