"""How loaders hand weights to the model.

A loader yields (name, tensor) pairs with Hugging Face parameter names
(e.g. "model.layers.3.linear_attn.in_proj_qkv.weight") and HF semantics. A tensor is a dense
torch.Tensor, a QuantizedTensor (GGUF blocks) or a GroupQuantWeight (GPTQ / AWQ /
compressed-tensors int4 or int8, g906/kernels/int4); the quantized two stay quantized in memory
and the matmul dequantizes them on the fly (g906.kernels)."""

from __future__ import annotations

from dataclasses import dataclass

import torch

from g906.kernels.int4.weight import GroupQuantWeight


@dataclass
class QuantizedTensor:
    """GGUF-quantized 2-D weight, rows = output features, kept as raw blocks.

    data: uint8 [rows, row_bytes] — each row is in_features / block_elems whole blocks.
    qtype: GGUF type name ("Q8_0", "Q4_K", ...), a key of g906/data/quant_types.toml.
    shape: the logical (rows, in_features) shape.
    """

    data: torch.Tensor
    qtype: str
    shape: tuple[int, int]

    @property
    def nbytes(self) -> int:
        return self.data.numel() * self.data.element_size()

    def to(self, device) -> "QuantizedTensor":
        return QuantizedTensor(self.data.to(device), self.qtype, self.shape)

    def select_rows(self, index: torch.Tensor) -> "QuantizedTensor":
        """Rows gathered as whole blocks: used for head reordering and sharding."""
        data = self.data.index_select(0, index.to(self.data.device))
        return QuantizedTensor(data, self.qtype, (int(index.numel()), self.shape[1]))


QUANTIZED_TYPES = (QuantizedTensor, GroupQuantWeight)


def is_quantized(t) -> bool:
    """A weight kept quantized in memory (either kind)."""
    return isinstance(t, QUANTIZED_TYPES)
