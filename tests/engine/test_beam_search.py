"""Beam search (g906/engine/beam.py) on the tiny random Qwen3.5 (fp32, CPU) against two
independent references: transformers' generate(num_beams=...) where its semantics and vLLM's
coincide (no sequence ends early: every returned beam has max_tokens tokens), and, for beams that
end at different lengths (stop tokens, length_penalty), vLLM's algorithm restated here over
transformers' logits (each beam's 2n best continuations; a stop token finishes a hypothesis;
the n best live beams go on; score = cum_logprob / (prompt + output tokens, the stop token not
counted) ** length_penalty)."""

from __future__ import annotations

import dataclasses

import pytest
import torch

from g906.engine.llm_engine import EngineConfig, LLMEngine
from g906.engine.sampling_params import SamplingParams
from tests.engine.conftest import hf_logits
from tests.engine.prefix_workloads import assert_no_leaks, with_tokenizer

pytestmark = pytest.mark.usefixtures("torch_one_thread")

PROMPT = [5, 17, 33, 2, 99, 100, 7]          # 7 tokens: forks copy a partly filled block (size 4)
PROMPT8 = [11, 3, 250, 8, 64, 1, 19, 200]     # 8 tokens: block-aligned forks


@pytest.fixture(scope="module")
def loaded(tiny_qwen35_hf_dir):
    from g906.engine.loader import load_model

    return with_tokenizer(load_model(str(tiny_qwen35_hf_dir), dtype="float32", device="cpu", progress=False))


def engine(loaded, **kw) -> LLMEngine:
    cfg = dict(max_num_seqs=8, num_kv_blocks=96, block_size=4, prefix_state_stride=0)
    cfg.update(kw)
    return LLMEngine(loaded, EngineConfig(**cfg))


def beam(n, max_tokens, **kw) -> SamplingParams:
    return SamplingParams(n=n, use_beam_search=True, temperature=0.0, max_tokens=max_tokens, **kw)


def run(eng: LLMEngine, requests: dict) -> dict:
    """{request id: (prompt, params)} -> {output request id: StepOutput} (finished ones)."""
    for rid, (prompt, params) in requests.items():
        eng.add_request(rid, prompt, params)
    outs = {}
    for _ in range(10_000):
        if not eng.has_unfinished_requests():
            break
        for o in eng.step():
            assert o.request_id not in outs or not outs[o.request_id].finished
            outs[o.request_id] = o if o.request_id not in outs else merged(outs[o.request_id], o)
    else:
        raise AssertionError("the engine did not finish")
    return outs


def merged(a, b):
    return dataclasses.replace(b, new_token_ids=a.new_token_ids + b.new_token_ids, new_text=a.new_text + b.new_text)


def beams_of(outs: dict, rid: str, n: int) -> list:
    return [outs[rid] if n == 1 else outs[f"{rid}:{i}"] for i in range(n)]


@torch.no_grad()
def hf_beams(hf, prompt, n, max_tokens, length_penalty=1.0):
    """transformers' beam search with no stop token: (output ids, cumulative logprob) best first."""
    ref = hf.generate(torch.tensor([prompt]), num_beams=n, num_return_sequences=n, max_new_tokens=max_tokens,
                      do_sample=False, early_stopping=False, length_penalty=length_penalty, eos_token_id=None,
                      pad_token_id=0, output_scores=True, return_dict_in_generate=True)
    # its score is normalised by the generated length (every beam has max_tokens here)
    return [(s[len(prompt):].tolist(), float(sc) * max_tokens ** length_penalty)
            for s, sc in zip(ref.sequences, ref.sequences_scores)]


def vllm_reference(hf, prompt, n, max_tokens, *, ends=(), length_penalty=1.0, early_stopping=False):
    """vLLM's beam search over transformers' logits: [(output ids, cum logprob, ended)] best first."""
    live = [([], 0.0)]
    done = []
    for step in range(max_tokens):
        cands = []
        for out, cum in live:
            logp = torch.log_softmax(hf_logits(hf, prompt + out)[-1].double(), -1)
            vals, ids = logp.topk(2 * n)
            for t, v in zip(ids.tolist(), vals.tolist()):
                if t in ends:
                    done.append((out + [t], cum + v, True))
                else:
                    cands.append((cum + v, out + [t]))
        cands.sort(key=lambda c: -c[0])
        live = [(o, c) for c, o in cands[:n]]
        if step == max_tokens - 1:
            done += [(o, c, False) for o, c in live]
            break
        if not live or (early_stopping and len(done) >= n):
            break

    def score(h):
        out, cum, ended = h
        return cum / ((len(prompt) + len(out) - (1 if ended else 0)) ** length_penalty)

    return sorted(done, key=score, reverse=True)[:n]


