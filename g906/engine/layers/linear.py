"""Linear layer over a dense weight or a QuantizedTensor (dequantized inside the matmul)."""

from __future__ import annotations

import torch

from g906.engine.layers import ops
from g906.engine.layers.base import WeightHolder, WeightSpec


class Linear(WeightHolder):
    def __init__(self, in_features: int, out_features: int):
        super().__init__()
        self.in_features = in_features
        self.out_features = out_features
        self.weight = None

    def weight_specs(self) -> dict[str, WeightSpec]:
        return {"weight": WeightSpec((self.out_features, self.in_features), quantizable=True)}

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return ops.linear(x, self.weight)

    def extra_repr(self) -> str:
        return f"in={self.in_features}, out={self.out_features}"
