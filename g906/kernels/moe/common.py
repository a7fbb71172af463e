"""What the routed-expert kernels over every weight storage share (kernel.py: dense and GGUF
blocks; int4.py: int4/int8 groups): the decode/prefill boundary and the tile product."""

from __future__ import annotations

import triton
import triton.language as tl

GEMV_MAX_TOKENS = 16       # up to this many tokens a call runs the routed GEMV, above the grouped GEMM


@triton.jit
def _dot_t(a, b, acc, FP32: tl.constexpr):
    """acc + a [M, K] @ b [N, K]^T (fp32 inputs: IEEE products; else b in a's dtype)."""
    if FP32:
        return acc + tl.dot(a, tl.trans(b), input_precision="ieee")
    return acc + tl.dot(a, tl.trans(b.to(a.dtype)))
