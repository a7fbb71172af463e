"""Decode graphs (g906/engine/cuda_graphs.py): batch buckets, padding rows confined to the
scratch block and slot, padded decode == the runner's own eager decode. The graph capture and
replay tests need a GPU (marked gpu); the padding logic runs here on the CPU."""

from __future__ import annotations

import pytest
import torch

from g906.engine.cuda_graphs import (
    DecodeGraphs,
    bucket,
    graph_batch_sizes,
    padded_cache_sizes,
)
from g906.engine.llm_engine import EngineConfig, LLMEngine
from g906.engine.loader import load_model
from g906.engine.sampling_params import SamplingParams
from tests.engine.padded_decode import padded_decode


def test_batch_sizes_and_buckets():
    assert graph_batch_sizes(1) == [1]
    assert graph_batch_sizes(16) == [1, 2, 4, 8, 16]
    assert graph_batch_sizes(48) == [1, 2, 4, 8, 16, 32, 48]
    assert graph_batch_sizes(160) == [1, 2, 4, 8, 16, 32, 64, 96, 128, 160]
    assert graph_batch_sizes(100) == [1, 2, 4, 8, 16, 32, 64, 96, 100]
    sizes = graph_batch_sizes(64)
    assert [bucket(n, sizes) for n in (1, 2, 3, 5, 33, 64, 65)] == [1, 2, 4, 8, 64, 64, None]
    assert padded_cache_sizes(100, 8) == (101, 9, 100, 8)


def _setup(device="cpu", dtype="float32", max_num_seqs=4, use_graphs=False, source="builtin:tiny-qwen35"):
    lm = load_model(source, dtype=dtype, device=device, progress=False)
    eng = LLMEngine(lm, EngineConfig(max_num_seqs=max_num_seqs, num_kv_blocks=24, max_model_len=256,
                                     max_num_batched_tokens=64))
    graphs, cache, sb, ss = padded_decode(eng, lm, max_num_seqs=max_num_seqs, use_graphs=use_graphs)
    r = eng.runner
    r.graphs = None          # the runner's own decode path (tests opt in to `graphs` explicitly)
    return eng, graphs, cache, sb, ss


def _snapshot(cache):
    return [t.clone() for t in (cache.kv, cache.conv, cache.ssm)]


def _restore(cache, snap):
    for t, s in zip((cache.kv, cache.conv, cache.ssm), snap):
        t.copy_(s)


def _compare_steps(eng, graphs, cache, sb, ss, steps, exact=False):
    """Run `steps` decode steps both ways from the same cache state; compare logits and caches."""
    r = eng.runner
    model = r.model
    for _ in range(steps):
        batch = eng.scheduler.schedule()
        assert batch is not None and not batch.is_prefill
        snap = _snapshot(cache)
        ids, pos, ctx = r._context(batch)
        want = model.compute_logits(model.forward(ids, pos, ctx))
        after = _snapshot(cache)
        _restore(cache, snap)
        got, greedy = graphs.run_step(batch.seqs)
        assert got.shape == want.shape
        assert torch.equal(greedy, got.argmax(-1))       # the graphs' own argmax of their logits
        if exact:
            assert torch.equal(got, want)
        else:
            torch.testing.assert_close(got, want, rtol=1e-4, atol=1e-4)
        # real cache memory as the eager step left it; padding only touched the scratch block/slot
        kv, conv, ssm = (cache.kv, cache.conv, cache.ssm)
        torch.testing.assert_close(kv[:, :, :sb], after[0][:, :, :sb], rtol=1e-4, atol=1e-4)
        torch.testing.assert_close(conv[:, :ss], after[1][:, :ss], rtol=1e-4, atol=1e-4)
        torch.testing.assert_close(ssm[:, :ss], after[2][:, :ss], rtol=1e-4, atol=1e-4)
        toks = want.argmax(-1).tolist()
        for seq, t in zip(batch.seqs, toks):
            seq.num_cached_tokens += 1
            seq.append_token(t)


