"""Group-quantized (GPTQ / AWQ / compressed-tensors) dequant-GEMV and GEMM: Triton vs the torch
reference, for group sizes 32 / 64 / 128 and one group per row (-1), with and without zero
points and act-order, 4 and 8 bits, decode (T <= 16) and prefill (tl.dot) shapes."""

from __future__ import annotations

import pytest
import torch

from g906.kernels import registry
from g906.kernels.int4.reference import dequantize, pack_rows, unpack_rows
from g906.kernels.int4.weight import GroupQuantWeight

from .conftest import DEVICE
from .util import assert_close, randn


def random_weight(N, K, group_size, *, bits=4, zeros=True, act_order=False, seed=0):
    g = torch.Generator().manual_seed(seed)
    gs = K if group_size == -1 else group_size
    G = -(-K // gs)
    q = torch.randint(0, 1 << bits, (N, K), generator=g)
    scales = (torch.rand(N, G, generator=g) * 0.02 + 0.005).half()
    z = torch.randint(0, 1 << bits, (N, G), generator=g).to(torch.uint8) if zeros else None
    perm = torch.randperm(K, generator=g) if act_order else None
    w = GroupQuantWeight(pack_rows(q, bits), scales, z, bits, gs, (N, K), perm)
    return w.to(DEVICE)


def test_pack_round_trip():
    q = torch.randint(0, 16, (3, 64))
    assert torch.equal(unpack_rows(pack_rows(q, 4), 4), q)
    q8 = torch.randint(0, 256, (3, 32))
    assert torch.equal(unpack_rows(pack_rows(q8, 8), 8), q8)


def test_reference_is_the_formula():
    w = random_weight(5, 64, 32, zeros=True, seed=1)
    q = unpack_rows(w.qweight, 4).float()
    s = w.scales.float().repeat_interleave(32, 1)
    z = w.zeros.float().repeat_interleave(32, 1)
    assert torch.equal(dequantize(w), (q - z) * s)
    sym = random_weight(5, 64, 32, zeros=False, seed=1)
    assert torch.equal(dequantize(sym), (unpack_rows(sym.qweight, 4).float() - 8) * s)


def test_act_order_reference_permutes_the_input():
    w = random_weight(6, 64, 32, act_order=True, seed=2)
    x = torch.randn(3, 64).to(DEVICE)
    want = x @ dequantize(w, input_order=True).t()
    got = registry.call_reference("group_quant_matmul", x, w)
    assert_close(got, want, tol=1e-5)


CASES = [  # (group size, zeros, act order, bits)
    (32, True, False, 4), (64, False, False, 4), (128, True, True, 4), (-1, False, False, 4),
    (-1, True, True, 4), (32, False, True, 4), (64, True, False, 8), (-1, False, False, 8),
]


@pytest.mark.parametrize("gs,zeros,act,bits", CASES)
@pytest.mark.parametrize("T", [1, 5, 20])
def test_kernel_matches_reference(gs, zeros, act, bits, T):
    K = 256 if gs != 128 else 384          # 384: three groups of 128, K-loop steps of 64
    N = 37                                  # a row tail
    w = random_weight(N, K, gs, bits=bits, zeros=zeros, act_order=act, seed=T + gs)
    dtype = torch.float16 if T == 5 else torch.float32
    x = randn(T, K, dtype=dtype, gen=torch.Generator().manual_seed(T))
    out = registry.call_triton("group_quant_matmul", x, w)
    ref = registry.call_reference("group_quant_matmul", x, w)
    assert_close(out, ref, tol=2e-3 if dtype == torch.float16 else 1e-5)


@pytest.mark.parametrize("gs,zeros,act,bits", CASES)
def test_dequantized_rows_match_the_reference(gs, zeros, act, bits):
    from g906.kernels.int4.kernel import dequantize_rows

    K = 256 if gs != 128 else 384
    w = random_weight(37, K, gs, bits=bits, zeros=zeros, act_order=act, seed=gs + bits)
    ref = dequantize(w)                               # the weight's column order, as the kernel's
    assert torch.equal(dequantize_rows(w, torch.float32), ref)
    assert torch.equal(dequantize_rows(w, torch.float16, (5, 30)), ref[5:30].half())


@pytest.mark.parametrize("dtype", [torch.float16, torch.float32])
def test_prefill_through_the_dense_weights(dtype, monkeypatch):
    """The GPU's prefill path (dense weights, then the vendor GEMM), in one row block and in
    several (a small block size forced)."""
    from g906.kernels import _triton_util
    from g906.kernels.int4 import kernel

    w = random_weight(70, 256, 64, zeros=True, act_order=True, seed=9)
    x = randn(20, 256, dtype=dtype, gen=torch.Generator().manual_seed(3))
    ref = registry.call_reference("group_quant_matmul", x, w)
    tol = 2e-3 if dtype == torch.float16 else 1e-5
    assert_close(kernel.group_quant_matmul(x, w, dense=True), ref, tol=tol)
    monkeypatch.setattr(_triton_util, "DEQUANT_CHUNK", 32 * 256)
    monkeypatch.setattr(_triton_util, "DEQUANT_ROWS", 16)          # row blocks of 32: three, the last short
    assert_close(kernel.group_quant_matmul(x, w, dense=True), ref, tol=tol)


def test_per_channel_tail_and_linear_dispatch(monkeypatch):
    """K not a multiple of the loop step (one group per row); ops.linear routes the weight to
    the same kernel."""
    from g906.kernels import ops

    w = random_weight(9, 40, -1, zeros=True, seed=5)
    x = randn(2, 40, gen=torch.Generator().manual_seed(1))
    ref = registry.call_reference("group_quant_matmul", x, w)
    assert_close(registry.call_triton("group_quant_matmul", x, w), ref, tol=1e-5)
    monkeypatch.setenv("G906_KERNELS", "triton")
    assert_close(ops.linear(x, w), ref, tol=1e-5)
