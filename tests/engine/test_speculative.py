"""Speculative decoding (g906/engine/spec): greedy outputs equal those without speculation,
token for token, with the MTP block (k = 1, 2, 3) and n-gram lookup, on GGUF (llama.cpp's
conventions, MTP block included) and HF weights, single requests and batches of different
lengths with chunked prefill; verification and the linear-attention rollback under every
acceptance length (an oracle proposer on a fully random model); sampled outputs follow the
target's distribution (chi-square against transformers' probabilities); seeded sampling is
reproducible; the counters move; bad configurations are refused with a clear error."""

from __future__ import annotations

import math

import pytest
import torch

from g906.engine.llm_engine import EngineConfig, LLMEngine
from g906.engine.sampling_params import SamplingParams
from g906.errors import G906Error

from .conftest import random_prompt
from .gguf_writer import write_gguf
from .spec_models import chi2_sf, chi_square, load_mtp, load_random_tiny, markov_mtp_dir, run

pytestmark = pytest.mark.usefixtures("torch_one_thread")

PROMPTS = [random_prompt(5, 1), random_prompt(23, 2), random_prompt(40, 3)]
GREEDY = dict(temperature=0.0, max_tokens=24, ignore_eos=True)


@pytest.fixture(scope="module")
def markov_dir(tmp_path_factory):
    return markov_mtp_dir(tmp_path_factory.mktemp("spec-markov"))


@pytest.fixture(scope="module")
def markov_gguf(markov_dir, tmp_path_factory):
    d = tmp_path_factory.mktemp("spec-gguf")
    return write_gguf(markov_dir, d / "markov.gguf", qtype="F32", mtp_layers=1, tokenizer_dir=markov_dir)[0]


@pytest.fixture(scope="module")
def loaded_hf(markov_dir):
    return load_mtp(markov_dir)


@pytest.fixture(scope="module")
def loaded_gguf(markov_gguf):
    return load_mtp(markov_gguf)


MTP = [{"method": "mtp", "num_speculative_tokens": k} for k in (1, 2, 3)]
NGRAM = {"method": "ngram", "num_speculative_tokens": 3, "prompt_lookup_min": 1, "prompt_lookup_max": 3}


@pytest.mark.parametrize("fmt", ["gguf", "hf"])
def test_greedy_equals_no_speculation(fmt, loaded_hf, loaded_gguf):
    loaded = loaded_gguf if fmt == "gguf" else loaded_hf
    sp = SamplingParams(**GREEDY)
    ref, _ = run(loaded, PROMPTS, sp)
    assert all(len(r) == 24 for r in ref)
    for spec in MTP + [NGRAM]:
        got, eng = run(loaded, PROMPTS, sp, spec)
        assert got == ref, spec
        st = eng.stats()
        assert st["spec_num_drafts"] > 0 and st["spec_num_draft_tokens"] >= st["spec_num_drafts"], spec
        if spec["method"] == "mtp":
            # the block predicts well here: drafts are accepted, not all of them
            assert 0 < st["spec_num_accepted_tokens"] < st["spec_num_draft_tokens"], (spec, st)
            assert st["spec_accepted_per_pos"][0] == max(st["spec_accepted_per_pos"])
    # a single request (no batch) gives the same tokens
    one, _ = run(loaded, PROMPTS[1:2], sp, MTP[2])
    assert one == ref[1:2]


def test_penalties_and_mixed_requests(loaded_gguf):
    """Penalties see the drafts before each position as output; requests that cannot speculate
    (logprobs) ride along in verify steps with their plain tokens and logprobs."""
    pen = SamplingParams(temperature=0.0, max_tokens=20, ignore_eos=True, presence_penalty=0.7,
                         frequency_penalty=0.3, repetition_penalty=1.2)
    lp = SamplingParams(temperature=0.0, max_tokens=20, ignore_eos=True, logprobs=2)
    params = [pen, lp, SamplingParams(**GREEDY)]
    ref, _ = run(loaded_gguf, PROMPTS, params)
    got, eng = run(loaded_gguf, PROMPTS, params, MTP[1])
    assert got == ref
    assert eng.stats()["spec_num_accepted_tokens"] > 0


