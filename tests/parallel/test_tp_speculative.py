"""Speculative decoding over a TP=2 model (gloo): the MTP block runs whole on rank 0 with the
vocab-parallel embedding and LM head; every rank rolls its linear-attention heads back after a
verify step. Greedy outputs equal those without speculation, on GGUF and HF weights, and with
the prefix cache over a multi-turn workload, and with structured outputs."""

from __future__ import annotations

import pytest

from g906.engine.llm_engine import EngineConfig, LLMEngine
from g906.engine.sampling_params import SamplingParams
from tests.engine.conftest import random_prompt
from tests.engine.gguf_writer import write_gguf
from tests.engine.spec_models import markov_mtp_dir


@pytest.fixture(scope="module")
def sources(tmp_path_factory):
    d = markov_mtp_dir(tmp_path_factory.mktemp("tp-spec"))
    return {"hf": str(d), "gguf": str(write_gguf(d, d / "m.gguf", qtype="F32", mtp_layers=1, tokenizer_dir=d)[0])}


def outputs(loaded, spec):
    eng = LLMEngine(loaded, EngineConfig(max_num_batched_tokens=16, max_model_len=256, num_kv_blocks=64,
                                         speculative=spec))
    prompts = [random_prompt(6, 1), random_prompt(29, 2)]
    for i, p in enumerate(prompts):
        eng.add_request(f"r{i}", p, SamplingParams(temperature=0.0, max_tokens=40, ignore_eos=True))
    out = {"r0": [], "r1": []}
    while eng.has_unfinished_requests():
        for o in eng.step():
            out[o.request_id] += o.new_token_ids
    return [out["r0"], out["r1"]], eng.stats()


@pytest.mark.parametrize("fmt", ["gguf", "hf"])
def test_tp2_speculative_greedy_equals_plain(sources, fmt):
    from g906.engine.parallel import load_model_tp

    loaded = load_model_tp(sources[fmt], tensor_parallel_size=2, dtype="float32", device="cpu", progress=False,
                           keep_mtp=True)
    try:
        ref, _ = outputs(loaded, None)
        for spec in ({"method": "mtp", "num_speculative_tokens": 2},
                     {"method": "ngram", "num_speculative_tokens": 3, "prompt_lookup_min": 1,
                      "prompt_lookup_max": 3}):
            got, st = outputs(loaded, spec)
            assert got == ref, spec
            assert st["spec_num_drafts"] > 0
            if spec["method"] == "mtp":
                assert 0 < st["spec_num_accepted_tokens"] < st["spec_num_draft_tokens"], st
    finally:
        loaded.model.close()


def test_tp2_speculation_with_the_prefix_cache_equals_plain(sources):
    """Every rank restores, rolls back and snapshots the same state slots (a verify step's
    snapshot is replayed by each rank's rollback at the same committed position)."""
    from g906.engine.parallel import load_model_tp
    from tests.engine.prefix_workloads import assert_no_leaks, run_workload

    loaded = load_model_tp(sources["gguf"], tensor_parallel_size=2, dtype="float32", device="cpu", progress=False,
                           keep_mtp=True)
    try:
        want, _, _ = run_workload(loaded, seed=4, on=False, small_pool=True, max_tokens=12)
        got, cached, eng = run_workload(loaded, seed=4, on=True, small_pool=True, max_tokens=12,
                                        speculative={"method": "mtp", "num_speculative_tokens": 2})
        assert got == want
        s = eng.stats()
        assert s["prefix_cache_hit_tokens"] > 0 and s["spec_num_accepted_tokens"] > 0
        assert s["prefix_snapshots_saved"] > 0 and any(cached[f"turn{i}"] for i in range(1, 5))
        assert_no_leaks(eng)
    finally:
        loaded.model.close()


def test_tp2_constrained_speculation_equals_plain(tmp_path_factory):
    """Structured outputs under speculation at TP=2: the masks (drafter's and verify step's) are
    applied on rank 0's gathered logits; outputs equal those without speculation."""
    from g906.engine.parallel import load_model_tp
    from g906.engine.structured import StructuredOutputsParams as S
    from tests.engine.spec_models import MARKOV_EOS

    d = markov_mtp_dir(tmp_path_factory.mktemp("tp-spec-structured"), eos_token_id=MARKOV_EOS)
    loaded = load_model_tp(str(d), tensor_parallel_size=2, dtype="float32", device="cpu", progress=False,
                           keep_mtp=True)

    def run(spec):
        eng = LLMEngine(loaded, EngineConfig(max_num_batched_tokens=16, max_model_len=256, num_kv_blocks=64,
                                             speculative=spec))
        cons = [S(regex="(ab|cd)+[0-9]{3,6}"), S(json={"type": "object", "properties": {"a": {"type": "integer"}},
                                                       "required": ["a"]}, disable_any_whitespace=True)]
        for i, c in enumerate(cons):
            eng.add_request(f"r{i}", random_prompt(7 + 9 * i, 5 + i),
                            SamplingParams(temperature=0.0, max_tokens=24, structured_outputs=c))
        out = {"r0": [], "r1": []}
        while eng.has_unfinished_requests():
            for o in eng.step():
                out[o.request_id] += o.new_token_ids
        return [out["r0"], out["r1"]], eng.stats()

    try:
        ref, _ = run(None)
        got, st = run({"method": "mtp", "num_speculative_tokens": 2})
        assert got == ref
        assert st["spec_num_accepted_tokens"] > 0, st
    finally:
        loaded.model.close()
