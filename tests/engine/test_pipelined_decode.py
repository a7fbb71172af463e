"""Pipelined decode (LLMEngine.step): step N+1 is queued before step N's tokens are read, its
input tokens taken on the device from step N's sampler. Driven here on the CPU through the
padded decode path (the GPU's graph call site, run eagerly): every output — tokens, text,
logprobs, finish reasons, counts — equals the engine's plain one-step-at-a-time run, through
stops, aborts, admissions and preemptions."""

from __future__ import annotations

import pytest

from g906.engine.llm_engine import EngineConfig, LLMEngine
from g906.engine.loader import load_model
from g906.engine.sampling_params import SamplingParams

from .padded_decode import padded_decode


@pytest.fixture(scope="module")
def tiny():
    return load_model("builtin:tiny-qwen35", dtype="float32", device="cpu", progress=False)


def _engine(lm, pipelined: bool, *, max_num_seqs=4, num_kv_blocks=24):
    eng = LLMEngine(lm, EngineConfig(max_num_seqs=max_num_seqs, num_kv_blocks=num_kv_blocks, max_model_len=256,
                                     max_num_batched_tokens=64))
    if pipelined:
        eng.runner.graphs = padded_decode(eng, lm, max_num_seqs=max_num_seqs)[0]
    else:
        lm.model.bind_cache(eng.runner.cache)
    return eng


class Approx(list):
    """Logprobs compare to 1e-4: the padded decode path may round differently from the runner's
    own (a different batch shape), never by more."""

    def __eq__(self, other):
        return len(self) == len(other) and all(abs(a - b) <= 1e-4 for a, b in zip(self, other))


def _prompt(i, n, vocab):
    return [(29 * j + 5 * i) % (vocab - 10) + 5 for j in range(n)]


def _drive(eng, script):
    """Run the engine; script(step_index, eng) may add or abort requests between steps.
    Returns every StepOutput field that a client sees, per request."""
    out: dict[str, list] = {}
    k = 0
    while True:
        script(k, eng)
        if not eng.has_unfinished_requests() and k > 0:
            break
        for o in eng.step():
            lps = [(lp.token_id, lp.rank, [t for t, _ in lp.top], Approx([lp.logprob] + [v for _, v in lp.top]))
                   for lp in o.new_logprobs]
            out.setdefault(o.request_id, []).append(
                (o.new_token_ids, o.new_text, lps, o.finished, o.finish_reason, o.stop_reason,
                 o.num_output_tokens))
        k += 1
        assert k < 2000
    return out


def _both(lm, script, **kw):
    want = _drive(_engine(lm, False, **kw), script)
    eng = _engine(lm, True, **kw)
    got = _drive(eng, script)
    return want, got, eng


def test_mixed_requests_stops_and_sampling_equal_the_plain_engine(tiny):
    vocab = tiny.config.vocab_size
    # a stop token that greedy decoding of request 0 meets part-way (found by a plain run)
    probe = _drive(_engine(tiny, False), lambda k, e: k == 0 and e.add_request(
        "p", _prompt(0, 9, vocab), SamplingParams(temperature=0, max_tokens=40, ignore_eos=True)))
    toks = [t for step in probe["p"] for t in step[0]]
    stop_tok = toks[17]
    params = [
        SamplingParams(temperature=0, max_tokens=40, ignore_eos=True, stop_token_ids=[stop_tok]),
        SamplingParams(temperature=0.9, top_p=0.9, seed=7, max_tokens=23, ignore_eos=True, logprobs=2),
        SamplingParams(temperature=0, max_tokens=1, ignore_eos=True),
        SamplingParams(temperature=0.7, top_k=20, seed=11, max_tokens=31, ignore_eos=True, logprobs=0),
    ]

    def script(k, eng):
        if k == 0:
            for i, p in enumerate(params):
                eng.add_request(f"r{i}", _prompt(i, 9 + 7 * i, vocab), p)

    want, got, eng = _both(tiny, script)
    assert got == want
    assert eng.num_lookahead_steps > 10
    assert want["r0"][-1][4:6] == ("stop", stop_tok)
    assert len(want["r0"]) < 40 and len(want["r1"]) == 23 and len(want["r2"]) == 1