def test_stops_inside_accepted_drafts(loaded_gguf):
    """A stop token or max_tokens reached among a step's accepted tokens ends the request there."""
    sp = SamplingParams(**GREEDY)
    ref, _ = run(loaded_gguf, PROMPTS, sp)
    stop = ref[2][9]
    first = ref[2].index(stop)
    params = [SamplingParams(temperature=0.0, max_tokens=7, ignore_eos=True),
              SamplingParams(**GREEDY),
              SamplingParams(temperature=0.0, max_tokens=24, stop_token_ids=[stop])]
    got, _ = run(loaded_gguf, PROMPTS, params, MTP[2])
    assert got[0] == ref[0][:7]
    assert got[1] == ref[1]
    assert got[2] == ref[2][: first + 1]


def test_preemption_keeps_outputs(loaded_gguf):
    """Few KV blocks: sequences are preempted and recomputed (the MTP cache with them)."""
    sp = SamplingParams(temperature=0.0, max_tokens=40, ignore_eos=True)
    ref, _ = run(loaded_gguf, PROMPTS, sp)
    got, eng = run(loaded_gguf, PROMPTS, sp, MTP[2], num_kv_blocks=9, block_size=16, max_model_len=128)
    assert eng.scheduler.num_preemptions > 0
    assert got == ref


@pytest.fixture(scope="module")
def random_loaded(tmp_path_factory):
    """A fully random model (no MTP): every layer's state matters for every logit."""
    return load_random_tiny(tmp_path_factory.mktemp("spec-random"))


def test_oracle_drafts_every_acceptance_length(random_loaded, monkeypatch):
    """Drafts from the true continuation, wrong at chosen places: verification accepts exactly
    the right prefix and the linear-attention state rolls back to it, whatever its length."""
    from g906.engine.spec import decoder

    sp = SamplingParams(temperature=0.0, max_tokens=30, ignore_eos=True)
    ref, _ = run(random_loaded, PROMPTS, sp)
    full = [p + r for p, r in zip(PROMPTS, ref)]

    def oracle(token_ids, k, n_min, n_max):
        seq = next(f for f in full if f[: len(token_ids)] == token_ids)
        n = len(token_ids)
        d = seq[n: n + k]
        bad = (n * 7) % (k + 2)          # 0..k+1: the first wrong draft (k, k+1: none)
        return [t if j < bad else (t + 1) % 512 for j, t in enumerate(d)]

    monkeypatch.setattr(decoder, "propose_ngram", oracle)
    for k in (1, 3):
        got, eng = run(random_loaded, PROMPTS, sp, {"method": "ngram", "num_speculative_tokens": k})
        assert got == ref, k
        st = eng.stats()
        assert 0 < st["spec_num_accepted_tokens"] < st["spec_num_draft_tokens"]
        assert all(n > 0 for n in st["spec_accepted_per_pos"]), st


def test_ngram_high_acceptance_on_repetitive_text(loaded_gguf):
    """The Markov-like model cycles; once it does, prompt lookup drafts what comes next."""
    sp = SamplingParams(temperature=0.0, max_tokens=120, ignore_eos=True)
    ref, _ = run(loaded_gguf, PROMPTS[:1], sp)
    got, eng = run(loaded_gguf, PROMPTS[:1], sp, {"method": "ngram", "num_speculative_tokens": 4,
                                                  "prompt_lookup_min": 2, "prompt_lookup_max": 4})
    assert got == ref
    st = eng.stats()
    assert st["spec_num_accepted_tokens"] / st["spec_num_draft_tokens"] > 0.6, st
    assert st["spec_mean_acceptance_length"] > 2.5, st
    assert st["steps"] < 0.5 * 120


