"""PyTorch reference of the quantized token embedding: the rows' GGUF blocks gathered, then
dequantized (linear.gguf_blocks.dequantize)."""

from __future__ import annotations

import torch

from ..linear.gguf_blocks import dequantize


def embedding(weight, ids: torch.Tensor, dtype: torch.dtype) -> torch.Tensor:
    """Rows ids (int [T]) of a QuantizedTensor [vocab, K] as dense [T, K] of dtype."""
    rows = weight.select_rows(ids)
    return dequantize(rows.data, rows.qtype, rows.shape).to(dtype)
