"""Routed experts (g906.kernels.moe): the Triton routed GEMV (decode) and grouped GEMM (prefill)
against the PyTorch reference, with expert counts and top-k like Qwen3.5-35B-A3B (256 experts,
top-8) at tiny hidden sizes; the reference against a per-token loop and against gguf.quants."""

from __future__ import annotations

import numpy as np
import pytest
import torch

from g906.engine.weights import QuantizedExperts
from g906.kernels import registry
from g906.kernels.moe import kernel as moe_kernel
from g906.kernels.moe.reference import dequantize_experts, moe_experts, route
from g906.kernels.moe.sort import sort_by_expert

from .conftest import DEVICE
from .test_linear import random_blocks
from .util import assert_close, randn

FUSED = ["Q8_0", "Q4_0", "Q4_K", "Q5_K", "Q6_K"]


def quant_experts(E, N, K, qtype, seed):
    return QuantizedExperts(random_blocks(E * N, K, qtype, seed).reshape(E, N, -1).to(DEVICE), qtype, (E, N, K))


def routing(T, E, k, seed):
    g = torch.Generator().manual_seed(seed)
    w, ids = route(torch.randn(T, E, generator=g) * 3, k, True)
    return ids.to(DEVICE), w.to(DEVICE)


def loop_reference(x, gu, dn, ids, w):
    """Token by token, expert by expert, float64: what the MoE block computes."""
    inter = gu.shape[1] // 2
    out = torch.zeros(x.shape, dtype=torch.float64)
    for t in range(x.shape[0]):
        for j in range(ids.shape[1]):
            e = int(ids[t, j])
            h = gu[e].double() @ x[t].double()
            h = torch.nn.functional.silu(h[:inter]) * h[inter:]
            out[t] += float(w[t, j]) * (dn[e].double() @ h)
    return out


def test_route_matches_transformers_router():
    g = torch.Generator().manual_seed(3)
    logits = torch.randn(7, 256, generator=g)
    w, ids = route(logits, 8, True)
    probs = torch.softmax(logits, -1)
    top, top_ids = torch.topk(probs, 8, -1)
    assert torch.equal(ids.long(), top_ids)
    torch.testing.assert_close(w, top / top.sum(-1, keepdim=True))
    w2, _ = route(logits, 8, False)
    torch.testing.assert_close(w2, top)


def test_reference_against_loop():
    g = torch.Generator().manual_seed(4)
    E, H, inter, T, k = 16, 24, 12, 5, 4
    x = torch.randn(T, H, generator=g)
    gu = torch.randn(E, 2 * inter, H, generator=g) / H ** 0.5
    dn = torch.randn(E, H, inter, generator=g) / inter ** 0.5
    ids, w = routing(T, E, k, 5)
    out = moe_experts(x, gu, dn, ids.cpu(), w.cpu())
    torch.testing.assert_close(out.double(), loop_reference(x, gu, dn, ids, w), rtol=1e-5, atol=1e-5)
    # gate and up given apart (two storage types) compute the same
    out2 = moe_experts(x, (gu[:, :inter], gu[:, inter:]), dn, ids.cpu(), w.cpu())
    torch.testing.assert_close(out2, out)


@pytest.mark.parametrize("qtype", ["Q8_0", "Q4_K", "Q6_K", "IQ4_XS", "Q3_K", "Q2_K", "Q5_0"])
def test_reference_dequantizes_chosen_experts_like_gguf(qtype):
    import gguf

    E, N, K = 6, 4, 256
    w = QuantizedExperts(random_blocks(E * N, K, qtype, 7).reshape(E, N, -1), qtype, (E, N, K))
    ids = torch.tensor([4, 1])
    got = dequantize_experts(w, ids)
    qt = gguf.GGMLQuantizationType[qtype]
    for i, e in enumerate(ids.tolist()):
        want = gguf.quants.dequantize(w.data[e].numpy(), qt)
        np.testing.assert_array_equal(got[i].numpy(), want.astype(np.float32))


def test_sort_by_expert_groups_pairs():
    ids = torch.tensor([[3, 1], [1, 0], [3, 3]], dtype=torch.int32)
    pairs, tiles = sort_by_expert(ids, 5, 2)
    # 6 pairs in tiles of 2 over 5 experts: at most 3 + 5 tiles; the unused ones are -1
    assert tiles.tolist() == [0, 1, 3, 3, -1, -1, -1, -1]
    n = ids.numel()
    assert pairs.tolist()[:8] == [3, n, 1, 2, 0, 4, 5, n] and set(pairs.tolist()[8:]) == {n}


