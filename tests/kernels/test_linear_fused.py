"""The decode GEMV with the op that feeds it fused into its loads: silu·mul before the MLP's down
projection, the gated RMSNorm before the linear attention's output projection. Triton against
the composition of the two references, and the fallbacks (quantized weights, prefill sizes)."""

from __future__ import annotations

import pytest
import torch

from g906.engine.weights import QuantizedTensor
from g906.kernels import registry
from g906.kernels.linear import kernel as linear_kernel

from .conftest import DEVICE
from .test_linear import random_blocks
from .util import assert_close, gpu, needs_gpu, randn


def _gated_inputs(T, H, D, dtype, gen, z_stride_extra=3):
    """o [T, H, D]; z a strided [T, H, D] view into a wider projection output (as the model's)."""
    o = randn(T, H, D, dtype=dtype, gen=gen)
    zbig = randn(T, H * D + z_stride_extra, dtype=dtype, gen=gen)
    z = zbig[:, z_stride_extra:].view(T, H, D)
    nw = randn(D, dtype=dtype, gen=gen, scale=0.5) + 1.0
    return o, z, nw


@pytest.mark.parametrize("dtype", [torch.float32, torch.float16])
@pytest.mark.parametrize("T,I,N", [(1, 96, 37), (3, 300, 19), (16, 64, 5)])
def test_silu_mul_linear(dtype, T, I, N):
    g = torch.Generator().manual_seed(T * 1000 + I)
    x = randn(T, 2 * I, dtype=dtype, gen=g)
    w = randn(N, I, dtype=dtype, gen=g, scale=I ** -0.5)
    ref = registry.call_reference("silu_mul_linear", x, w)
    assert_close(registry.call_triton("silu_mul_linear", x, w), ref)
    # the unfused pair computes the same thing
    assert_close(registry.call_reference("linear", registry.call_reference("silu_and_mul", x), w), ref)


@pytest.mark.parametrize("dtype", [torch.float32, torch.float16])
@pytest.mark.parametrize("T,H,D,N", [(1, 4, 16, 23), (5, 3, 32, 9), (16, 2, 8, 33)])
def test_gated_norm_linear(dtype, T, H, D, N):
    g = torch.Generator().manual_seed(T * 100 + H * 10 + D)
    o, z, nw = _gated_inputs(T, H, D, dtype, g)
    w = randn(N, H * D, dtype=dtype, gen=g, scale=(H * D) ** -0.5)
    ref = registry.call_reference("gated_norm_linear", o, z, nw, 1e-6, w)
    out = registry.call_triton("gated_norm_linear", o, z, nw, 1e-6, w)
    assert_close(out, ref)
    unfused = registry.call_reference("gated_rms_norm", o, z, nw, 1e-6).reshape(T, H * D)
    assert_close(registry.call_reference("linear", unfused, w), ref)


def test_gated_norm_linear_blocks_smaller_than_a_head():
    """A K block narrower than the head (the config's BLOCK_K) is widened to whole heads: the
    norm of a head must never be split across blocks."""
    g = torch.Generator().manual_seed(7)
    o, z, nw = _gated_inputs(2, 2, 64, torch.float32, g)
    w = randn(11, 128, gen=g)
    out = linear_kernel.dense_gemv(o.reshape(2, 128), w, BLOCK_K=16,
                                   prologue=("gated_norm", z, nw, 1e-6))
    assert_close(out, registry.call_reference("gated_norm_linear", o, z, nw, 1e-6, w))


def test_fused_ops_fall_back_outside_the_gemv():
    """Quantized weights and prefill-sized T run the two ops separately, with the same result."""
    g = torch.Generator().manual_seed(3)
    qw = QuantizedTensor(random_blocks(8, 256, "Q8_0", 1).to(DEVICE), "Q8_0", (8, 256))
    x = randn(2, 512, gen=g)
    assert_close(registry.call_triton("silu_mul_linear", x, qw),
                 registry.call_reference("silu_mul_linear", x, qw))
    x = randn(20, 128, gen=g)                       # T > 16: silu_and_mul + GEMM
    w = randn(9, 64, gen=g)
    assert_close(registry.call_triton("silu_mul_linear", x, w),
                 registry.call_reference("silu_mul_linear", x, w))
    o, z, nw = _gated_inputs(20, 2, 16, torch.float32, g)
    w = randn(5, 32, gen=g)
    assert_close(registry.call_triton("gated_norm_linear", o, z, nw, 1e-6, w),
                 registry.call_reference("gated_norm_linear", o, z, nw, 1e-6, w))


def test_fusion_only_where_the_recompute_is_cheap():
    """Every program recomputes the fused op over K: 0.8B's projections fuse, 9B's do not (H200
    profile: there the fused GEMV lost more than the separate kernel cost)."""
    def fusable(T, K_in, N):
        x = torch.empty(T, K_in, dtype=torch.float16, device="meta")
        return linear_kernel._gemv_fusable(x, torch.empty(N, K_in, dtype=torch.float16, device="meta"))
    assert fusable(1, 3584, 1024) and fusable(1, 2048, 1024)          # 0.8B down, out_proj
    assert not fusable(1, 12288, 4096) and not fusable(1, 4096, 4096)  # 9B
    assert not fusable(17, 3584, 1024)                                 # prefill


@gpu
@needs_gpu
@pytest.mark.parametrize("T", [1, 8])
def test_fused_real_shapes(T):
    """0.8B (fused): down projection 3584 -> 1024, linear-attention output 16 heads x 128 ->
    1024; and the 9B down projection (the two ops separately)."""
    g = torch.Generator().manual_seed(11)
    for inter, hidden in ((3584, 1024), (12288, 4096)):
        x = randn(T, 2 * inter, dtype=torch.float16, gen=g)
        w = randn(hidden, inter, dtype=torch.float16, gen=g, scale=inter ** -0.5)
        assert_close(registry.call_triton("silu_mul_linear", x, w),
                     registry.call_reference("silu_mul_linear", x, w))
    o, z, nw = _gated_inputs(T, 16, 128, torch.float16, g)
    w = randn(1024, 2048, dtype=torch.float16, gen=g, scale=2048 ** -0.5)
    assert_close(registry.call_triton("gated_norm_linear", o, z, nw, 1e-6, w),
                 registry.call_reference("gated_norm_linear", o, z, nw, 1e-6, w))


@pytest.mark.parametrize("qtype", ["Q8_0", "Q4_K", "Q6_K"])
@pytest.mark.parametrize("T", [1, 3])
def test_silu_mul_packed_gemv(qtype, T):
    """Repacked GGUF weights: the dequant-GEMV applies silu-mul on its activation loads."""
    from g906.kernels.linear import repack

    from .test_linear_packed import qweight

    g = torch.Generator().manual_seed(T + 31)
    w = qweight(6, 512, qtype, 5)
    p = repack.pack(w.data, qtype, w.shape)
    x = randn(T, 1024, gen=g)
    ref = registry.call_reference("silu_mul_linear", x, w)
    assert_close(registry.call_triton("silu_mul_linear", x, p), ref)
    # the tensor-core tile path has no fused form: silu-mul first, same result
    assert_close(linear_kernel.packed_matmul(x, p, silu=True, DOT=True), ref)
