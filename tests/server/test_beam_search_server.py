"""use_beam_search (vLLM's extension) end to end: the official openai client against the session's
`g906 up` (tests/server/conftest.py), the answers checked against the offline engine's beam search
on the same builtin model (which tests/engine/test_beam_search.py checks against transformers)."""

from __future__ import annotations

import time

import httpx
import pytest

from tests.server.conftest import API_KEY

MSG = [{"role": "user", "content": "Tell me a story about a cat."}]
BEAM = {"use_beam_search": True, "ignore_eos": True, "return_token_ids": True}


def post(server, path, body):
    return httpx.post(server.v1 + path, json=body, headers={"Authorization": f"Bearer {API_KEY}"}, timeout=120)


@pytest.fixture(scope="module")
def offline():
    from g906 import LLM

    llm = LLM("builtin:tiny-qwen35", max_model_len=512)
    yield llm
    llm.close()


def assert_nothing_held(server) -> None:
    m = server.idle_metrics()
    assert m["g906:num_requests_running"] == 0 and m["g906:num_requests_waiting"] == 0
    assert m["g906:kv_cache_blocks_used"] == 0 and m["g906:state_slots_used"] == 0


def test_completions_beam_search_matches_the_engine(client, server, offline):
    from g906.engine.sampling_params import SamplingParams

    ids = [5, 17, 33, 2, 99, 100, 7]
    r = client.completions.with_raw_response.create(
        model="tiny", prompt=ids, n=3, max_tokens=8, temperature=0,
        extra_body={**BEAM, "length_penalty": 0.5})
    assert "use_beam_search" not in r.headers.get("x-g906-ignored-fields", "")
    got = r.parse()
    (want,) = offline.generate([ids], SamplingParams(n=3, use_beam_search=True, max_tokens=8, ignore_eos=True,
                                                     temperature=0.0, length_penalty=0.5))
    assert [c.index for c in got.choices] == [0, 1, 2]
    assert [c.token_ids for c in got.choices] == [o.token_ids for o in want.outputs]
    assert [c.text for c in got.choices] == [o.text for o in want.outputs]
    assert len({tuple(c.token_ids) for c in got.choices}) == 3
    assert all(c.finish_reason == "length" for c in got.choices)
    assert got.usage.completion_tokens == 24 and got.usage.prompt_tokens == len(ids)
    assert_nothing_held(server)


def test_chat_beam_search_with_logprobs_full_and_streamed(client, server):
    full = client.chat.completions.create(model="tiny", messages=MSG, n=2, max_tokens=6, logprobs=True,
                                          top_logprobs=3, extra_body=BEAM)
    assert len(full.choices) == 2
    for c in full.choices:
        lps = c.logprobs.content
        assert [lp.logprob for lp in lps] and len(lps) == len(c.token_ids) == 6
        assert all(len(lp.top_logprobs) == 3 and lp.top_logprobs[0].logprob >= lp.logprob - 1e-6 for lp in lps)
    # best first: the first beam's cumulative logprob (equal lengths: the score's order) is the highest
    cum = [sum(lp.logprob for lp in c.logprobs.content) for c in full.choices]
    assert cum[0] >= cum[1]
    # streamed: the same answers (beam search knows them only at its end: each comes in whole)
    text = {0: "", 1: ""}
    finish = {}
    for chunk in client.chat.completions.create(model="tiny", messages=MSG, n=2, max_tokens=6, stream=True,
                                                extra_body=BEAM):
        for c in chunk.choices:
            # (the qwen3 reasoning parser: the answer so far is reasoning)
            text[c.index] += (c.delta.content or "") + (getattr(c.delta, "reasoning_content", None) or "")
            if c.finish_reason:
                finish[c.index] = c.finish_reason
    assert [text[0], text[1]] == [(c.message.content or "") + (c.message.reasoning_content or "")
                                  for c in full.choices]
    assert text[0] != text[1]
    assert finish == {0: "length", 1: "length"}
    assert_nothing_held(server)


