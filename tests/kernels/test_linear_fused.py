"""The decode GEMV with the op that feeds it fused into its loads: silu·mul before the MLP's down
projection, the gated RMSNorm before the linear attention's output projection. Triton against
the composition of the two references, and the fallbacks (quantized weights, prefill sizes)."""

from __future__ import annotations

import pytest
import torch

from g906.engine.weights import QuantizedTensor
from g906.kernels import registry
from g906.kernels._triton_util import is_rocm
from g906.kernels.linear import kernel as linear_kernel
from g906.kernels.linear.dense import dense_gemv
from g906.kernels.linear.packed import packed_matmul

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
    out = dense_gemv(o.reshape(2, 128), w, BLOCK_K=16,
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
    assert_close(packed_matmul(x, p, silu=True, DOT=True), ref)
    # ROCm's batched form: blocks of 2 tokens (the activations' [gate | up] rows offset per block)
    x = randn(T + 2, 1024, gen=g)
    assert_close(packed_matmul(x, p, silu=True, H=8, BLOCK_N=2, BLOCK_T=2, WSPLIT=True, CVT=True,
                                             ONE_IMM=True), registry.call_reference("silu_mul_linear", x, w))


# ------------------------------------------------------------------------------------------
# the RMSNorm between two projections, split over their GEMVs (g906/kernels/linear/residual_norm.py)


def _norm_case(T, K, dtype, gen):
    h_prev = randn(T, K, dtype=dtype, gen=gen)          # the residual stream
    nw = randn(K, dtype=dtype, gen=gen, scale=0.3)       # zero-centred: applied as 1 + nw
    return h_prev, nw


def _unfused(x, w_out, residual, nw, w_in, eps):
    """The plain path: projection, RMSNorm with the residual add, next projection."""
    y = registry.call_reference("linear", x, w_out)
    normed, h = registry.call_reference("rms_norm", y, nw, eps, residual=residual, zero_centred=True)
    return h, registry.call_reference("linear", normed, w_in)


@pytest.mark.parametrize("dtype", [torch.float32, torch.float16])
@pytest.mark.parametrize("T,K1,K,N", [(1, 96, 64, 37), (3, 40, 300, 19), (16, 32, 48, 5)])
def test_add_norm_then_rms_of_dense(dtype, T, K1, K, N):
    """Producer GEMV (add_norm) then consumer GEMV (rms_of) = projection, RMSNorm, projection."""
    g = torch.Generator().manual_seed(T * 7 + K)
    x = randn(T, K1, dtype=dtype, gen=g)
    w_out = randn(K, K1, dtype=dtype, gen=g, scale=K1 ** -0.5)
    w_in = randn(N, K, dtype=dtype, gen=g, scale=K ** -0.5)
    residual, nw = _norm_case(T, K, dtype, g)
    h, hn, ss = registry.call_triton("linear", x, w_out, add_norm=(residual, nw, True))
    ref_h, ref_hn, ref_ss = registry.call_reference("linear", x, w_out, add_norm=(residual, nw, True))
    assert_close(h, ref_h)
    assert_close(hn, ref_hn)
    assert ss.shape[1] > 1 and ss.dtype == torch.float32     # one partial sum per program
    assert_close(ss.sum(1, keepdim=True), ref_ss)
    y = registry.call_triton("linear", hn, w_in, rms_of=(ss, 1e-6))
    assert_close(y, registry.call_reference("linear", ref_hn, w_in, rms_of=(ref_ss, 1e-6)))
    un_h, un_y = _unfused(x, w_out, residual, nw, w_in, 1e-6)
    assert_close(h, un_h)
    assert_close(y, un_y)


@pytest.mark.parametrize("qtype", ["Q8_0", "Q4_K", "Q5_K", "Q6_K"])
@pytest.mark.parametrize("T,cfg", [(1, {}), (3, dict(BLOCK_T=2, BLOCK_N=16, H=16)),  # token blocks
                                   (1, dict(SPLIT=2, H=16))])                         # around it
def test_add_norm_then_rms_of_packed(qtype, T, cfg):
    """Packed GEMVs take the split RMSNorm in the kernel (partial sums per program) where one
    program sums a whole row, and around the product with a split K; same result as
    projection, RMSNorm, projection (odd N), and in the silu producer."""
    from g906.kernels.linear import repack

    g = torch.Generator().manual_seed(11)
    K1, K, N = 256, 256, 19
    if "SPLIT" in cfg and qtype != "Q4_K":
        pytest.skip("the path around the product: one type is enough")
    w_out = QuantizedTensor(random_blocks(K, K1, qtype, 2).to(DEVICE), qtype, (K, K1))
    w_in = QuantizedTensor(random_blocks(N, K, qtype, 3).to(DEVICE), qtype, (N, K))
    p_out, p_in = (repack.pack(w.data, qtype, w.shape) for w in (w_out, w_in))
    x = randn(T, K1, gen=g, scale=K1 ** -0.5)
    residual, nw = _norm_case(T, K, torch.float32, g)
    # (x fp32: the GEMV at every T here, no tensor-core product; ROCm: unmeasured, not taken)
    assert linear_kernel.linear_fuses_norm(x, p_out) == (
        qtype in linear_kernel.SPLIT_NORM_QTYPES and not is_rocm())
    h, hn, ss = packed_matmul(x, p_out, add_norm=(residual, nw, True), **cfg)
    ref_h, ref_hn, ref_ss = registry.call_reference("linear", x, w_out, add_norm=(residual, nw, True))
    assert_close(h, ref_h)
    assert_close(hn, ref_hn)
    assert (ss.shape[1] > 1) == ("SPLIT" not in cfg)           # in the kernel: one per program
    assert_close(ss.sum(1, keepdim=True), ref_ss)
    y = packed_matmul(hn, p_in, rms_of=(ss, 1e-6), **cfg)
    assert_close(y, _unfused(x, w_out, residual, nw, w_in, 1e-6)[1])
    # the silu producer ends the same way
    xs = randn(T, 2 * K1, gen=g)
    got = packed_matmul(xs, p_out, silu=True, add_norm=(residual, nw, False), **cfg)
    _same_add_norm(got, registry.call_reference("silu_mul_linear", xs, w_out, add_norm=(residual, nw, False)))


@pytest.mark.parametrize("types", [("Q5_K", "Q4_K"), ("Q4_K", "Q6_K")])
def test_rms_of_in_the_pair_and_glu_gemvs(types):
    """The consumers of a split RMSNorm in a Q4_K_M decode step: the two-weight launch
    (linear_pair) and the gate/up GEMV with its SwiGLU (linear_glu), against projection after
    a whole RMSNorm."""
    from g906.kernels.linear import repack
    from g906.kernels.linear.packed_config import _pq_pair_configs

    g = torch.Generator().manual_seed(12)
    K = 768
    hn = randn(1, K, gen=g)
    ss = randn(1, 5, gen=g).abs() * K / 5              # partial sums of h * h, 5 programs
    ws = [QuantizedTensor(random_blocks(n, K, qt, 20 + i).to(DEVICE), qt, (n, K))
          for i, (qt, n) in enumerate(zip(types, (13, 6)))]
    pws = [repack.pack(w.data, w.qtype, w.shape) for w in ws]
    normed = registry.call_reference("linear", hn, torch.eye(K, device=DEVICE), rms_of=(ss, 1e-6))
    assert _pq_pair_configs(hn, pws) is not None
    for got, w in zip(registry.call_triton("linear_pair", hn, *pws, rms_of=(ss, 1e-6)), ws):
        assert_close(got, registry.call_reference("linear", normed, w))
    gu = QuantizedTensor(random_blocks(26, K, types[1], 30).to(DEVICE), types[1], (26, K))
    pgu = repack.pack(gu.data, gu.qtype, gu.shape)
    assert_close(registry.call_triton("linear_glu", hn, pgu, rms_of=(ss, 1e-6)),
                 registry.call_reference("linear_glu", normed, gu))


def _same_add_norm(got, ref):
    """(h, hn, partial sums) against the reference's (h, hn, whole sums)."""
    assert_close(got[0], ref[0])
    assert_close(got[1], ref[1])
    assert_close(got[2].sum(1, keepdim=True), ref[2])


def test_producers_with_prologues_end_with_add_norm():
    g = torch.Generator().manual_seed(5)
    T, I, N = 2, 96, 37
    residual, nw = _norm_case(T, N, torch.float32, g)
    x = randn(T, 2 * I, gen=g)
    w = randn(N, I, gen=g, scale=I ** -0.5)
    _same_add_norm(registry.call_triton("silu_mul_linear", x, w, add_norm=(residual, nw, True)),
                   registry.call_reference("silu_mul_linear", x, w, add_norm=(residual, nw, True)))
    o, z, gw = _gated_inputs(T, 4, 16, torch.float32, g)
    w = randn(N, 64, gen=g, scale=0.125)
    args = (o, z, gw, 1e-6, w)
    _same_add_norm(registry.call_triton("gated_norm_linear", *args, add_norm=(residual, nw, False)),
                   registry.call_reference("gated_norm_linear", *args, add_norm=(residual, nw, False)))


def test_add_norm_and_rms_of_outside_the_gemv():
    """Prefill sizes (T > 16) and packed GEMVs split over K compute them around the product."""
    g = torch.Generator().manual_seed(9)
    T, K, N = 20, 64, 24
    x = randn(T, K, gen=g)
    w = randn(N, K, gen=g, scale=0.125)
    residual, nw = _norm_case(T, N, torch.float32, g)
    assert not linear_kernel.linear_fuses_norm(x, w)
    _same_add_norm(registry.call_triton("linear", x, w, add_norm=(residual, nw, True)),
                   registry.call_reference("linear", x, w, add_norm=(residual, nw, True)))
    ss = randn(T, 3, gen=g).abs() * K
    assert_close(registry.call_triton("linear", x, w, rms_of=(ss, 1e-6)),
                 registry.call_reference("linear", x, w, rms_of=(ss, 1e-6)))


@gpu
@needs_gpu
@pytest.mark.parametrize("kind", ["F16", "Q4_K"])
@pytest.mark.parametrize("T", [1, 4])
def test_split_norm_real_shapes(kind, T):
    """9B: the down projection 12288 -> 4096 ends with the add and the norm weight, the gate/up
    projection 4096 -> 24576 applies 1 / rms: against projection, RMSNorm, projection."""
    from g906.kernels.linear import repack

    g = torch.Generator().manual_seed(21)
    I, H = 12288, 4096
    if kind == "F16":
        w_out = randn(H, I, dtype=torch.float16, gen=g, scale=I ** -0.5).to(DEVICE)
        w_in = randn(2 * I, H, dtype=torch.float16, gen=g, scale=H ** -0.5).to(DEVICE)
        p_out, p_in = w_out, w_in
    else:
        w_out = QuantizedTensor(random_blocks(H, I, kind, 4).to(DEVICE), kind, (H, I))
        w_in = QuantizedTensor(random_blocks(2 * I, H, kind, 5).to(DEVICE), kind, (2 * I, H))
        p_out, p_in = repack.prepare(w_out), repack.prepare(w_in)
    x = randn(T, I, dtype=torch.float16, gen=g, scale=0.05)
    residual, nw = _norm_case(T, H, torch.float16, g)
    # Q4_K on CUDA at one token (4 fp16 tokens: the tensor-core product, the norm around it)
    assert linear_kernel.linear_fuses_norm(x, p_out) == (
        kind == "F16" or (T == 1 and not is_rocm()))
    h, hn, ss = registry.call_triton("linear", x, p_out, add_norm=(residual, nw, True))
    y = registry.call_triton("linear", hn, p_in, rms_of=(ss, 1e-6))
    un_h, un_y = _unfused(x, w_out, residual, nw, w_in, 1e-6)
    assert_close(h, un_h)
    assert_close(y, un_y)


def test_rms_of_with_many_partial_sums():
    """More partial sums than the GEMV holds in registers: x is scaled first, same result."""
    g = torch.Generator().manual_seed(13)
    T, K, N = 16, 64, 8
    x = randn(T, K, gen=g)
    w = randn(N, K, gen=g, scale=0.125)
    ss = randn(T, 300, gen=g).abs()
    assert_close(registry.call_triton("linear", x, w, rms_of=(ss, 1e-6)),
                 registry.call_reference("linear", x, w, rms_of=(ss, 1e-6)))


def test_add_norm_with_no_tokens():
    """An empty batch still returns the three outputs (h, hn, partial sums), all empty."""
    g = torch.Generator().manual_seed(17)
    w = randn(8, 16, gen=g)
    x = randn(0, 16, gen=g)
    h, hn, ss = registry.call_triton("linear", x, w, add_norm=(randn(0, 8, gen=g), randn(8, gen=g), True))
    assert h.shape == hn.shape == (0, 8) and ss.shape[0] == 0
