"""GGUF quantized tensor types: torch dequantization (the reference for the Triton kernels)."""

from g906.engine.quant.dequant import block_geometry, dequantize, row_bytes, supported_types

__all__ = ["block_geometry", "dequantize", "row_bytes", "supported_types"]
