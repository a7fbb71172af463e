"""SwiGLU MLP: down(silu(gate(x)) * up(x))."""

from __future__ import annotations

import torch
from torch import nn

from g906.engine.layers import ops
from g906.engine.layers.linear import Linear


class MLP(nn.Module):
    def __init__(self, hidden_size: int, intermediate_size: int):
        super().__init__()
        self.gate_proj = Linear(hidden_size, intermediate_size)
        self.up_proj = Linear(hidden_size, intermediate_size)
        self.down_proj = Linear(intermediate_size, hidden_size)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        gate_up = torch.cat([self.gate_proj(x), self.up_proj(x)], dim=-1)
        return self.down_proj(ops.silu_and_mul(gate_up))
