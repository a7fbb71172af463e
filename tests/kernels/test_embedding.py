"""Token embedding over a GGUF-quantized table: the Triton gather-dequant against gguf's own
dequantizer (the ground truth) and the registry's reference."""

from __future__ import annotations

import pytest
import torch

from g906.engine.weights import QuantizedTensor
from g906.kernels import registry

from .conftest import DEVICE
from .test_linear import random_blocks
from .util import gpu, needs_gpu

QTYPES = ["Q8_0", "Q4_0", "Q4_K", "Q5_K", "Q6_K"]


def _gguf_rows(raw, qtype, K, ids):
    from gguf import GGMLQuantizationType
    from gguf.quants import dequantize

    rows = raw[ids.cpu()].numpy()
    return torch.from_numpy(dequantize(rows, GGMLQuantizationType[qtype]).reshape(-1, K).copy())


@pytest.mark.parametrize("qtype", QTYPES)
@pytest.mark.parametrize("dtype", [torch.float32, torch.float16])
def test_embedding_rows(qtype, dtype):
    V, K = 37, 768
    raw = random_blocks(V, K, qtype, 60)
    w = QuantizedTensor(raw.to(DEVICE), qtype, (V, K))
    ids = torch.tensor([5, 0, 36, 5, 17], device=DEVICE)           # repeats, first and last rows
    got = registry.call_triton("embedding", w, ids, dtype)
    want = _gguf_rows(raw, qtype, K, ids).to(dtype)
    assert got.dtype == dtype and got.shape == (5, K)
    # fp32 math as gguf's; a GPU may fuse a multiply-add (one rounding fewer)
    tol = dict(rtol=1e-3, atol=1e-7) if dtype == torch.float16 else dict(rtol=1e-6, atol=1e-9)
    torch.testing.assert_close(got.cpu(), want, **tol)
    torch.testing.assert_close(registry.call_reference("embedding", w, ids, dtype).cpu(), want, **tol)
    assert registry.call_triton("embedding", w, ids[:0], dtype).shape == (0, K)


def test_embedding_range():
    """Tables the kernel does not take (K % 256, types it does not decode) run the reference."""
    from g906.kernels import ops

    ids = torch.tensor([1], device=DEVICE)
    odd = QuantizedTensor(random_blocks(4, 96, "Q8_0", 61).to(DEVICE), "Q8_0", (4, 96))
    op = registry.ops()["embedding"]
    assert not op.supports(odd, ids, torch.float16)
    assert op.supports(QuantizedTensor(random_blocks(4, 256, "Q4_K", 62).to(DEVICE), "Q4_K", (4, 256)),
                       ids, torch.float16)
    assert ops.embedding(odd, ids, torch.float32).shape == (1, 96)


@gpu
@needs_gpu
@pytest.mark.parametrize("qtype", ["Q4_K", "Q6_K", "Q8_0"])
def test_embedding_vocab_table(qtype):
    V, K = 248320, 4096
    g = torch.Generator().manual_seed(63)
    raw = random_blocks(V, K, qtype, 64)
    w = QuantizedTensor(raw.to(DEVICE), qtype, (V, K))
    ids = torch.randint(0, V, (16,), generator=g).to(DEVICE)
    torch.testing.assert_close(registry.call_triton("embedding", w, ids, torch.float16).cpu(),
                               _gguf_rows(raw, qtype, K, ids).half(), rtol=1e-3, atol=1e-7)