@pytest.mark.parametrize("prompt,n,max_tokens", [(PROMPT, 3, 6), (PROMPT8, 4, 9), (PROMPT, 2, 11)])
def test_matches_transformers_beam_search(loaded, tiny_qwen35_hf_model, prompt, n, max_tokens):
    eng = engine(loaded)
    outs = run(eng, {"b": (prompt, beam(n, max_tokens, ignore_eos=True))})
    got = [(o.new_token_ids, o.cumulative_logprob) for o in beams_of(outs, "b", n)]
    want = hf_beams(tiny_qwen35_hf_model, prompt, n, max_tokens)
    assert [g[0] for g in got] == [w[0] for w in want]
    for (_, c), (_, w) in zip(got, want):
        assert c == pytest.approx(w, abs=2e-3)
    assert all(o.finish_reason == "length" and o.num_output_tokens == max_tokens for o in beams_of(outs, "b", n))
    assert len({tuple(g[0]) for g in got}) == n          # n distinct sequences
    assert_no_leaks(eng)


def _stop_ids(loaded, prompt, n):
    """Tokens the beams of a run without stop tokens choose at steps 2 and 4: as stop tokens,
    some hypotheses end early, at different lengths."""
    outs = run(engine(loaded), {"probe": (prompt, beam(n, 6, ignore_eos=True))})
    bs = beams_of(outs, "probe", n)
    return sorted({bs[0].new_token_ids[1], bs[-1].new_token_ids[3]})


@pytest.mark.parametrize("length_penalty", [0.0, 1.0, 2.5])
def test_stop_tokens_and_length_penalty_follow_vllm(loaded, tiny_qwen35_hf_model, length_penalty):
    n, T = 3, 7
    stops = _stop_ids(loaded, PROMPT, n)
    eng = engine(loaded)
    outs = run(eng, {"b": (PROMPT, beam(n, T, stop_token_ids=stops, length_penalty=length_penalty,
                                        logprobs=2))})
    got = beams_of(outs, "b", n)
    want = vllm_reference(tiny_qwen35_hf_model, PROMPT, n, T, ends=set(stops) | {eng.model_config.vocab_size - 1},
                          length_penalty=length_penalty)
    assert [o.new_token_ids for o in got] == [w[0] for w in want]
    assert any(w[2] for w in want)
    for o, (ids, cum, ended) in zip(got, want):
        assert o.cumulative_logprob == pytest.approx(cum, abs=2e-3)
        assert o.finish_reason == ("stop" if ended else "length")
        assert o.stop_reason == (ids[-1] if ended else None)
        # logprobs: one per token, its own logprob, summing to the cumulative one
        assert [lp.token_id for lp in o.new_logprobs] == o.new_token_ids
        assert sum(lp.logprob for lp in o.new_logprobs) == pytest.approx(o.cumulative_logprob, abs=1e-5)
        assert all(len(lp.top) == 2 for lp in o.new_logprobs)
        # the stop token's text is not part of the output (IdText: a token's text is "<id>")
        assert o.new_text == "".join(f"<{t}>" for t in (ids[:-1] if ended else ids))
    assert_no_leaks(eng)


def test_early_stopping_stops_once_n_hypotheses_ended(loaded, tiny_qwen35_hf_model):
    n, T = 2, 12
    stops = _stop_ids(loaded, PROMPT, n)
    eng = engine(loaded)
    outs = run(eng, {"b": (PROMPT, beam(n, T, stop_token_ids=stops, early_stopping=True))})
    want = vllm_reference(tiny_qwen35_hf_model, PROMPT, n, T, ends=set(stops) | {eng.model_config.vocab_size - 1},
                          early_stopping=True)
    assert [o.new_token_ids for o in beams_of(outs, "b", n)] == [w[0] for w in want]
    assert_no_leaks(eng)


