"""Dense skinny GEMM and fused GGUF dequant-matmul: Triton vs reference."""

from __future__ import annotations

import numpy as np
import pytest
import torch

from g906.engine.weights import QuantizedTensor
from g906.kernels import registry
from g906.kernels.linear.gguf_blocks import BLOCKS

from .conftest import DEVICE
from .util import assert_close, gpu, needs_gpu, randn

QTYPES = ["Q8_0", "Q4_0", "Q4_K", "Q5_K", "Q6_K"]


def random_blocks(rows: int, cols: int, qtype: str, seed: int) -> torch.Tensor:
    """Random GGUF blocks with finite, moderate fp16 scales (random bytes elsewhere)."""
    be, bb = BLOCKS[qtype]
    rng = np.random.default_rng(seed)
    nb = rows * cols // be
    raw = rng.integers(0, 256, size=(nb, bb), dtype=np.uint8)
    def put_f16(off, lo, hi):
        vals = rng.uniform(lo, hi, size=nb).astype(np.float16)
        raw[:, off:off + 2] = vals.view(np.uint8).reshape(nb, 2)
    if qtype in ("Q8_0", "Q4_0"):
        put_f16(0, -0.02, 0.02)
    elif qtype in ("Q4_K", "Q5_K"):
        put_f16(0, 0.0, 0.003)
        put_f16(2, 0.0, 0.003)
    elif qtype == "Q6_K":
        put_f16(208, -0.002, 0.002)
    return torch.from_numpy(raw.reshape(rows, cols // be * bb).copy())


@pytest.mark.parametrize("dtype", [torch.float32, torch.float16])
@pytest.mark.parametrize("T", [1, 3, 16])
def test_dense_gemv(dtype, T):
    g = torch.Generator().manual_seed(40)
    x = randn(T, 300, dtype=dtype, gen=g)
    w = randn(37, 300, dtype=dtype, gen=g, scale=0.05)
    assert_close(registry.call_triton("linear", x, w), registry.call_reference("linear", x, w))


@pytest.mark.parametrize("qtype", QTYPES)
@pytest.mark.parametrize("T", [1, 3, 20])
def test_quant_linear(qtype, T):
    g = torch.Generator().manual_seed(41)
    N, K = 19, 512
    w = QuantizedTensor(random_blocks(N, K, qtype, 2).to(DEVICE), qtype, (N, K))
    dtype = torch.float16 if T == 3 else torch.float32
    x = randn(T, K, dtype=dtype, gen=g)
    out = registry.call_triton("linear", x, w)
    ref = registry.call_reference("linear", x, w)
    assert_close(out, ref)


def test_quant_linear_strided_rows():
    # x may be a view with a row stride larger than K (e.g. a slice of a fused projection)
    g = torch.Generator().manual_seed(42)
    N, K = 9, 256
    w = QuantizedTensor(random_blocks(N, K, "Q4_K", 3).to(DEVICE), "Q4_K", (N, K))
    xx = randn(2, K + 64, gen=g)
    x = xx[:, 64:]
    assert_close(registry.call_triton("linear", x, w), registry.call_reference("linear", x, w))


@gpu
@needs_gpu
@pytest.mark.parametrize("qtype", QTYPES)
@pytest.mark.parametrize("T", [1, 8, 300])
def test_quant_linear_real_shapes(qtype, T):
    g = torch.Generator().manual_seed(43)
    N, K = 4096, 12288
    w = QuantizedTensor(random_blocks(N, K, qtype, 4).to(DEVICE), qtype, (N, K))
    x = randn(T, K, dtype=torch.float16, gen=g)
    assert_close(registry.call_triton("linear", x, w), registry.call_reference("linear", x, w))


@gpu
@needs_gpu
@pytest.mark.parametrize("T", [1, 4, 16])
def test_dense_gemv_real_shapes(T):
    g = torch.Generator().manual_seed(44)
    for N, K in ((12288, 4096), (4096, 12288)):
        x = randn(T, K, dtype=torch.float16, gen=g)
        w = randn(N, K, dtype=torch.float16, gen=g, scale=0.02)
        ref = (x.float() @ w.float().t())
        assert_close(registry.call_triton("linear", x, w), ref, dtype=torch.float16)
