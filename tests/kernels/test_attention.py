"""Paged decode and prefill attention: Triton vs reference."""

from __future__ import annotations

import pytest
import torch

from g906.kernels import registry

from .conftest import DEVICE
from .util import assert_close, fill_sequences, gpu, needs_gpu, paged_cache, randn


def _decode_matches_reference(seed, Hq, Hk, D, bs, seq_lens, dtype, *, blocks=40, gated=True,
                              wide=0, **kw):
    """Sequences of seq_lens in a paged cache of `blocks` blocks (tables `wide` blocks wider
    than they need), q and (gated) a gate: the Triton op, given kw, against the reference."""
    g = torch.Generator().manual_seed(seed)
    kc, vc = paged_cache(blocks, bs, Hk, D, dtype)
    tables = fill_sequences(kc, vc, seq_lens, g)
    if wide:
        tables = torch.cat([tables, torch.zeros(len(seq_lens), wide, dtype=torch.int32, device=DEVICE)], 1)
    q = randn(len(seq_lens), Hq, D, dtype=dtype, gen=g)
    gate = randn(len(seq_lens), Hq, D, dtype=dtype, gen=g) if gated else None
    sl = torch.tensor(seq_lens, dtype=torch.int32, device=DEVICE)
    args = (q, kc, vc, tables, sl, D ** -0.5)
    ref = registry.call_reference("paged_decode_attention", *args, gate=gate)
    assert_close(registry.call_triton("paged_decode_attention", *args, gate=gate, **kw), ref)


def _splits(splits):
    return {} if splits is None else {"num_splits": splits}


@pytest.fixture(params=["default", "dot"])
def decode_path(request, monkeypatch):
    """The device's decode path, and (on the CPU) CUDA's tl.dot path under the interpreter,
    which otherwise runs only on a GPU."""
    if request.param == "dot":
        from g906.kernels.attention import kernel
        monkeypatch.setattr(kernel, "uses_dot", lambda device: True)
    return request.param


@pytest.mark.parametrize("dtype", [torch.float32, torch.float16])
@pytest.mark.parametrize("splits", [None, 1, 3])
@pytest.mark.parametrize("with_gate", [False, True])
def test_paged_decode(dtype, splits, with_gate, decode_path):
    _decode_matches_reference(10, 6, 2, 40, 8, [1, 37, 70], dtype, gated=with_gate, **_splits(splits))


@pytest.mark.parametrize("splits", [None, 2])
def test_paged_decode_many_query_heads_per_kv_head(splits, decode_path):
    """G = 6 (the 27B's), padded to 8 query rows (16 on the tl.dot path): the broadcast path
    takes longer tiles there."""
    _decode_matches_reference(17, 12, 2, 40, 8, [3, 45, 90], torch.float16, **_splits(splits))


@pytest.mark.parametrize("splits", [None, 5, 16])
def test_paged_decode_short_sequences_in_a_wide_table(splits, decode_path):
    """Decode graphs size the block tables for max_model_len: sequences much shorter than the
    table share every split (each divides its own length), empty splits must weigh nothing."""
    _decode_matches_reference(15, 4, 2, 24, 4, [2, 19, 61, 5], torch.float32, wide=48, block_n=16,
                              **_splits(splits))


@pytest.mark.parametrize("tile", [64, 128])
def test_paged_decode_reduce_split_over_head_columns(monkeypatch, tile):
    """The split-combining kernel takes a head's columns in pieces (here 16 or 32 of D = 40,
    the last piece masked): every piece must weigh the same splits."""
    from g906.kernels.attention import kernel
    monkeypatch.setattr(kernel, "REDUCE_TILE", tile)
    _decode_matches_reference(13, 4, 2, 40, 4, [9, 70], torch.float32, blocks=30, block_n=16,
                              num_splits=4)


@pytest.mark.parametrize("dtype", [torch.float32, torch.float16])
@pytest.mark.parametrize("with_gate", [False, True])
def test_prefill_attention(dtype, with_gate):
    g = torch.Generator().manual_seed(11)
    Hq, Hk, D, bs = 4, 2, 32, 8
    q_lens = [5, 1, 19]
    ctx = [0, 7, 12]
    seq_lens = [a + b for a, b in zip(q_lens, ctx)]
    kc, vc = paged_cache(40, bs, Hk, D, dtype)
    tables = fill_sequences(kc, vc, seq_lens, g)
    T = sum(q_lens)
    q = randn(T, Hq, D, dtype=dtype, gen=g)
    gate = randn(T, Hq, D, dtype=dtype, gen=g) if with_gate else None
    cu = torch.tensor([0, 5, 6, 25], dtype=torch.int32, device=DEVICE)
    sl = torch.tensor(seq_lens, dtype=torch.int32, device=DEVICE)
    args = (q, kc, vc, tables, cu, sl, D ** -0.5)
    out = registry.call_triton("prefill_attention", *args, gate=gate)
    ref = registry.call_reference("prefill_attention", *args, gate=gate)
    assert_close(out, ref)


