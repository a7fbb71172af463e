"""Routed experts of a sparse MoE MLP: the chosen experts' SwiGLU, weighted and summed.

    reference.py  PyTorch reference (dequantizes only the chosen experts)
    sort.py       token/expert pairs grouped by expert, padded to the GEMM's row tiles
    kernel.py     Triton: routed GEMV (decode: T <= 16) and grouped GEMM (prefill), gate/up SwiGLU fused
                  (dense and GGUF-block experts)
    int4.py       the same over int4/int8 group-quantized experts (GPTQ / AWQ / compressed-tensors)
    common.py     what both share (the decode boundary, the tile product)
"""
