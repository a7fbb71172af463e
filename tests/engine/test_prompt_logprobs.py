"""prompt_logprobs (g906/engine/prompt_logprobs.py) on builtin:tiny-qwen35: the same figures
chunked or whole, and the same as the sampler's logprob of that token from the decode path."""

from __future__ import annotations

import pytest

from g906.engine.sampling_params import SamplingParams

pytestmark = pytest.mark.usefixtures("torch_one_thread")
PROMPT = [(13 * j) % 300 + 7 for j in range(40)]


def run(engine, rid, ids, params):
    engine.add_request(rid, ids, params)
    outs = []
    while engine.has_unfinished_requests():
        outs.extend(o for o in engine.step() if o.request_id == rid)
    return outs


@pytest.fixture(scope="module")
def engines():
    from g906 import LLM

    return LLM("builtin:tiny-qwen35", max_num_batched_tokens=512).engine, \
        LLM("builtin:tiny-qwen35", max_num_batched_tokens=16).engine


def test_prompt_logprobs_whole_chunked_and_decode_agree(engines):
    whole, chunked = engines
    p = SamplingParams(max_tokens=2, temperature=0.0, ignore_eos=True, prompt_logprobs=3)
    a = run(whole, "a", PROMPT, p)
    b = run(chunked, "b", PROMPT, p)
    pa, pb = a[0].prompt_logprobs, b[0].prompt_logprobs
    assert len(pa) == len(PROMPT) and pa[0] is None and pb[0] is None
    assert all(o.prompt_logprobs is None for o in a[1:])
    for x, y, tok in zip(pa[1:], pb[1:], PROMPT[1:]):
        assert x.token_id == y.token_id == tok
        assert x.logprob == pytest.approx(y.logprob, abs=1e-4)
        assert [t for t, _ in x.top] == [t for t, _ in y.top] and len(x.top) == 3
        assert x.rank == 1 + sum(v > x.logprob + 1e-6 for _, v in x.top) or x.rank > 3
    # the last prompt token's logprob = the sampler's logprob of that token after the rest
    dec = run(whole, "c", PROMPT[:-1], SamplingParams(max_tokens=1, temperature=0.0, ignore_eos=True, logprobs=20))
    lp = dec[0].new_logprobs[0]
    scored = dict(lp.top)
    if PROMPT[-1] in scored:
        assert pa[-1].logprob == pytest.approx(scored[PROMPT[-1]], abs=1e-4)
    assert pa[-1].top[0][1] == pytest.approx(lp.top[0][1], abs=1e-4)
    plain = run(whole, "d", PROMPT, SamplingParams(max_tokens=1))
    assert plain[0].prompt_logprobs is None