def test_decode_equals_prefill_of_one_token():
    g = torch.Generator().manual_seed(12)
    Hq, Hk, D, bs = 4, 1, 16, 4
    kc, vc = paged_cache(12, bs, Hk, D, torch.float32)
    tables = fill_sequences(kc, vc, [13, 6], g)
    q = randn(2, Hq, D, gen=g)
    sl = torch.tensor([13, 6], dtype=torch.int32, device=DEVICE)
    cu = torch.tensor([0, 1, 2], dtype=torch.int32, device=DEVICE)
    a = registry.call_triton("paged_decode_attention", q, kc, vc, tables, sl, 0.25)
    b = registry.call_triton("prefill_attention", q, kc, vc, tables, cu, sl, 0.25)
    assert_close(a, b)


def _decode_matches_reference_at_real_shape(B, ctx, Hq, seed, stagger):
    """A full-attention layer of 4 KV heads of 256 (the 9B's with Hq = 16), its B sequences
    `stagger` tokens apart below ctx in a shuffled cache: the Triton op against the reference."""
    g = torch.Generator().manual_seed(seed)
    Hk, D, bs = 4, 256, 16
    nblk = ctx // bs
    kc = randn(B * nblk + 1, bs, Hk, D, dtype=torch.float16, gen=g)
    vc = randn(B * nblk + 1, bs, Hk, D, dtype=torch.float16, gen=g)
    tables = torch.randperm(B * nblk + 1, generator=g)[: B * nblk].view(B, nblk).to(torch.int32).to(DEVICE)
    sl = torch.tensor([ctx - stagger * b for b in range(B)], dtype=torch.int32, device=DEVICE)
    q = randn(B, Hq, D, dtype=torch.float16, gen=g)
    gate = randn(B, Hq, D, dtype=torch.float16, gen=g)
    out = registry.call_triton("paged_decode_attention", q, kc, vc, tables, sl, D ** -0.5, gate=gate)
    ref = registry.call_reference("paged_decode_attention", q, kc, vc, tables, sl, D ** -0.5, gate=gate)
    assert_close(out, ref)


@gpu
@needs_gpu
@pytest.mark.parametrize("ctx", [1024, 8192, 32768])
@pytest.mark.parametrize("B", [1, 8])
def test_paged_decode_real_shapes(ctx, B):
    _decode_matches_reference_at_real_shape(B, ctx, 16, seed=13, stagger=3)    # Qwen3.5-9B


@gpu
@needs_gpu
@pytest.mark.parametrize("Hq", [16, 24])      # the 9B's and the 27B's query heads over 4 KV heads
@pytest.mark.parametrize("B,ctx", [(1, 32768), (8, 8192)])
def test_paged_decode_broadcast_path_real_shapes(monkeypatch, Hq, B, ctx):
    """ROCm's decode path (no tl.dot: an online softmax per position slot) at real shapes, run
    on whatever GPU this is; its ROCm-only compiler options are left out on CUDA."""
    from g906.kernels.attention import kernel
    monkeypatch.setattr(kernel, "is_rocm", lambda: True)
    monkeypatch.setattr(kernel, "decode_launch_options", lambda *a: {})
    q = torch.zeros(B, Hq, 256, dtype=torch.float16, device=DEVICE)
    tables = torch.zeros(B, ctx // 16, dtype=torch.int32, device=DEVICE)
    k_cache = torch.zeros(1, 16, 4, 256, dtype=torch.float16, device=DEVICE)
    assert not kernel._decode_config(q, k_cache, tables, 4, None)[4]       # the broadcast path
    _decode_matches_reference_at_real_shape(B, ctx, Hq, seed=16, stagger=5)


@gpu
@needs_gpu
def test_prefill_attention_real_shapes():
    g = torch.Generator().manual_seed(14)
    Hq, Hk, D, bs = 16, 4, 256, 16
    q_lens, ctx = [700, 33, 1024], [0, 500, 2048]
    seq_lens = [a + b for a, b in zip(q_lens, ctx)]
    nblk = [(n + bs - 1) // bs for n in seq_lens]
    total = sum(nblk)
    kc = randn(total, bs, Hk, D, dtype=torch.float16, gen=g)
    vc = randn(total, bs, Hk, D, dtype=torch.float16, gen=g)
    perm = torch.randperm(total, generator=g)
    tables = torch.zeros(3, max(nblk), dtype=torch.int32)
    o = 0
    for b, n in enumerate(nblk):
        tables[b, :n] = perm[o:o + n]
        o += n
    T = sum(q_lens)
    q = randn(T, Hq, D, dtype=torch.float16, gen=g)
    gate = randn(T, Hq, D, dtype=torch.float16, gen=g)
    cu = torch.tensor([0, 700, 733, T], dtype=torch.int32, device=DEVICE)
    sl = torch.tensor(seq_lens, dtype=torch.int32, device=DEVICE)
    args = (q, kc, vc, tables.to(DEVICE), cu, sl, D ** -0.5)
    assert_close(registry.call_triton("prefill_attention", *args, gate=gate),
                 registry.call_reference("prefill_attention", *args, gate=gate))
