"""TP=2 (gloo, two processes) computes what TP=1 computes: fp32 logits within 1e-5 relative
error and identical greedy outputs, for an HF checkpoint and GGUF F32 / Q8_0 files of one tiny
model (GGUF: tiled value heads, so a rank's value heads are not contiguous). One TP engine per
format, shared by the tests of that format."""

from __future__ import annotations

import pytest
import torch

from tests.engine.conftest import TinyRunner, random_prompt, rel_err

TOL = 1e-5


@pytest.fixture(scope="module", params=["hf", "gguf-f32", "gguf-q8_0", "hf-tied-509"])
def pair(request, tp_sources):
    from g906.engine.loader import load_model
    from g906.engine.parallel import load_model_tp

    src = tp_sources[request.param]
    ref = load_model(src, dtype="float32", device="cpu", progress=False)
    tp = load_model_tp(src, tensor_parallel_size=2, dtype="float32", device="cpu", progress=False)
    yield request.param, ref, tp
    tp.model.close()
    assert all(w.proc.poll() is not None for w in tp.model.group.workers)


def prompt(n: int, seed: int, vocab: int) -> list[int]:
    return [t % vocab for t in random_prompt(n, seed)]


def all_logits(runner: TinyRunner, seqs, tokens) -> torch.Tensor:
    """Every position's logits of one prefill step [T, V] (TinyRunner.step keeps the last only)."""
    for s in seqs:
        runner.release(s)
        runner.cache.reset_slots([s])
    ctx, positions, seq_lens = runner._ctx(seqs, [len(t) for t in tokens], True)
    ids = torch.tensor([t for ts in tokens for t in ts], dtype=torch.long)
    hidden = runner.model(ids, positions, ctx)
    for s, n in zip(seqs, seq_lens):
        runner.lens[s] = n
    return runner.model.compute_logits(hidden)


def test_shapes_and_info(pair):
    fmt, ref, tp = pair
    assert tp.info["tensor_parallel_size"] == 2 and tp.info["backend"] == "gloo"
    local = tp.model.config
    assert local.num_attention_heads * 2 == ref.config.num_attention_heads
    assert local.linear_num_value_heads * 2 == ref.config.linear_num_value_heads
    assert tp.config.vocab_size == ref.config.vocab_size
    if fmt == "gguf-q8_0":
        assert tp.info["quantized_tensors"] > 0
    if fmt == "hf-tied-509":                      # rows 0..254 and 255..508 of the tied table
        assert tp.model.inner.lm_head is None
        assert tp.model.inner.model.embed_tokens.weight.shape[0] == 255
    assert tp.info["weight_bytes"] < ref.info["weight_bytes"]


def test_prefill_logits_match(pair):
    _, ref, tp = pair
    v = ref.config.vocab_size
    prompts = [prompt(37, 1, v), prompt(70, 2, v)]
    a = all_logits(TinyRunner(ref.model, max_seqs=2), [0, 1], prompts)
    b = all_logits(TinyRunner(tp.model, max_seqs=2), [0, 1], prompts)
    assert b.shape == a.shape == (107, ref.config.vocab_size)
    assert rel_err(b, a) < TOL


def test_chunked_prefill_and_decode_logits_match(pair):
    _, ref, tp = pair
    r1, r2 = TinyRunner(ref.model, max_seqs=2), TinyRunner(tp.model, max_seqs=2)
    p = prompt(45, 3, ref.config.vocab_size)
    for i in range(0, 45, 16):
        a = r1.step([1], [p[i:i + 16]])
        b = r2.step([1], [p[i:i + 16]])
        assert rel_err(b, a) < TOL
    for _ in range(6):
        tok = int(a[0].argmax())
        a = r1.step([1], [[tok]], is_prefill=False)
        b = r2.step([1], [[tok]], is_prefill=False)
        assert rel_err(b, a) < TOL


def test_greedy_outputs_identical(pair):
    _, ref, tp = pair
    r1, r2 = TinyRunner(ref.model, max_seqs=2), TinyRunner(tp.model, max_seqs=2)
    for seed in (4, 5):
        p = prompt(20 + seed, seed, ref.config.vocab_size)
        assert r2.greedy(0, p, 12) == r1.greedy(0, p, 12)


def test_image_embeddings_and_mrope_positions_travel_to_the_workers(pair):
    """A multimodal step: rank 0's vision embeddings (ctx.mm_embeds at ctx.mm_embed_index) and
    M-RoPE positions (ctx.mrope_positions) reach every rank through the control channel."""
    import dataclasses

    _, ref, tp = pair
    v = ref.config.vocab_size
    tokens = [prompt(30, 7, v)]
    g = torch.Generator().manual_seed(0)
    idx = torch.tensor([3, 4, 5, 6, 11], dtype=torch.long)
    embeds = torch.randn(len(idx), ref.config.hidden_size, generator=g)
    pos = torch.arange(30)
    mrope = torch.stack([pos, pos // 2 + 1, pos // 3 + 2])
    out = []
    for model in (ref.model, tp.model):
        r = TinyRunner(model, max_seqs=1)
        r.cache.reset_slots([0])
        ctx, positions, _ = r._ctx([0], [30], True)
        ctx = dataclasses.replace(ctx, mm_embed_index=idx, mm_embeds=embeds, mrope_positions=mrope)
        hidden = model(torch.tensor(tokens[0]), positions, ctx)
        out.append(model.compute_logits(hidden))
    assert rel_err(out[1], out[0]) < TOL
