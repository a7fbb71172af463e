"""Group-quantized integer weights (GPTQ, AWQ, compressed-tensors W4A16/W8A16) and their matmul.

    weight.py     GroupQuantWeight: the packed container every int4/int8 checkpoint format is
                  converted to at load (one layout, whatever the file's)
    reference.py  the PyTorch reference: dequantize, then multiply
    kernel.py     Triton dequant-GEMV (decode, T <= 16) and dequant-GEMM (prefill, tl.dot)

The layout (docs/engine.md, "Int4 checkpoints"): rows are output features; each row's input
features are packed 32 // bits to an int32 word, feature k in bits [(k % P) * bits, ...) of word
k // P; scales fp16 [N, G] and optional zero points uint8 [N, G] per group of group_size
consecutive features. value = (q - z) * s, z = 2 ** (bits - 1) without zero points. An
act-order checkpoint is reordered once at load so that every group is contiguous; `perm` then
says which input feature each column holds (the activations are permuted, never the weight).
"""
