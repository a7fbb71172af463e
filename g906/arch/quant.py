"""The quantization capability table (g906/data/quant_types.toml), one source of truth for the
loaders, the doctor, the recipe resolver and the kernels' consistency test: which GGUF tensor
types g906 reads, how it stores them (dense at load, or quantized blocks dequantized inside the
matmul), their block geometry, and which have fused dequant-GEMV/GEMM kernels."""

from __future__ import annotations

from typing import Any

from g906 import data as _data
from g906.errors import G906Error


def gguf_types() -> dict[str, dict[str, Any]]:
    """GGUF type name -> {id, block, bytes, storage, fused}."""
    return _data.load("quant_types")["types"]


def block_geometry(name: str) -> tuple[int, int]:
    """(elements, bytes) of one block of a GGUF type."""
    t = gguf_types().get(name)
    if t is None:
        raise G906Error(f"GGUF type {name} is not supported",
                        hint="supported types: " + ", ".join(gguf_types()))
    return int(t["block"]), int(t["bytes"])


def quantized_types() -> list[str]:
    """Types kept as raw blocks in memory and dequantized inside the matmul."""
    return [n for n, t in gguf_types().items() if t["storage"] == "quantized"]


def fused_types() -> list[str]:
    """Quantized types with fused Triton dequant-matmul kernels (the others are dequantized by the
    PyTorch reference, then multiplied)."""
    return [n for n, t in gguf_types().items() if t.get("fused", False)]
