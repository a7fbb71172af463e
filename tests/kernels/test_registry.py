"""Dispatch rules of the kernel registry."""

from __future__ import annotations

import pytest
import torch

from g906.kernels import ops, registry
from g906.kernels.registry import KernelChoiceError


def test_every_op_has_reference_and_kernel():
    names = {"rms_norm", "gated_rms_norm", "rotary_", "silu_and_mul", "store_kv",
             "paged_decode_attention", "prefill_attention", "causal_conv1d_prefill",
             "causal_conv1d_decode", "gated_delta_rule_decode", "gated_delta_rule_prefill", "linear"}
    assert names <= set(registry.ops())
    for name in names:
        op = registry.ops()[name]
        assert callable(op.reference) and op.triton
        assert callable(getattr(ops, name))


def test_cpu_auto_uses_reference(monkeypatch):
    monkeypatch.delenv("TRITON_INTERPRET", raising=False)
    x = torch.randn(2, 8)
    assert registry.choose("rms_norm", x, torch.ones(8), 1e-6) == "reference"
    out = ops.rms_norm(x, torch.ones(8), 1e-6)
    assert torch.allclose(out, x * torch.rsqrt(x.pow(2).mean(-1, keepdim=True) + 1e-6))


def test_forced_reference(monkeypatch):
    monkeypatch.setenv("G906_KERNELS", "reference")
    assert registry.choose("silu_and_mul", torch.randn(2, 4)) == "reference"


def test_forced_triton_on_cpu_needs_interpreter(monkeypatch):
    monkeypatch.setenv("G906_KERNELS", "triton")
    monkeypatch.delenv("TRITON_INTERPRET", raising=False)
    with pytest.raises(KernelChoiceError, match="CPU tensors"):
        registry.choose("silu_and_mul", torch.randn(2, 4))
    monkeypatch.setenv("TRITON_INTERPRET", "1")
    assert registry.choose("silu_and_mul", torch.randn(2, 4)) == "triton"


def test_forced_triton_runs_kernel_through_ops(monkeypatch):
    if not torch.cuda.is_available():
        monkeypatch.setenv("TRITON_INTERPRET", "1")
    monkeypatch.setenv("G906_KERNELS", "triton")
    dev = "cuda" if torch.cuda.is_available() else "cpu"
    x = torch.randn(3, 10, device=dev)
    out = ops.silu_and_mul(x)
    ref = registry.call_reference("silu_and_mul", x)
    assert torch.allclose(out, ref, atol=1e-6)


def test_bad_mode(monkeypatch):
    monkeypatch.setenv("G906_KERNELS", "fast")
    with pytest.raises(KernelChoiceError, match="G906_KERNELS"):
        registry.choose("silu_and_mul", torch.randn(2, 4))


def test_unsupported_call_is_refused_when_forced(monkeypatch):
    monkeypatch.setenv("G906_KERNELS", "triton")
    monkeypatch.setenv("TRITON_INTERPRET", "1")
    x = torch.randn(2, 4, dtype=torch.float64)
    with pytest.raises(KernelChoiceError, match="does not support"):
        registry.choose("silu_and_mul", x)
