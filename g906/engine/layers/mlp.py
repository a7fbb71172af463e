"""SwiGLU MLP: down(silu(gate(x)) * up(x))."""

from __future__ import annotations

import torch
from torch import nn

from g906.engine.layers import ops
from g906.engine.layers.linear import Linear, fuse_weights, is_packed, normed_call, plain, project
from g906.engine.layers.norms import AddNorm


class MLP(nn.Module):
    def __init__(self, hidden_size: int, intermediate_size: int):
        super().__init__()
        self.gate_proj = Linear(hidden_size, intermediate_size)
        self.up_proj = Linear(hidden_size, intermediate_size)
        self.down_proj = Linear(intermediate_size, hidden_size)
        self.gate_up_weight = None   # [gate; up] stacked after loading when the two weights stack

    def post_load(self) -> None:
        w = fuse_weights([self.gate_proj, self.up_proj])
        if w is not None:
            self.gate_up_weight = w
            self.gate_proj.set_weight("weight", None)
            self.up_proj.set_weight("weight", None)

    def forward(self, x, then: AddNorm | None = None):
        """x: a tensor or a NormedInput; then: as Linear.forward's."""
        w = self.gate_up_weight
        if w is not None and is_packed(w):
            # repacked GGUF weights: the gate/up GEMV's epilogue applies the SwiGLU (decode);
            # dense ones keep it in the down projection's GEMV, beside its split RMSNorm
            return self.down_proj(normed_call(ops.linear_glu, x, w), then)
        if w is not None:
            gate_up = project(x, w)
        else:
            x = plain(x)
            gate_up = torch.cat([self.gate_proj(x), self.up_proj(x)], dim=-1)
        return self.down_proj.forward_silu_mul(gate_up, then)
