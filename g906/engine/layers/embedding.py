"""Token embedding; a quantized table is dequantized for the gathered rows only."""

from __future__ import annotations

import torch

from g906.engine.layers import ops
from g906.engine.layers.base import WeightHolder, WeightSpec
from g906.engine.weights import QuantizedTensor
from g906.kernels.int4.weight import is_group_quant


class Embedding(WeightHolder):
    def __init__(self, vocab_size: int, hidden_size: int, dtype: torch.dtype):
        super().__init__()
        self.vocab_size = vocab_size
        self.hidden_size = hidden_size
        self.dtype = dtype
        self.weight = None

    def weight_specs(self) -> dict[str, WeightSpec]:
        return {"weight": WeightSpec((self.vocab_size, self.hidden_size), quantizable=True)}

    def forward(self, input_ids: torch.Tensor) -> torch.Tensor:
        w = self.weight
        if isinstance(w, QuantizedTensor):
            return ops.embedding(w, input_ids, self.dtype)
        if is_group_quant(w):      # a compressed-tensors table quantized with the projections
            return ops.dequantize_weight(w.select_rows(input_ids), self.dtype)
        return w.index_select(0, input_ids)
