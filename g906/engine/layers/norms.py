"""RMSNorm (zero-centred in Qwen3.5's HF checkpoints: applied as 1 + w) and the gated
RMSNorm of the linear-attention output (plain weight)."""

from __future__ import annotations

import torch

from g906.engine.layers import ops
from g906.engine.layers.base import WeightHolder, WeightSpec


class RMSNorm(WeightHolder):
    def __init__(self, dim: int, eps: float, zero_centred: bool = True):
        super().__init__()
        self.dim = dim
        self.eps = eps
        self.zero_centred = zero_centred
        self.weight = None

    def weight_specs(self) -> dict[str, WeightSpec]:
        return {"weight": WeightSpec((self.dim,))}

    def forward(self, x: torch.Tensor, residual: torch.Tensor | None = None):
        return ops.rms_norm(x, self.weight, self.eps, residual=residual, zero_centred=self.zero_centred)


class GatedRMSNorm(WeightHolder):
    def __init__(self, dim: int, eps: float):
        super().__init__()
        self.dim = dim
        self.eps = eps
        self.weight = None

    def weight_specs(self) -> dict[str, WeightSpec]:
        return {"weight": WeightSpec((self.dim,))}

    def forward(self, x: torch.Tensor, z: torch.Tensor) -> torch.Tensor:
        return ops.gated_rms_norm(x, z, self.weight, self.eps)
