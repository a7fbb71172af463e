"""Linear layers: dense skinny GEMV (decode), and dequant-matmul over GGUF weights, raw or repacked.

    kernel.py         the Triton entry points the registry calls (linear, linear_pair, linear_glu,
                      silu_mul_linear, gated_norm_linear, linear_fuses_norm)
    reference.py      their PyTorch references
    dense.py          dense GEMV, T <= 16 (fp16/fp32 weights)
    residual_norm.py  the RMSNorm between two projections, split over their GEMVs
    gguf_blocks.py    GGUF block geometry and dequantization in torch (the reference decode)
    gguf_decode.py    GGUF blocks decoded inside a kernel
    gguf_matmul.py    dequant-GEMV / GEMM straight from raw GGUF blocks
    repack.py         load-time repacking of GGUF weights (PackedQuant)
    packed_fields.py  repacked words and scales decoded inside a kernel
    packed_gemv.py    the packed GEMV kernels (one or two weights a launch)
    packed_gemm.py    prefill over repacked weights (tiled GEMM; dequantize for the vendor GEMM)
    packed_config.py  launch configs of the packed GEMV per device (CUDA, ROCm gfx9) and shape
    packed.py         packed_matmul: the product with a repacked weight, on the path that fits
"""
