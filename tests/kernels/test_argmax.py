"""Greedy sampling's argmax: Triton (two passes) vs torch.argmax."""

from __future__ import annotations

import pytest
import torch

from g906.kernels import registry

from .conftest import DEVICE
from .util import gpu, needs_gpu, randn


@pytest.mark.parametrize("dtype", [torch.float32, torch.float16])
@pytest.mark.parametrize("programs", [None, 1, 3, 7])
def test_argmax_rows(dtype, programs):
    g = torch.Generator().manual_seed(40)
    T, V = 5, 3001                                   # V not a multiple of the block
    x = randn(T, V + 7, dtype=dtype, gen=g)[:, :V]   # strided rows
    x[1, 17] = x[1, 2900] = 50.0                     # a tie: the first index wins
    x[2, V - 1] = 60.0                               # the last column (masked tail)
    x[3] = float("-inf")
    x[3, 1500] = -1e4
    x[4, :] = 0.0                                    # all equal: index 0
    got = registry.call_triton("argmax", x, block=256, programs=programs)
    want = registry.call_reference("argmax", x)
    assert got.dtype == torch.int64
    assert torch.equal(got, want), (got, want)
    assert got.tolist()[:3] == [int(x[0].float().argmax()), 17, V - 1]


@gpu
@needs_gpu
@pytest.mark.parametrize("T", [1, 8, 64])
def test_argmax_vocab_rows(T):
    g = torch.Generator().manual_seed(41)
    x = randn(T, 248320, gen=g)
    assert torch.equal(registry.call_triton("argmax", x), x.argmax(dim=-1))
