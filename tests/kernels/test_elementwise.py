"""Norms, rotary, SiLU-and-mul, KV-cache store: Triton vs reference."""

from __future__ import annotations

import pytest
import torch

from g906.kernels import registry
from g906.kernels.rotary.reference import make_cos_sin_cache

from .conftest import DEVICE
from .util import assert_close, randn

DTYPES = [torch.float32, torch.float16]


@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("zero_centred", [False, True])
@pytest.mark.parametrize("with_residual", [False, True])
def test_rms_norm(dtype, zero_centred, with_residual):
    g = torch.Generator().manual_seed(1)
    x = randn(5, 77, dtype=dtype, gen=g)
    w = randn(77, dtype=dtype, gen=g, scale=0.3)
    r = randn(5, 77, dtype=dtype, gen=g) if with_residual else None
    kw = dict(residual=r, zero_centred=zero_centred)
    out = registry.call_triton("rms_norm", x, w, 1e-6, **kw)
    ref = registry.call_reference("rms_norm", x, w, 1e-6, **kw)
    if with_residual:
        assert_close(out[1], ref[1])
        assert_close(out[0], ref[0])
    else:
        assert_close(out, ref)


@pytest.mark.parametrize("dtype", DTYPES)
def test_rms_norm_of_a_strided_head_view(dtype):
    """The attention's q: the first half of each head of a [T, H, 2D] projection, normed in
    place (rows of the [T*H, D] view are 2D apart)."""
    g = torch.Generator().manual_seed(4)
    qg = randn(6, 4, 2 * 32, dtype=dtype, gen=g)
    q = qg[..., :32]
    w = randn(32, dtype=dtype, gen=g, scale=0.3)
    got = registry.call_triton("rms_norm", q, w, 1e-6, zero_centred=True)
    assert got.shape == q.shape
    assert_close(got, registry.call_reference("rms_norm", q.contiguous(), w, 1e-6, zero_centred=True))


@pytest.mark.parametrize("dtype", DTYPES)
def test_gated_rms_norm(dtype):
    g = torch.Generator().manual_seed(2)
    x = randn(7, 24, dtype=dtype, gen=g)
    z = randn(7, 24, dtype=dtype, gen=g)
    w = randn(24, dtype=dtype, gen=g)
    assert_close(registry.call_triton("gated_rms_norm", x, z, w, 1e-6),
                 registry.call_reference("gated_rms_norm", x, z, w, 1e-6))


@pytest.mark.parametrize("dtype", DTYPES)
def test_gated_rms_norm_reads_a_strided_gate_in_place(dtype):
    """The GDN's z: a [T, H, D] view of a wider projection output (row stride > H * D)."""
    g = torch.Generator().manual_seed(3)
    T, H, D = 5, 3, 24
    proj = randn(T, 4 * H * D + 7, dtype=dtype, gen=g)
    z = proj[:, 2 * H * D: 3 * H * D].view(T, H, D)
    assert not z.is_contiguous()
    x = randn(T, H, D, dtype=dtype, gen=g)
    w = randn(D, dtype=dtype, gen=g)
    got = registry.call_triton("gated_rms_norm", x, z, w, 1e-6)
    assert got.shape == (T, H, D)
    assert_close(got, registry.call_reference("gated_rms_norm", x, z.contiguous(), w, 1e-6))


@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("rot_dim", [8, 32])
def test_rotary(dtype, rot_dim):
    g = torch.Generator().manual_seed(3)
    T, Hq, Hk, D = 6, 5, 2, 32
    # q, k as views of one fused projection (strided rows), as the model produces them
    qkv = randn(T, (Hq + Hk) * D, dtype=dtype, gen=g)
    cache = make_cos_sin_cache(100, rot_dim, base=10000.0, device=DEVICE)
    pos = torch.tensor([0, 3, 99, 7, 7, 50], dtype=torch.int64, device=DEVICE)
    q1 = qkv[:, : Hq * D].view(T, Hq, D)
    k1 = qkv[:, Hq * D:].view(T, Hk, D)
    q2, k2 = q1.clone(), k1.clone()
    registry.call_triton("rotary_", q1, k1, pos, cache, rot_dim)
    registry.call_reference("rotary_", q2, k2, pos, cache, rot_dim)
    assert_close(q1, q2)
    assert_close(k1, k2)
    if rot_dim < D:  # the pass-through part is bit-identical
        assert torch.equal(q1[..., rot_dim:], q2[..., rot_dim:])


