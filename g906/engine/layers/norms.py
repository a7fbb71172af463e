"""RMSNorm (zero-centred in Qwen3.5's HF checkpoints: applied as 1 + w) and the gated
RMSNorm of the linear-attention output (plain weight)."""

from __future__ import annotations

from typing import NamedTuple

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

    def input_of(self, x, residual: torch.Tensor | None):
        """(the next projection's input, the residual stream) after the sublayer output x: x
        added to the residual (None: x starts the stream) and normalised; a NormedInput
        already is (the output projection did it)."""
        if isinstance(x, NormedInput):
            return x, x.h
        if residual is None:
            return self(x), x
        return self(x, residual)


class NormedInput(NamedTuple):
    """RMSNorm(h) with its 1 / rms not yet applied. The output projection that made h (the
    residual stream) also made hn = h * norm weight and partial sums of h * h, ss (ops.linear's
    add_norm); the projection that reads it applies 1 / rms(h) in its own GEMV (rms_of): no
    RMSNorm kernel between them (g906/kernels/linear/residual_norm.py)."""
    h: torch.Tensor
    hn: torch.Tensor
    ss: torch.Tensor
    norm: RMSNorm

    def materialize(self) -> torch.Tensor:
        return self.norm(self.h)

    @property
    def rms_of(self) -> tuple:
        """The rms_of argument of the projection that reads hn (ops.linear)."""
        return (self.ss, self.norm.eps)


class AddNorm(NamedTuple):
    """What follows an output projection: the residual add and the next RMSNorm. Given to the
    projection, it returns a NormedInput where its GEMV can do both (Linear.forward)."""
    residual: torch.Tensor
    norm: RMSNorm


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