def _prefill(eng, lengths, vocab):
    for i, n in enumerate(lengths):
        eng.add_request(f"r{i}", [(31 * j + 7 * i) % (vocab - 10) + 5 for j in range(n)],
                        SamplingParams(temperature=0, max_tokens=200, ignore_eos=True))
    while any(not s.is_decode for s in eng.scheduler.running) or eng.scheduler.waiting:
        eng.step()


def test_padded_eager_decode_matches_runner_and_spares_real_cache():
    eng, graphs, cache, sb, ss = _setup()
    vocab = eng.model_config.vocab_size
    _prefill(eng, [15, 17, 40], vocab)          # 3 sequences -> bucket 4: one padding row
    # 20 steps: sequences cross KV block boundaries (15 -> 16, 17 -> 32 ...)
    _compare_steps(eng, graphs, cache, sb, ss, steps=20)
    assert graphs.num_eager == 20 and graphs.num_replays == 0
    d = graphs.describe()
    assert d["graphs"] is False


def test_oversized_batch_and_bad_scratch():
    eng, graphs, cache, sb, ss = _setup(max_num_seqs=2)
    with pytest.raises(ValueError, match="exceeds the largest graph batch"):
        graphs.prepare([object()] * 3)
    with pytest.raises(ValueError, match="scratch block"):
        DecodeGraphs(eng.runner.model, cache, block_size=16, max_num_seqs=2, max_model_len=256,
                     scratch_block=cache.num_blocks, scratch_slot=ss)


gpu = pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA/ROCm GPU")


@pytest.mark.gpu
@gpu
def test_graph_replay_matches_padded_eager_on_gpu():
    eng, graphs, cache, sb, ss = _setup(device="cuda", dtype="float16", max_num_seqs=8, use_graphs=True)
    graphs.capture()
    assert sorted(graphs.graphs) == [1, 2, 4, 8]
    _prefill(eng, [15, 17, 40], eng.model_config.vocab_size)
    # same padded shapes, so graph replay and eager compute the same bits
    r = eng.runner
    for _ in range(30):
        batch = eng.scheduler.schedule()
        snap = _snapshot(cache)
        graphs.use_graphs = False
        want = graphs.run(batch.seqs).clone()
        after = _snapshot(cache)
        _restore(cache, snap)
        graphs.use_graphs = True
        got = graphs.run(batch.seqs)
        assert torch.equal(got, want)
        assert torch.equal(cache.kv[:, :, :sb], after[0][:, :, :sb])
        assert torch.equal(cache.ssm[:, :ss], after[2][:, :ss])
        for seq, t in zip(batch.seqs, want.argmax(-1).tolist()):
            seq.num_cached_tokens += 1
            seq.append_token(t)
    assert graphs.num_replays == 30
    del r


# -- through the engine (GPU): graphs vs enforce_eager over 1,000 greedy tokens -----------------

GPU_SHAPE = dict(num_hidden_layers=8)       # the real 0.8B widths and vocab, fewer layers


def _generate(loaded, enforce_eager: bool, prompts, params):
    eng = LLMEngine(loaded, EngineConfig(max_num_seqs=8, max_model_len=1280, max_num_batched_tokens=512,
                                         enforce_eager=enforce_eager))
    graphs = eng.runner.graphs
    assert graphs is not None and graphs.use_graphs == (not enforce_eager)
    for i, (p, sp) in enumerate(zip(prompts, params)):
        eng.add_request(f"r{i}", p, sp)
    out = {f"r{i}": [] for i in range(len(prompts))}
    while eng.has_unfinished_requests():
        for o in eng.step():
            out[o.request_id] += o.new_token_ids
    desc = graphs.describe()
    del eng
    torch.cuda.empty_cache()
    return [out[f"r{i}"] for i in range(len(prompts))], desc


def _assert_greedy_graphs_equal_eager(quant: str, prompt: list[int], n: int) -> None:
    """n greedy tokens of the GPU-shaped model in `quant`, from graphs and eagerly: the same."""
    from g906.bench.synthetic import build_synthetic

    lm = build_synthetic("qwen3.5-0.8b", quant=quant, device="cuda", overrides=GPU_SHAPE)
    sp = SamplingParams(temperature=0, max_tokens=n, ignore_eos=True)
    (g,), dg = _generate(lm, False, [prompt], [sp])
    (e,), de = _generate(lm, True, [prompt], [sp])
    assert dg["replays"] >= n - 1 and de["replays"] == 0
    assert len(g) == n and g == e
    assert len(set(g)) > 1