def test_stop_strings_end_a_beam(loaded):
    n = 3
    stops = _stop_ids(loaded, PROMPT, n)
    s = f"<{stops[0]}>"
    for include in (False, True):
        eng = engine(loaded)
        outs = run(eng, {"b": (PROMPT, beam(n, 7, stop=[s], include_stop_str_in_output=include))})
        ended = [o for o in beams_of(outs, "b", n) if o.finish_reason == "stop"]
        assert ended
        for o in ended:
            assert o.stop_reason == s and o.new_token_ids[-1] == stops[0]
            assert o.new_text.endswith(s) == include and s not in o.new_text[: -len(s)]
        assert_no_leaks(eng)


def test_beams_batch_with_other_requests_and_survive_a_tight_cache(loaded, monkeypatch):
    """The same beams beside sampled requests, and with KV blocks for one beam only (preemptions,
    forks queued for a new prefill, waiting beams making room), with and without the prefix cache,
    as alone with room to spare."""
    from g906.engine.beam import BeamSearch

    queued = []
    fork = BeamSearch._fork

    def counting_fork(self, *a):
        child = fork(self, *a)
        queued.append(child.status.name == "WAITING")
        return child

    monkeypatch.setattr(BeamSearch, "_fork", counting_fork)
    n, T = 3, 10
    alone = run(engine(loaded), {"b": (PROMPT, beam(n, T, ignore_eos=True))})
    others = {f"s{i}": ([i + 1, 40, 41 + i], SamplingParams(max_tokens=9, seed=i, ignore_eos=True)) for i in range(3)}
    for blocks, prefix in ((96, True), (5, False), (6, True)):   # 5 blocks: one beam's 17 tokens
        queued.clear()
        eng = engine(loaded, num_kv_blocks=blocks, enable_prefix_caching=prefix, prefix_state_stride=4)
        outs = run(eng, {**others, "b": (PROMPT, beam(n, T, ignore_eos=True))})
        assert [o.new_token_ids for o in beams_of(outs, "b", n)] == [o.new_token_ids for o in beams_of(alone, "b", n)]
        assert all(len(outs[r].new_token_ids) == 9 for r in others)
        if blocks < 10:
            assert eng.scheduler.num_preemptions > 0 and any(queued) and not all(queued)
        assert_no_leaks(eng)


def test_abort_frees_every_beam(loaded):
    eng = engine(loaded)
    eng.add_request("b", PROMPT, beam(4, 50, ignore_eos=True))
    for _ in range(4):
        eng.step()
    assert eng.stats()["state_slots_used"] == 4 and eng.stats()["kv_blocks_used"] > 0
    for taken in ("b", "b:1"):
        with pytest.raises(ValueError, match="already running"):
            eng.add_request(taken, PROMPT, SamplingParams(max_tokens=2))
    assert eng.abort_request("b:2")           # any output's id aborts the group
    assert not eng.has_unfinished_requests() and not eng.abort_request("b")
    assert_no_leaks(eng)


def test_width_one_is_greedy(loaded):
    eng = engine(loaded)
    greedy = run(eng, {"g": (PROMPT, SamplingParams(temperature=0.0, max_tokens=6, ignore_eos=True))})
    one = run(eng, {"b": (PROMPT, beam(1, 6, ignore_eos=True))})
    assert one["b"].new_token_ids == greedy["g"].new_token_ids
    assert_no_leaks(eng)