def test_beam_search_stops(client, server, offline):
    """A stop string ends a beam (g906 honours stop with beam search; vLLM ignores it)."""
    probe = client.completions.create(model="tiny", prompt="abc", n=2, max_tokens=6, temperature=0, extra_body=BEAM)
    word = probe.choices[0].text[2:5]
    if not word.strip():
        pytest.skip("the probe's text has no usable stop string")
    got = client.completions.create(model="tiny", prompt="abc", n=2, max_tokens=6, temperature=0, stop=[word],
                                    extra_body=BEAM)
    assert any(c.finish_reason == "stop" for c in got.choices)
    assert all(word not in c.text for c in got.choices)
    assert_nothing_held(server)


@pytest.mark.parametrize("extra,param", [
    ({"temperature": 0.8}, "temperature"),
    ({"top_p": 0.5}, "top_p"),
    ({"n": 11}, "n"),
    ({"presence_penalty": 0.5}, "presence_penalty"),
    ({"seed": 3}, "seed"),
    ({"logit_bias": {"5": 1.0}}, "logit_bias"),
    ({"guided_regex": "a+"}, "guided_regex"),
    ({"structured_outputs": {"choice": ["a", "b"]}}, "structured_outputs"),
    ({"response_format": {"type": "json_object"}}, "response_format"),
])
def test_options_beam_search_cannot_honour_are_400(server, extra, param):
    path, body = ("/chat/completions", {"messages": MSG}) if param == "response_format" else ("/completions",
                                                                                             {"prompt": "hi"})
    r = post(server, path, {**body, "max_tokens": 3, "n": 2, "use_beam_search": True, **extra})
    assert r.status_code == 400, r.text
    err = r.json()["error"]
    assert err["param"] == param and param in err["message"], err


def test_temperature_zero_and_unset_are_the_same_search(client):
    a = client.completions.create(model="tiny", prompt="xy", n=2, max_tokens=4, extra_body=BEAM)
    b = client.completions.create(model="tiny", prompt="xy", n=2, max_tokens=4, temperature=0, extra_body=BEAM)
    assert [c.token_ids for c in a.choices] == [c.token_ids for c in b.choices]


def test_disconnect_mid_beam_search_frees_everything(server):
    body = {"model": "tiny", "prompt": "keep going", "max_tokens": 400, "n": 4, **BEAM}
    with pytest.raises(httpx.ReadTimeout):
        post_quick = httpx.post(server.v1 + "/completions", json=body,
                                headers={"Authorization": f"Bearer {API_KEY}"}, timeout=0.5)
        raise AssertionError(f"a 400-token beam search answered within half a second: {post_quick.status_code}")
    assert_nothing_held(server)
    with httpx.Client(timeout=30) as h:               # streamed: closed before the search ends
        with h.stream("POST", server.v1 + "/completions", json={**body, "stream": True},
                      headers={"Authorization": f"Bearer {API_KEY}"}) as r:
            assert r.status_code == 200
            deadline = time.monotonic() + 10
            while server.metrics()["g906:num_requests_running"] < 4 and time.monotonic() < deadline:
                time.sleep(0.02)
            before = server.metrics()
            assert before["g906:num_requests_running"] == 4 and before["g906:kv_cache_blocks_used"] > 0
    assert_nothing_held(server)


def test_completions_batch_of_prompts_with_logprobs(client, server, offline):
    from g906.engine.sampling_params import SamplingParams

    prompts = [[5, 17, 33, 2], [99, 100, 7, 250, 3]]
    got = client.completions.create(model="tiny", prompt=prompts, n=2, max_tokens=5, logprobs=2, extra_body=BEAM)
    assert [c.index for c in got.choices] == [0, 1, 2, 3]
    want = offline.generate(prompts, SamplingParams(n=2, use_beam_search=True, max_tokens=5, ignore_eos=True,
                                                    temperature=0.0))
    assert [c.token_ids for c in got.choices] == [o.token_ids for w in want for o in w.outputs]
    for c, o in zip(got.choices, [o for w in want for o in w.outputs]):
        assert sum(c.logprobs.token_logprobs) == pytest.approx(o.cumulative_logprob, abs=1e-3)
        # the token and the top 2 (fewer where two tokens have the same text)
        for t, lp in zip(c.logprobs.top_logprobs, c.logprobs.token_logprobs):
            assert 1 <= len(t) <= 3 and max(t.values()) >= lp - 1e-6
    assert_nothing_held(server)
