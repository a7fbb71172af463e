"""The prefix cache and speculative decoding together (g906/engine/prefix_cache.py,
g906/engine/spec): greedy outputs with speculation (MTP and n-gram) and the cache on equal those
with the cache off and those of plain greedy decoding, token for token, over the multi-turn and
shared-prefix workloads (later turns resume from the cache), with evictions forced by a small
pool, on HF and GGUF weights with an MTP block. Snapshots taken in verify steps hold committed
positions only: every snapshot the pool holds equals the state a plain prefill computes there."""

from __future__ import annotations

import pytest
import torch

from g906.engine.llm_engine import EngineConfig, LLMEngine
from g906.engine.loader import load_model
from g906.engine.sampling_params import SamplingParams

from .gguf_writer import write_gguf
from .prefix_workloads import assert_no_leaks, run_workload
from .spec_models import markov_mtp_dir

pytestmark = pytest.mark.usefixtures("torch_one_thread")

MTP = {"method": "mtp", "num_speculative_tokens": 3}
NGRAM = {"method": "ngram", "num_speculative_tokens": 3, "prompt_lookup_min": 1, "prompt_lookup_max": 3}


@pytest.fixture(scope="module")
def markov_dir(tmp_path_factory):
    return markov_mtp_dir(tmp_path_factory.mktemp("prefix-spec-markov"))


@pytest.fixture(scope="module")
def loaded(markov_dir, tmp_path_factory):
    gguf = write_gguf(markov_dir, tmp_path_factory.mktemp("prefix-spec-gguf") / "markov.gguf", qtype="F32",
                      mtp_layers=1, tokenizer_dir=markov_dir)[0]
    kw = dict(dtype="float32", device="cpu", progress=False, keep_mtp=True)
    return {"hf": load_model(str(markov_dir), **kw), "gguf": load_model(str(gguf), **kw)}


@pytest.mark.parametrize("fmt", ["hf", "gguf"])
@pytest.mark.parametrize("small", [False, True], ids=["roomy", "evicting"])
def test_speculation_with_the_cache_equals_plain_greedy(loaded, fmt, small):
    lm = loaded[fmt]
    seed = 7 if small else 8
    plain, _, _ = run_workload(lm, seed=seed, on=False, small_pool=small, max_tokens=12)
    for spec in (MTP, NGRAM):
        off, _, eng_off = run_workload(lm, seed=seed, on=False, small_pool=small, max_tokens=12, speculative=spec)
        on, cached, eng = run_workload(lm, seed=seed, on=True, small_pool=small, max_tokens=12, speculative=spec)
        assert off == plain, f"{fmt} {spec['method']}: speculation without the cache differs from plain greedy"
        assert on == plain, f"{fmt} {spec['method']}: speculation with the cache differs from plain greedy"
        s = eng.stats()
        assert s["spec_num_accepted_tokens"] > 0                       # drafts were verified and taken
        assert any(cached[f"turn{i}"] for i in range(1, 5))            # later turns resume
        assert s["prefix_cache_hit_tokens"] > 0 and sum(cached.values()) == s["prefix_cache_hit_tokens"]
        assert s["prompt_tokens"] < eng_off.stats()["prompt_tokens"]   # less was prefilled
        if small:
            assert s["prefix_cache_block_evictions"] > 0 and s["prefix_snapshot_evictions"] > 0
        assert_no_leaks(eng)
        assert_no_leaks(eng_off)


def _states(eng: LLMEngine, slot: int) -> list[torch.Tensor]:
    c = eng.runner.cache
    return [c.conv[:, slot].clone(), c.ssm[:, slot].clone()]


@pytest.mark.parametrize("spec", [MTP, NGRAM], ids=["mtp", "ngram"])
def test_verify_step_snapshots_hold_committed_positions(loaded, spec):
    """Every snapshot a speculative run commits (decode tails: taken in verify steps, at a block
    boundary inside the accepted tokens or at their end) equals the linear-attention state of a
    plain prefill of the tokens before its position."""
    lm = loaded["hf"]
    cfg = dict(max_num_seqs=2, max_num_batched_tokens=64, max_model_len=256, block_size=4, num_kv_blocks=64,
               num_prefix_snapshots=32, prefix_state_stride=0)
    eng = LLMEngine(lm, EngineConfig(speculative=spec, **cfg))
    pc = eng.prefix
    taken: list[tuple[int, str, list[torch.Tensor]]] = []
    commit = pc.commit

    def recording(save):
        taken.append((save.position, save.kind, _states(eng, save.slot)))
        commit(save)

    pc.commit = recording
    prompt = list(range(3, 20))
    eng.add_request("a", prompt, SamplingParams(temperature=0.0, ignore_eos=True, max_tokens=30))
    toks = list(prompt)
    while eng.has_unfinished_requests():
        for o in eng.step():
            toks += o.new_token_ids
    assert eng.stats()["spec_num_accepted_tokens"] > 0
    tails = [t for t in taken if t[1] == "tail"]
    assert len(tails) >= 5 and all(p % 4 == 0 and p > len(prompt) for p, _, _ in tails)
    ref = LLMEngine(lm, EngineConfig(enable_prefix_caching=False, **cfg))
    for i, (n, _, got) in enumerate(taken):
        ref.add_request(f"r{i}", toks[:n], SamplingParams(temperature=0.0, max_tokens=2, ignore_eos=True))
        seq = ref.scheduler.waiting[-1]
        ref.step()                                        # one prefill step of all n tokens
        assert seq.num_cached_tokens == n
        want = _states(ref, seq.state_slot)
        k = want[0].shape[-1]
        live = [(n - j) % k for j in range(1, k)]       # the conv ring's last k-1 inputs
        torch.testing.assert_close(got[0][..., live], want[0][..., live], rtol=1e-4, atol=1e-5)
        torch.testing.assert_close(got[1], want[1], rtol=1e-4, atol=1e-5)
        while ref.has_unfinished_requests():
            ref.step()