def test_abort_and_late_admission_equal_the_plain_engine(tiny):
    vocab = tiny.config.vocab_size

    def script(k, eng):
        if k == 0:
            for i in range(3):
                eng.add_request(f"r{i}", _prompt(i, 13 + i, vocab),
                                SamplingParams(temperature=0, max_tokens=30, ignore_eos=True))
        if k == 9:
            eng.abort_request("r1")
        if k == 14:
            eng.add_request("late", _prompt(5, 20, vocab), SamplingParams(temperature=0, max_tokens=12, ignore_eos=True))

    want, got, eng = _both(tiny, script)
    assert got == want and "late" in got and len(got["late"]) == 12
    assert eng.num_lookahead_steps > 10


def test_preemption_under_a_small_cache_equals_the_plain_engine(tiny):
    vocab = tiny.config.vocab_size

    def script(k, eng):
        if k == 0:
            for i in range(4):
                eng.add_request(f"r{i}", _prompt(i, 30, vocab),
                                SamplingParams(temperature=0, max_tokens=40, ignore_eos=True))

    want, got, eng = _both(tiny, script, num_kv_blocks=14)
    assert got == want
    assert eng.scheduler.num_preemptions > 0
    assert all(len(v) == 40 for v in got.values())


def test_an_idle_engine_drops_a_finished_lookahead(tiny):
    """The last decode step of a run queues one more (the sequence's stop is only known after
    the read): the next request still starts at once and decodes the same tokens."""
    vocab = tiny.config.vocab_size
    eng = _engine(tiny, True)
    p = SamplingParams(temperature=0, max_tokens=50, ignore_eos=True, stop_token_ids=[])
    runs = []
    for _ in range(2):
        eng.add_request("x", _prompt(3, 10, vocab), p)
        toks = []
        while eng.has_unfinished_requests():
            for o in eng.step():
                toks += o.new_token_ids
        runs.append(toks)
    assert runs[0] == runs[1] and len(runs[0]) == 50


def test_a_queue_of_waiting_requests_keeps_the_pipeline_running(tiny):
    """More requests than max_num_seqs: the waiting ones cannot be admitted while both places
    are taken, so decode stays pipelined; each finished request's place is taken one step later
    than in the plain engine, which changes no request's output."""
    vocab = tiny.config.vocab_size

    def script(k, eng):
        if k == 0:
            for i in range(5):
                eng.add_request(f"r{i}", _prompt(i, 7 + 3 * i, vocab),
                                SamplingParams(temperature=0, max_tokens=12 + 5 * i, ignore_eos=True))

    want, got, eng = _both(tiny, script, max_num_seqs=2)
    assert got == want and all(len(got[f"r{i}"]) == 12 + 5 * i for i in range(5))
    assert eng.num_lookahead_steps > 30


def test_beam_search_on_the_padded_decode_path_equals_the_plain_engine(tiny):
    """Beams decode on the GPU's call site (padded batches, scratch block and slot) beside
    pipelined requests: forks' block and state copies land in the padded cache; the beams, and
    the other requests, equal the plain engine's."""
    vocab = tiny.config.vocab_size

    def script(k, eng):
        if k == 0:
            eng.add_request("g", _prompt(1, 5, vocab), SamplingParams(temperature=0, max_tokens=30, ignore_eos=True))
        if k == 3:
            eng.add_request("b", _prompt(2, 11, vocab), SamplingParams(
                n=3, use_beam_search=True, temperature=0, max_tokens=20, ignore_eos=True, logprobs=2))
        if k == 30:
            eng.add_request("h", _prompt(3, 7, vocab), SamplingParams(temperature=0, max_tokens=12, ignore_eos=True))

    want, got, eng = _both(tiny, script, max_num_seqs=4, num_kv_blocks=32)
    assert got == want
    assert {f"b:{i}" for i in range(3)} <= set(got) and len({str(got[f"b:{i}"]) for i in range(3)}) == 3
    assert eng.num_lookahead_steps > 0
    assert eng.cache.blocks.num_used_blocks == 0 and eng.cache.slots.num_used == 0
