"""The whole engine (scheduler, runner, sampler on rank 0) over a TP=2 model (gloo): the same
outputs as TP=1 under batching, chunked prefill, sampling and logprobs."""

from __future__ import annotations

import pytest
import torch

from g906.engine.llm_engine import EngineConfig, LLMEngine
from g906.engine.sampling_params import SamplingParams
from g906.errors import G906Error

SOURCE = "builtin:tiny-qwen35"
GREEDY = dict(temperature=0.0, ignore_eos=True)


def run_all(engine: LLMEngine, prompts, params) -> dict[str, list[int]]:
    for i, (p, sp) in enumerate(zip(prompts, params)):
        engine.add_request(f"r{i}", p, sp)
    out: dict[str, list[int]] = {}
    while engine.has_unfinished_requests():
        for o in engine.step():
            out.setdefault(o.request_id, []).extend(o.new_token_ids)
    return out


def engine_config() -> EngineConfig:
    # a small token budget: prompts are prefilled in chunks, alongside decodes
    return EngineConfig(max_num_seqs=8, max_num_batched_tokens=48, max_model_len=256, num_kv_blocks=64)


@pytest.fixture(scope="module")
def tp_engine():
    from g906.engine.parallel import load_model_tp

    loaded = load_model_tp(SOURCE, tensor_parallel_size=2, device="cpu", progress=False)
    yield LLMEngine(loaded, engine_config())
    # close() is clean (the worker finishes the shutdown command, exit status 0) and idempotent
    (w,) = loaded.model.group.workers
    loaded.model.close()
    loaded.model.close()
    assert w.proc.returncode == 0 and w.last("stopped") is not None
    with pytest.raises(G906Error, match="closed"):
        loaded.model.compute_logits(torch.zeros(1, 64))


def test_engine_outputs_equal_tp1(tp_engine):
    from g906.engine.loader import load_model

    ref = LLMEngine(load_model(SOURCE, device="cpu", progress=False), engine_config())
    prompts = [[(5 * i + 7 * j) % 400 + 1 for j in range(3 + (i * 13) % 70)] for i in range(10)]
    params = [SamplingParams(max_tokens=4 + i % 9, **GREEDY) for i in range(10)]
    params[3] = SamplingParams(temperature=0.8, top_k=20, seed=11, max_tokens=8, ignore_eos=True)
    want = run_all(ref, prompts, params)
    got = run_all(tp_engine, prompts, params)
    assert got == want
    assert tp_engine.cache.blocks.num_used_blocks == 0
    assert tp_engine.describe()["cache"]["num_blocks"] == 64


def test_warm_up_and_logprobs(tp_engine):
    assert tp_engine.warm_up() > 0
    tp_engine.add_request("lp", [1, 2, 3, 4], SamplingParams(max_tokens=3, logprobs=3, **GREEDY))
    outs = []
    while tp_engine.has_unfinished_requests():
        outs += tp_engine.step()
    lps = [lp for o in outs for lp in o.new_logprobs]
    assert len(lps) == 3 and all(len(lp.top) == 3 and lp.logprob <= 0 for lp in lps)


def test_structured_outputs_at_tp2(tp_engine):
    """The grammar's masks are computed on rank 0 and applied to the gathered logits: constrained
    requests beside free ones give the choices and the regex, and the free ones are unchanged."""
    import re

    from g906.engine.structured import StructuredOutputsParams

    tok = tp_engine.tokenizer
    prompts = [tok.encode("pick one"), tok.encode("a number"), [5, 6, 7]]
    params = [SamplingParams(max_tokens=16, temperature=0.0,
                             structured_outputs=StructuredOutputsParams(choice=["alpha", "beta gamma"])),
              SamplingParams(max_tokens=16, temperature=0.9, seed=3,
                             structured_outputs=StructuredOutputsParams(regex=r"[0-9]{3}-[a-z]{2}")),
              SamplingParams(max_tokens=6, **GREEDY)]
    got = run_all(tp_engine, prompts, params)
    assert tok.decode(got["r0"], skip_special_tokens=True) in ("alpha", "beta gamma")
    assert re.fullmatch(r"[0-9]{3}-[a-z]{2}", tok.decode(got["r1"], skip_special_tokens=True))
    assert len(got["r2"]) == 6


def test_beam_search_at_tp2(tp_engine):
    """Forked beams copy the parent's partly filled KV block and its linear-attention state on
    every rank (copy_blocks / copy_states commands): the same beams as at TP=1."""
    from g906.engine.loader import load_model

    ref = LLMEngine(load_model(SOURCE, device="cpu", progress=False), engine_config())
    prompts = [[(3 * j + 1) % 400 + 2 for j in range(21)], [9, 8, 7]]    # 21 tokens: forks mid-block
    params = [SamplingParams(n=3, use_beam_search=True, max_tokens=14, length_penalty=0.7, **GREEDY),
              SamplingParams(max_tokens=10, **GREEDY)]
    want = run_all(ref, prompts, params)
    got = run_all(tp_engine, prompts, params)
    assert got == want and {"r0:0", "r0:1", "r0:2", "r1"} == set(got)
    assert tp_engine.cache.blocks.num_used_blocks == 0 and tp_engine.cache.slots.num_used == 0