@pytest.mark.gpu
@gpu
def test_graphs_equal_eager_over_1000_greedy_tokens():
    _assert_greedy_graphs_equal_eager("f16", [(37 * i + 11) % 200000 + 1000 for i in range(100)], 1000)


@pytest.mark.gpu
@gpu
def test_graphs_equal_eager_quantized():
    """Q4_K_M's mix (Q4_K, Q5_K, Q6_K packed GEMVs): in the graphs the GEMVs load their first
    weights before the PDL wait (PRELOAD), eagerly they do not; the sums are the same, in the
    same order, so the greedy tokens must be too."""
    _assert_greedy_graphs_equal_eager("q4_k", [(53 * i + 7) % 200000 + 1000 for i in range(60)], 200)


@pytest.mark.gpu
@gpu
def test_graphs_equal_eager_batched_and_sampled():
    from g906.bench.synthetic import build_synthetic

    lm = build_synthetic("qwen3.5-0.8b", quant="q4_k", device="cuda", overrides=GPU_SHAPE)
    prompts = [[(31 * i + 7 * j) % 200000 + 1000 for i in range(n)] for j, n in enumerate((5, 40, 130))]
    params = [SamplingParams(temperature=0, max_tokens=200, ignore_eos=True),
              SamplingParams(temperature=1.0, top_p=0.9, seed=3, max_tokens=150, ignore_eos=True),
              SamplingParams(temperature=0.7, top_k=50, seed=4, max_tokens=100, ignore_eos=True)]
    g, _ = _generate(lm, False, prompts, params)
    e, _ = _generate(lm, True, prompts, params)
    assert g == e


def test_multimodal_sequences_take_the_runner_path():
    from g906.engine.cuda_graphs import _multimodal
    from g906.engine.sequence import Sequence

    eng, graphs, cache, sb, ss = _setup(max_num_seqs=2)
    s = Sequence("a", [1, 2, 3], SamplingParams())
    assert not _multimodal(s) and graphs.can_run([s]) and graphs.can_run(2) and not graphs.can_run(3)

    class Fake:
        __slots__ = ("mm",)

        def __init__(self):
            self.mm = type("MM", (), {"delta": 3, "positions_for": lambda self, a, b: None})()

    assert _multimodal(Fake()) and not graphs.can_run([s, Fake()])


def test_runner_decodes_through_the_padded_path_on_cpu():
    """The model runner's decode call site (GPU: graphs) driven on the CPU with the padded eager
    path: same greedy tokens as the runner's own decode, for 4 and 3 running sequences."""

    def run(padded: bool, n: int):
        eng, graphs, cache, sb, ss = _setup()
        eng.runner.graphs = graphs if padded else None
        vocab = eng.model_config.vocab_size
        for i in range(n):
            eng.add_request(f"r{i}", [(29 * j + 5 * i) % (vocab - 10) + 5 for j in range(9 + 7 * i)],
                            SamplingParams(temperature=0, max_tokens=24 + 3 * i, ignore_eos=True))
        out = {f"r{i}": [] for i in range(n)}
        while eng.has_unfinished_requests():
            for o in eng.step():
                out[o.request_id] += o.new_token_ids
        return [out[f"r{i}"] for i in range(n)], graphs.num_eager

    for n in (4, 3):
        want, _ = run(False, n)
        got, steps = run(True, n)
        assert steps > 0
        assert got == want


def test_engine_config_enforce_eager_and_cpu_runner():
    lm = load_model("builtin:tiny-qwen35", dtype="float32", device="cpu", progress=False)
    eng = LLMEngine(lm, EngineConfig(max_num_seqs=2, num_kv_blocks=8, max_model_len=64, enforce_eager=True,
                                     enable_prefix_caching=False))
    assert eng.config.enforce_eager and eng.runner.graphs is None      # no graphs on the CPU
    assert eng.runner.cache.num_blocks == 8 and eng.runner.cache.num_state_slots == 2