# -- sampling -----------------------------------------------------------------------------------

def test_sampling_follows_the_target_distribution(loaded_hf, markov_dir):
    """1500 seeded requests, 3 tokens each, top_k = 3, with MTP k = 2: the joint distribution of
    the three tokens matches the one transformers' model gives (chi-square), while drafts are
    both accepted and rejected."""
    from transformers import Qwen3_5ForCausalLM

    prompt = PROMPTS[0]
    n = 1500
    params = [SamplingParams(temperature=1.0, top_k=3, max_tokens=3, ignore_eos=True, seed=i) for i in range(n)]
    got, eng = run(loaded_hf, [prompt] * n, params, MTP[1], max_num_seqs=64, num_kv_blocks=300,
                   max_num_batched_tokens=512)
    st = eng.stats()
    assert 0 < st["spec_num_accepted_tokens"] < st["spec_num_draft_tokens"], st

    hf = Qwen3_5ForCausalLM.from_pretrained(str(markov_dir), dtype=torch.float32).eval()

    @torch.no_grad()
    def dist(ids):
        logits = hf(torch.tensor([ids])).logits[0, -1]
        v, i = logits.topk(3)
        return dict(zip(i.tolist(), torch.softmax(v, -1).tolist()))

    exact = {}
    for a, pa in dist(prompt).items():
        for b, pb in dist(prompt + [a]).items():
            for c, pc in dist(prompt + [a, b]).items():
                exact[(a, b, c)] = pa * pb * pc
    stat, cells = chi_square(got, exact, n)
    p = chi2_sf(stat, cells - 1)
    assert p > 1e-3, (stat, cells, p)


def test_seeded_sampling_is_reproducible(loaded_gguf):
    params = [SamplingParams(temperature=0.9, top_p=0.9, max_tokens=16, ignore_eos=True, seed=7 + i)
              for i in range(3)]
    a, _ = run(loaded_gguf, PROMPTS, params, MTP[2])
    b, _ = run(loaded_gguf, PROMPTS, params, MTP[2])
    assert a == b
    alone, _ = run(loaded_gguf, PROMPTS[2:], params[2:], MTP[2])
    assert alone == a[2:]


def test_rejection_sampler_alone():
    """verify() on fixed distributions: the first emitted token follows p_0 whether or not the
    draft is accepted (chi-square over 4000 seeds); greedy rows take the argmax prefix."""
    from g906.engine.sampler import Sampler, SamplerRow
    from g906.engine.spec.rejection import VerifyRow, verify

    logits = torch.log(torch.tensor([[0.5, 0.3, 0.15, 0.05], [0.1, 0.2, 0.3, 0.4], [0.25, 0.25, 0.25, 0.25]]))
    sampler = Sampler("cpu", seed=0)
    counts = [0] * 4
    n = 4000
    for s in range(n):
        row = SamplerRow(key=s, params=SamplingParams(temperature=1.0, seed=s))
        toks = verify(sampler, logits, [VerifyRow(row, 0, [1, 3])])[0]
        counts[toks[0]] += 1
        sampler.forget(s)
    p0 = [0.5, 0.3, 0.15, 0.05]
    stat = sum((counts[i] - n * p0[i]) ** 2 / (n * p0[i]) for i in range(4))
    assert chi2_sf(stat, 3) > 1e-3, counts
    greedy = SamplerRow(key=-1, params=SamplingParams(temperature=0.0))
    assert verify(sampler, logits, [VerifyRow(greedy, 0, [0, 3])])[0] == [0, 3, 0]
    assert verify(sampler, logits, [VerifyRow(greedy, 0, [0, 2])])[0] == [0, 3]
    assert verify(sampler, logits, [VerifyRow(greedy, 0, [1, 3])])[0] == [0]


# -- configuration ------------------------------------------------------------------------------