@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("D,rot_dim,zc", [(32, 8, True), (24, 24, False), (256, 64, True)])
def test_qk_norm_rotary(dtype, D, rot_dim, zc):
    """Per-head q/k RMSNorm then rotary in one kernel, q a strided view of [q | gate] heads
    (the gated attention's projection), D not a power of two in one case."""
    g = torch.Generator().manual_seed(D + rot_dim)
    T, Hq, Hk = 5, 3, 2
    qg = randn(T, Hq, 2 * D, dtype=dtype, gen=g)
    q = qg[..., :D]
    k = randn(T, Hk, D, dtype=dtype, gen=g)
    qw = randn(D, dtype=dtype, gen=g, scale=0.3)
    kw = randn(D, dtype=dtype, gen=g, scale=0.3)
    cache = make_cos_sin_cache(100, rot_dim, base=10000.0, device=DEVICE)
    pos = torch.tensor([0, 3, 99, 7, 50], dtype=torch.int64, device=DEVICE)
    args = (q, k, qw, kw, 1e-6, pos, cache, rot_dim)
    got = registry.call_triton("qk_norm_rotary", *args, zero_centred=zc)
    ref = registry.call_reference("qk_norm_rotary", *args, zero_centred=zc)
    for a, b in zip(got, ref):
        assert a.is_contiguous() and a.shape == b.shape
        assert_close(a, b)
    # the same as the three ops one after the other
    qn = registry.call_reference("rms_norm", q, qw, 1e-6, zero_centred=zc).contiguous()
    kn = registry.call_reference("rms_norm", k, kw, 1e-6, zero_centred=zc).contiguous()
    registry.call_reference("rotary_", qn, kn, pos, cache, rot_dim)
    assert_close(got[0], qn)
    assert_close(got[1], kn)


@pytest.mark.parametrize("dtype", DTYPES)
def test_qk_norm_rotary_stores_kv(dtype):
    """With kv_store the same kernel writes the new (normed, rotated) k and v rows into the
    paged caches like store_kv (slot -1 skipped, v a strided view, poisoned caches)."""
    g = torch.Generator().manual_seed(6)
    T, Hq, Hk, D, rot_dim, nb, bs = 5, 4, 2, 24, 8, 3, 4
    q = randn(T, Hq, D, dtype=dtype, gen=g)
    kv = randn(T, 2, Hk, D, dtype=dtype, gen=g)
    k, v = kv[:, 0], kv[:, 1]
    qw = randn(D, dtype=dtype, gen=g, scale=0.3)
    kw = randn(D, dtype=dtype, gen=g, scale=0.3)
    cache = make_cos_sin_cache(64, rot_dim, base=10000.0, device=DEVICE)
    pos = torch.tensor([3, 0, 63, 9, 10], dtype=torch.int64, device=DEVICE)
    slots = torch.tensor([6, -1, 0, 11, 2], dtype=torch.int64, device=DEVICE)
    caches = [torch.full((nb, bs, Hk, D), float("nan"), dtype=dtype, device=DEVICE) for _ in range(4)]
    args = (q, k, qw, kw, 1e-6, pos, cache, rot_dim)
    got = registry.call_triton("qk_norm_rotary", *args, zero_centred=True,
                               kv_store=(v, caches[0], caches[1], slots))
    ref = registry.call_reference("qk_norm_rotary", *args, zero_centred=True)
    registry.call_reference("store_kv", ref[1], v, caches[2], caches[3], slots)
    for a, b in zip(got, ref):
        assert_close(a, b)
    assert torch.equal(caches[0].isnan(), caches[2].isnan())
    assert int((~caches[0].isnan()).sum()) == 4 * Hk * D
    assert_close(caches[0].nan_to_num(), caches[2].nan_to_num())
    assert torch.equal(caches[1].nan_to_num(), caches[3].nan_to_num())
    # the reference path takes kv_store too
    caches[2].fill_(float("nan"))
    registry.call_reference("qk_norm_rotary", *args, zero_centred=True,
                            kv_store=(v, caches[2], caches[3], slots))
    assert_close(caches[0].nan_to_num(), caches[2].nan_to_num())
    assert torch.equal(caches[0].isnan(), caches[2].isnan())


@pytest.mark.parametrize("dtype", DTYPES)
def test_silu_and_mul(dtype):
    g = torch.Generator().manual_seed(4)
    x = randn(3, 2 * 1030, dtype=dtype, gen=g)
    assert_close(registry.call_triton("silu_and_mul", x), registry.call_reference("silu_and_mul", x))


@pytest.mark.parametrize("dtype", DTYPES)
def test_store_kv(dtype):
    g = torch.Generator().manual_seed(5)
    T, H, D, nb, bs = 9, 3, 20, 7, 4
    kv = randn(T, 2, H, D, dtype=dtype, gen=g)
    k, v = kv[:, 0], kv[:, 1]                                     # strided views
    slots = torch.tensor([5, -1, 0, 27, 13, -1, 14, 3, 22], dtype=torch.int64, device=DEVICE)
    caches = [torch.full((nb, bs, H, D), float("nan"), dtype=dtype, device=DEVICE) for _ in range(4)]
    registry.call_triton("store_kv", k, v, caches[0], caches[1], slots)
    registry.call_reference("store_kv", k, v, caches[2], caches[3], slots)
    assert torch.equal(caches[0].isnan(), caches[2].isnan())
    assert torch.equal(caches[0].nan_to_num(), caches[2].nan_to_num())
    assert torch.equal(caches[1].nan_to_num(), caches[3].nan_to_num())
    assert int((~caches[0].isnan()).sum()) == 7 * H * D