def test_the_offline_api():
    from g906 import LLM, BeamSearchParams
    from g906.errors import G906Error

    with LLM("builtin:tiny-qwen35", dtype="float32", max_num_seqs=8) as llm:
        res = llm.beam_search([PROMPT, "Hello there"], BeamSearchParams(beam_width=3, max_tokens=5, ignore_eos=True))
        gen = llm.generate([PROMPT, "Hello there"], beam(3, 5, ignore_eos=True))
        for r, g in zip(res, gen):
            assert [s.tokens[len(g.prompt_token_ids):] for s in r.sequences] == [c.token_ids for c in g.outputs]
            assert [s.cum_logprob for s in r.sequences] == [c.cumulative_logprob for c in g.outputs]
            assert [s.text for s in r.sequences] == [c.text for c in g.outputs]
            assert all(s.tokens[: len(g.prompt_token_ids)] == g.prompt_token_ids for s in r.sequences)
            assert sorted((c.cumulative_logprob for c in g.outputs), reverse=True) == [c.cumulative_logprob
                                                                                      for c in g.outputs]
        with pytest.raises(G906Error, match="temperature"):
            llm.beam_search([PROMPT], BeamSearchParams(beam_width=2, max_tokens=3, temperature=0.5))
        with pytest.raises(G906Error, match="max_num_seqs"):
            llm.generate([PROMPT], beam(9, 3))
        assert_no_leaks(llm.engine)


@pytest.mark.parametrize("kw,param", [
    (dict(temperature=0.7), "temperature"), (dict(n=11), "n"), (dict(top_p=0.9), "top_p"),
    (dict(top_k=5), "top_k"), (dict(repetition_penalty=1.1), "repetition_penalty"), (dict(seed=1), "seed"),
    (dict(min_tokens=2), "min_tokens"), (dict(logit_bias={3: 1.0}), "logit_bias"),
    (dict(prompt_logprobs=1), "prompt_logprobs"),
])
def test_options_beam_search_cannot_honour_are_refused_by_name(kw, param):
    args = dict(n=2, use_beam_search=True, temperature=0.0, max_tokens=4) | kw
    with pytest.raises(ValueError) as e:
        SamplingParams(**args)
    assert e.value.param == param and param in str(e.value)


@pytest.mark.parametrize("lp", [1e308, -1e308])
def test_extreme_length_penalties_still_rank(loaded, lp):
    """len ** length_penalty beyond floats: scores tend to 0 (or -inf); the search still ends."""
    n = 2
    stops = _stop_ids(loaded, PROMPT, n)
    eng = engine(loaded)
    outs = run(eng, {"b": (PROMPT, beam(n, 7, stop_token_ids=stops, length_penalty=lp))})
    assert len(beams_of(outs, "b", n)) == n
    assert_no_leaks(eng)
    with pytest.raises(ValueError, match="length_penalty"):
        beam(2, 4, length_penalty=float("nan"))


def test_width_above_max_num_seqs_is_refused(loaded):
    eng = engine(loaded, max_num_seqs=2)
    with pytest.raises(ValueError, match="max_num_seqs") as e:
        eng.check_params(beam(3, 4))
    assert e.value.param == "n"


def test_a_beam_part_way_through_a_new_prefill_when_its_group_chooses(loaded, monkeypatch):
    """A beam whose logprobs came before it was preempted, and that is being prefilled again when
    its group chooses, goes back to the queue with its children: same beams as undisturbed."""
    from g906.engine.beam import BeamSearch
    from g906.engine.sequence import SequenceStatus

    n, T = 3, 8
    want = run(engine(loaded), {"b": (PROMPT, beam(n, T, ignore_eos=True))})
    eng = engine(loaded)
    eng.add_request("b", PROMPT, beam(n, T, ignore_eos=True))
    group = eng.beams.groups["b"]
    while len(group.beams) < n:
        eng.step()
    held = []
    monkeypatch.setattr(BeamSearch, "advance_ready", lambda self: held.append(1) or [])
    eng.step()                                  # every beam has its logprobs; the choice is held back
    monkeypatch.undo()
    victim = group.beams[1]
    assert held and all(b.seq_id in group.pending for b in group.beams)
    assert victim.status is SequenceStatus.RUNNING and victim.num_uncached_tokens == 0
    victim.num_cached_tokens -= 2               # as if its new prefill had not reached its end
    assert eng.beams.advance_ready() == []
    assert victim.status is SequenceStatus.WAITING and eng.scheduler.num_preemptions == 1
    outs = {}
    while eng.has_unfinished_requests():
        for o in eng.step():
            outs[o.request_id] = o
    assert [o.new_token_ids for o in beams_of(outs, "b", n)] == [o.new_token_ids for o in beams_of(want, "b", n)]
    assert_no_leaks(eng)