def test_ngram_proposer():
    from g906.engine.spec.ngram import propose_ngram

    assert propose_ngram([1, 2, 3, 4, 1, 2], 3, 1, 3) == [3, 4, 1]
    assert propose_ngram([1, 2, 3, 9, 2, 3, 7, 2, 3], 2, 1, 2) == [7, 2]      # most recent match
    assert propose_ngram([1, 2, 3, 4], 2, 1, 3) == []
    assert propose_ngram([5, 5], 4, 1, 2) == [5]


def test_bad_configs_are_refused(loaded_gguf, random_loaded):
    with pytest.raises(G906Error, match="speculative_config.num_speculative_tokens"):
        LLMEngine(loaded_gguf, EngineConfig(num_kv_blocks=16, speculative={"method": "mtp", "num_speculative_tokens": 0}))
    with pytest.raises(G906Error, match="'eagle' is not a method"):
        LLMEngine(loaded_gguf, EngineConfig(num_kv_blocks=16, speculative={"method": "eagle", "num_speculative_tokens": 1}))
    with pytest.raises(G906Error, match="unknown key"):
        LLMEngine(loaded_gguf, EngineConfig(num_kv_blocks=16, speculative={"method": "ngram", "num_speculative_tokens": 1,
                                                                          "lookup_max": 3}))
    with pytest.raises(G906Error, match="needs an MTP block"):
        LLMEngine(random_loaded, EngineConfig(num_kv_blocks=16, speculative={"method": "mtp", "num_speculative_tokens": 1}))
    # vLLM's model-specific method names are the same MTP method
    eng = LLMEngine(loaded_gguf, EngineConfig(num_kv_blocks=16, speculative={"method": "qwen3_next_mtp",
                                                                            "num_speculative_tokens": 2}))
    assert eng.describe()["speculative"] == {"method": "mtp", "num_speculative_tokens": 2}


def test_llm_constructor(markov_gguf, tmp_path):
    from g906 import LLM

    with pytest.raises(G906Error, match="needs an MTP block"):
        LLM("builtin:tiny-qwen35", speculative_config={"method": "mtp", "num_speculative_tokens": 1})
    with pytest.raises(G906Error, match="prompt_lookup_min"):
        LLM("builtin:tiny-qwen35", speculative_config={"method": "ngram", "num_speculative_tokens": 1,
                                                       "prompt_lookup_min": 3, "prompt_lookup_max": 2})
    llm = LLM(str(markov_gguf), num_kv_blocks=64, max_model_len=256,
              speculative_config={"method": "mtp", "num_speculative_tokens": 2})
    plain = LLM(str(markov_gguf), num_kv_blocks=64, max_model_len=256)
    sp = SamplingParams(temperature=0.0, max_tokens=12, ignore_eos=True)
    a = [o.outputs[0].token_ids for o in llm.generate(PROMPTS, sp)]
    b = [o.outputs[0].token_ids for o in plain.generate(PROMPTS, sp)]
    assert a == b
    assert math.isfinite(llm.engine.stats()["spec_mean_acceptance_length"])


def test_logit_bias_requests_speculate(loaded_gguf):
    """A logit bias applies at every verify position: a batch holding such a request still
    speculates, and outputs equal those without speculation (test_speculative_structured.py has
    grammars and the thinking budget). The prefix cache stays on beside speculation."""
    biased = SamplingParams(temperature=0.0, max_tokens=12, ignore_eos=True, logit_bias={7: 100.0})
    params = [SamplingParams(**GREEDY), biased, SamplingParams(**GREEDY)]
    ref, plain = run(loaded_gguf, PROMPTS, params)
    got, eng = run(loaded_gguf, PROMPTS, params, NGRAM)
    assert got == ref and got[1] == [7] * 12
    assert eng.stats()["spec_num_accepted_tokens"] > 0
    assert plain.prefix is not None and eng.prefix is not None
