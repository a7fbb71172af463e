"""Routed experts over int4/int8 group-quantized weights (GPTQ / AWQ / compressed-tensors MoE
checkpoints, g906/kernels/moe/int4.py): the Triton routed GEMV (decode) and grouped GEMM (prefill)
against the PyTorch reference, with expert counts and top-k like Qwen3.5-35B-A3B (256 or 64
experts, top-8; the grouped GEMM at 64) at tiny hidden sizes, group sizes 32 / 128 and one
group per row, symmetric and asymmetric, 4 and 8 bits, act order per expert (gate and up with
permutations of their own); the container's dequantization against each expert's
GroupQuantWeight and a float64 per-token loop."""

from __future__ import annotations

import pytest
import torch

from g906.kernels import registry
from g906.kernels.int4.experts import GroupQuantExperts
from g906.kernels.int4.reference import dequantize
from g906.kernels.moe import kernel as moe_kernel
from g906.kernels.moe.reference import moe_experts

from .conftest import DEVICE
from .test_int4 import random_weight
from .test_moe import loop_reference, routing
from .util import assert_close, randn


def experts(E, N, K, gs, *, bits=4, zeros=True, act_order=False, seed=0) -> GroupQuantExperts:
    ws = [random_weight(N, K, gs, bits=bits, zeros=zeros, act_order=act_order, seed=seed * 1000 + e).to("cpu")
          for e in range(E)]
    return GroupQuantExperts.stack(ws).to(DEVICE)


def gate_up(E, inter, H, gs, **kw) -> GroupQuantExperts:
    """[gate; up] stacked as the MoE layer does (gate and up quantized separately)."""
    seed = kw.pop("seed", 0)
    return GroupQuantExperts.cat_rows([experts(E, inter, H, gs, seed=seed, **kw),
                                       experts(E, inter, H, gs, seed=seed + 1, **kw)])


def test_stack_dequantizes_like_each_expert():
    ws = [random_weight(24, 64, 32, zeros=e != 1, act_order=True, seed=e).to("cpu") for e in range(3)]
    st = GroupQuantExperts.stack(ws)
    assert st.zeros is not None and st.perm.shape == (3, 1, 64)
    deq = st.dequantize_experts(torch.tensor([2, 0, 1]))
    for j, e in enumerate([2, 0, 1]):
        torch.testing.assert_close(deq[j], dequantize(ws[e], input_order=True))
    both = GroupQuantExperts.cat_rows([st, GroupQuantExperts.stack(ws[::-1])])
    assert both.perm.shape == (3, 2, 64)            # gate and up permuted differently
    full = both.dequantize_experts(torch.tensor([0]))[0]
    torch.testing.assert_close(full[:24], dequantize(ws[0], input_order=True))
    torch.testing.assert_close(full[24:], dequantize(ws[2], input_order=True))


def test_reference_against_loop():
    E, H, inter, k, T = 16, 64, 32, 4, 5
    gu, dn = gate_up(E, inter, H, 32, act_order=True, seed=1), experts(E, H, inter, 32, act_order=True, seed=3)
    x = randn(T, H, gen=torch.Generator().manual_seed(2))
    ids, w = routing(T, E, k, 3)
    all_e = torch.arange(E)
    want = loop_reference(x.cpu(), gu.dequantize_experts(all_e).cpu(), dn.dequantize_experts(all_e).cpu(),
                          ids.cpu(), w.cpu())
    assert_close(moe_experts(x, gu, dn, ids, w).cpu(), want.float())


CASES = [  # (experts, group size, bits, zero points, act order, tokens)
    (256, 32, 4, False, False, 1),
    (256, 128, 4, True, False, 2),
    (64, 32, 4, True, True, 1),
    (64, -1, 4, True, False, 2),
    (64, 128, 8, False, True, 1),
]


def dims(gs):
    """(hidden, expert features): two groups of 128 in a gate/up row where the case has them."""
    return (256, 128) if gs == 128 else (128, 64)


@pytest.mark.parametrize("E,gs,bits,zeros,act,T", CASES)
def test_routed_gemv(E, gs, bits, zeros, act, T):
    (H, inter), k = dims(gs), 8
    gu = gate_up(E, inter, H, gs, bits=bits, zeros=zeros, act_order=act, seed=4)
    dn = experts(E, H, inter, gs, bits=bits, zeros=zeros, act_order=act, seed=6)
    x = randn(T, H, gen=torch.Generator().manual_seed(7))
    ids, w = routing(T, E, k, 8)
    out = moe_kernel.moe_experts(x, gu, dn, ids, w, BLOCK_N=64)
    assert_close(out, moe_experts(x, gu, dn, ids, w))


def test_registry_takes_int4_experts_fp16():
    E, H, inter, k = 64, 128, 64, 8
    gu = gate_up(E, inter, H, 32, seed=9)
    dn = experts(E, H, inter, 32, seed=11)
    x = randn(2, H, dtype=torch.float16, gen=torch.Generator().manual_seed(12))
    ids, w = routing(2, E, k, 13)
    out = registry.call_triton("moe_experts", x, gu, dn, ids, w)
    assert_close(out, moe_experts(x, gu, dn, ids, w))


@pytest.mark.parametrize("E,gs,bits,zeros,act,dtype", [
    (64, 128, 4, True, False, torch.float16),
    (64, 32, 4, True, True, torch.float32),
    (64, -1, 4, True, False, torch.float32),
    (64, 128, 8, False, True, torch.float16),
])
def test_grouped_gemm(E, gs, bits, zeros, act, dtype):
    (H, inter), k, T = dims(gs), 8, 17
    gu = gate_up(E, inter, H, gs, bits=bits, zeros=zeros, act_order=act, seed=14)
    dn = experts(E, H, inter, gs, bits=bits, zeros=zeros, act_order=act, seed=16)
    x = randn(T, H, dtype=dtype, gen=torch.Generator().manual_seed(18))
    ids, w = routing(T, E, k, 19)
    out = moe_kernel.moe_experts(x, gu, dn, ids, w, BLOCK_N=64, BLOCK_M=16)
    assert_close(out, moe_experts(x, gu, dn, ids, w))


def test_supports_only_kernel_range():
    from g906.kernels.moe.kernel import supports

    x = torch.zeros(1, 64)
    gu = gate_up(4, 16, 64, 32, seed=1)
    dn = experts(4, 64, 16, 16, seed=2)
    assert supports(x, gu, dn, None, None)
    assert not supports(x, gu, experts(4, 64, 48, 24, seed=3), None, None)   # groups of 24 features
    assert not supports(x, (gu, gu), dn, None, None)
