"""Dequantization of every GGUF tensor type the engine supports, checked against its table.

`dequantize(raw, qtype, shape)` turns raw ggml blocks (uint8, [..., row_bytes]) into float32,
wherever the input tensor lives (CPU or GPU). The decoders are the kernels' torch reference
(g906/kernels/linear/gguf_blocks.py: bit-identical to `gguf.quants.dequantize`,
tests/engine/test_quant_dequant.py); the type table and the block geometry are g906.arch.quant's
(g906/data/quant_types.toml), the user-facing errors the engine's.
"""

from __future__ import annotations

import math
from collections.abc import Sequence

import torch

from g906.arch.quant import block_geometry, gguf_types as quant_types
from g906.errors import G906Error
from g906.kernels.linear.gguf_blocks import DECODERS, decode_blocks


def type_name_for_id(type_id: int) -> str | None:
    for name, info in quant_types().items():
        if info["id"] == type_id:
            return name
    return None


def row_bytes(qtype: str, n_elements: int) -> int:
    """Bytes one row of n_elements occupies in the given type."""
    block, nbytes = block_geometry(qtype)
    if n_elements % block:
        raise G906Error(f"a row of {n_elements} elements is not a whole number of {qtype} blocks ({block})")
    return n_elements // block * nbytes


def supported_types() -> list[str]:
    return list(DECODERS)


def dequantize(raw: torch.Tensor, qtype: str, shape: Sequence[int] | None = None) -> torch.Tensor:
    """Raw ggml blocks -> float32 tensor of `shape` (default: raw's leading dims + row elements).

    raw: uint8 [..., row_bytes] (rows of whole blocks), on any device.
    qtype: a type name of g906/data/quant_types.toml ("Q4_K", "F16", ...).
    """
    if qtype not in DECODERS:
        raise G906Error(f"unsupported GGUF tensor type {qtype!r}",
                        hint="supported: " + ", ".join(DECODERS))
    if raw.dtype != torch.uint8:
        raise G906Error(f"dequantize expects uint8 blocks, got {raw.dtype}")
    block, nbytes = block_geometry(qtype)
    if raw.dim() == 0 or raw.shape[-1] % nbytes:
        raise G906Error(f"{qtype} data rows of {raw.shape[-1] if raw.dim() else 0} bytes are not whole "
                        f"{nbytes}-byte blocks")
    lead = tuple(raw.shape[:-1])
    n_elem_row = raw.shape[-1] // nbytes * block
    out_shape = tuple(shape) if shape is not None else lead + (n_elem_row,)
    total = math.prod(lead) * n_elem_row
    if math.prod(out_shape) != total:
        raise G906Error(f"{qtype} data holds {total} elements, which does not fit shape {list(out_shape)}")
    blocks = raw.reshape(-1, nbytes)
    if blocks.shape[0] == 0:
        return torch.empty(out_shape, dtype=torch.float32, device=raw.device)
    out = decode_blocks(blocks, qtype)
    return out.reshape(out_shape)
