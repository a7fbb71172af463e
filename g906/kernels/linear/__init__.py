"""Linear layers: fp16 skinny GEMM (decode) and fused GGUF dequant-matmul (GEMV + tiled)."""
