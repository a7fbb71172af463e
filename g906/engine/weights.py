"""How loaders hand weights to the model.

A loader yields (name, tensor) pairs with Hugging Face parameter names
(e.g. "model.layers.3.linear_attn.in_proj_qkv.weight") and HF semantics. A tensor is a dense
torch.Tensor, a QuantizedTensor (GGUF blocks) or a GroupQuantWeight (GPTQ / AWQ /
compressed-tensors int4 or int8, g906/kernels/int4); the quantized two stay quantized in memory
and the matmul dequantizes them on the fly (g906.kernels). Routed experts stack into
QuantizedExperts (GGUF) or GroupQuantExperts (int4 / int8, g906/kernels/int4/experts.py)."""

from __future__ import annotations

from dataclasses import dataclass

import torch

from g906.kernels.int4.experts import GroupQuantExperts
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


@dataclass
class QuantizedExperts:
    """GGUF-quantized expert weights stacked along a leading expert axis, kept as raw blocks:
    the routed-expert kernels (g906.kernels.moe) read the chosen experts' rows in place.

    data: uint8 [experts, rows, row_bytes]; qtype: GGUF type name; shape: (experts, rows, in).
    The kernels need only data / qtype / shape; another storage format plugs in with a container
    of its own that has `dequantize_experts(ids)` (see g906.kernels.moe.reference).
    """

    data: torch.Tensor
    qtype: str
    shape: tuple[int, int, int]

    @property
    def nbytes(self) -> int:
        return self.data.numel() * self.data.element_size()

    def to(self, device) -> "QuantizedExperts":
        return QuantizedExperts(self.data.to(device), self.qtype, self.shape)

    def expert(self, e: int) -> QuantizedTensor:
        return QuantizedTensor(self.data[e], self.qtype, (self.shape[1], self.shape[2]))

    def select_rows(self, index: torch.Tensor) -> "QuantizedExperts":
        """The same rows of every expert (whole blocks): tensor-parallel shares."""
        data = self.data.index_select(1, index.to(self.data.device))
        return QuantizedExperts(data, self.qtype, (self.shape[0], int(index.numel()), self.shape[2]))

    def select_row_bytes(self, byte_index: torch.Tensor, columns: int) -> "QuantizedExperts":
        """The same whole blocks of every row (input features; byte_index names their bytes)."""
        data = self.data.index_select(2, byte_index.to(self.data.device))
        return QuantizedExperts(data, self.qtype, (self.shape[0], self.shape[1], columns))

    @staticmethod
    def cat_rows(parts: "list[QuantizedExperts]") -> "QuantizedExperts":
        data = torch.cat([p.data for p in parts], dim=1)
        return QuantizedExperts(data, parts[0].qtype,
                                (parts[0].shape[0], int(sum(p.shape[1] for p in parts)), parts[0].shape[2]))


QUANTIZED_TYPES = (QuantizedTensor, GroupQuantWeight, QuantizedExperts, GroupQuantExperts)


def is_quantized(t) -> bool:
    """A weight kept quantized in memory (GGUF blocks, int4/int8 groups, or stacked experts of
    either)."""
    return isinstance(t, QUANTIZED_TYPES)