@pytest.mark.skipif(not torch.cuda.is_available(), reason="CUDA graph capture needs a GPU")
def test_sort_by_expert_is_captured_by_a_cuda_graph():
    """The prefill graphs capture the grouped GEMM's sort: nothing in it may read back to the
    host (as torch.bincount does, to size its output), or the MoE model's prefill runs eager."""
    ids = torch.randint(0, 64, (96, 8), device="cuda", dtype=torch.int32)
    want = sort_by_expert(ids, 64, 16)
    torch.cuda.synchronize()
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        got = sort_by_expert(ids, 64, 16)
    graph.replay()
    torch.cuda.synchronize()
    assert torch.equal(got[0], want[0]) and torch.equal(got[1], want[1])


@pytest.mark.parametrize("T", [1, 3])
@pytest.mark.parametrize("dtype", [torch.float32, torch.float16])
def test_routed_gemv_dense(T, dtype):
    g = torch.Generator().manual_seed(8)
    E, H, inter, k = 256, 72, 40, 8
    x = randn(T, H, dtype=dtype, gen=g)
    gu = randn(E, 2 * inter, H, dtype=dtype, gen=g, scale=H ** -0.5)
    dn = randn(E, H, inter, dtype=dtype, gen=g, scale=inter ** -0.5)
    ids, w = routing(T, E, k, 9)
    out = registry.call_triton("moe_experts", x, gu, dn, ids, w)
    assert_close(out, registry.call_reference("moe_experts", x, gu, dn, ids, w))


@pytest.mark.parametrize("qtype", FUSED)
def test_routed_gemv_quant(qtype):
    E, H, inter, k, T = 256, 256, 256, 8, 1
    gu = quant_experts(E, 2 * inter, H, qtype, 10)
    dn = quant_experts(E, H, inter, "Q6_K" if qtype == "Q4_K" else qtype, 11)  # a mix, as in UD files
    x = randn(T, H, gen=torch.Generator().manual_seed(12))
    ids, w = routing(T, E, k, 13)
    out = moe_kernel.moe_experts(x, gu, dn, ids, w, BLOCK_N=64)
    assert_close(out, moe_experts(x, gu, dn, ids, w))


@pytest.mark.parametrize("dtype", [torch.float32, torch.float16])
def test_grouped_gemm_dense(dtype):
    g = torch.Generator().manual_seed(14)
    E, H, inter, k, T = 16, 48, 40, 8, 17
    x = randn(T, H, dtype=dtype, gen=g)
    gu = randn(E, 2 * inter, H, dtype=dtype, gen=g, scale=H ** -0.5)
    dn = randn(E, H, inter, dtype=dtype, gen=g, scale=inter ** -0.5)
    ids, w = routing(T, E, k, 15)
    out = moe_kernel.moe_experts(x, gu, dn, ids, w, BLOCK_N=32)
    assert_close(out, moe_experts(x, gu, dn, ids, w))


@pytest.mark.parametrize("qtype, k32", [(q, True) for q in FUSED] + [("Q4_K", False), ("Q8_0", False)])
def test_grouped_gemm_quant(qtype, k32):
    """Each 256-value step's products as ROCm and the interpreter take them (four dots of 32
    columns: K32) and as CUDA does (one of 128)."""
    E, H, inter, k, T = 12, 256, 256, 8, 17
    gu = quant_experts(E, 2 * inter, H, qtype, 16)
    dn = quant_experts(E, H, inter, qtype, 17)
    x = randn(T, H, gen=torch.Generator().manual_seed(18))
    ids, w = routing(T, E, k, 19)
    out = moe_kernel.moe_experts(x, gu, dn, ids, w, BLOCK_N=128, BLOCK_M=16, K32=k32)
    assert_close(out, moe_experts(x, gu, dn, ids, w))


def test_registry_takes_supported_calls_only():
    from g906.kernels.moe.kernel import supports

    x = torch.zeros(1, 256)
    gu = quant_experts(4, 8, 256, "Q4_K", 1)
    assert supports(x, gu, gu, None, None)
    assert not supports(x, quant_experts(4, 8, 256, "IQ4_XS", 1), gu, None, None)
    assert not supports(x, (gu, gu), gu, None, None)
    assert not supports(x.half(), torch.zeros(4, 8, 256), torch.zeros(4, 256, 4), None, None)
