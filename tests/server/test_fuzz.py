"""Property-based fuzz of request bodies: whatever a client sends, the answer is a 2xx or a 4xx
in OpenAI's error shape, never a 5xx, and it comes back (no hung request)."""

from __future__ import annotations

import json

import httpx
import pytest
from hypothesis import HealthCheck, event, given, settings
from hypothesis import strategies as st

from tests.server.conftest import API_KEY

AUTH = {"Authorization": f"Bearer {API_KEY}"}

json_leaf = st.one_of(
    st.none(), st.booleans(), st.integers(min_value=-(2**70), max_value=2**70),
    st.floats(allow_nan=False, allow_infinity=False), st.text(max_size=20),
)
json_any = st.recursive(json_leaf, lambda inner: st.one_of(
    st.lists(inner, max_size=4), st.dictionaries(st.text(max_size=8), inner, max_size=4)), max_leaves=12)


def bodies(wild: bool):
    """Request-body strategies: with wild=False every field is plausible (most requests run);
    with wild=True any field may hold any JSON value."""

    def maybe(good):
        return st.one_of(good, good, good, json_any) if wild else good

    text = st.text(max_size=40)
    message = st.fixed_dictionaries(
        {"role": maybe(st.sampled_from(["system", "user", "assistant", "developer", "tool"]))},
        optional={
            "content": maybe(st.one_of(text, st.lists(st.fixed_dictionaries(
                {"type": st.sampled_from(["text", "image_url", "x"] if wild else ["text"]), "text": text}),
                max_size=2), st.none())),
            "name": maybe(text), "reasoning_content": maybe(text), "extra": json_any,
        })
    sampling = {
        "model": maybe(st.sampled_from(["tiny", "other"] if wild else ["tiny"])),
        "temperature": maybe(st.floats(min_value=-1 if wild else 0, max_value=3 if wild else 2, allow_nan=False)),
        "top_p": maybe(st.floats(min_value=-0.5 if wild else 0.01, max_value=1.5 if wild else 1, allow_nan=False)),
        "top_k": maybe(st.integers(-3, 600)),
        "min_p": maybe(st.floats(min_value=-0.5 if wild else 0, max_value=1.5 if wild else 1, allow_nan=False)),
        "n": maybe(st.integers(-1, 20) if wild else st.integers(1, 3)),
        "seed": maybe(st.integers(-(2**65), 2**65) if wild else st.integers(0, 2**40)),
        "stop": maybe(st.one_of(text.filter(bool), st.lists(text.filter(bool), max_size=5))),
        "stop_token_ids": maybe(st.lists(st.integers(-5 if wild else 0, 600), max_size=4)),
        "presence_penalty": maybe(st.floats(min_value=-3 if wild else -2, max_value=3 if wild else 2, allow_nan=False)),
        "frequency_penalty": maybe(st.floats(min_value=-3 if wild else -2, max_value=3 if wild else 2, allow_nan=False)),
        "repetition_penalty": maybe(st.floats(min_value=-1 if wild else 0.1, max_value=3 if wild else 2, allow_nan=False)),
        "ignore_eos": maybe(st.booleans()),
        "min_tokens": maybe(st.integers(-2 if wild else 0, 10)),
        "include_stop_str_in_output": maybe(st.booleans()),
        "skip_special_tokens": maybe(st.booleans()),
        "stream": maybe(st.booleans()),
        "stream_options": maybe(st.fixed_dictionaries({}, optional={
            "include_usage": maybe(st.booleans()), "continuous_usage_stats": maybe(st.booleans())})),
        "user": json_any, "service_tier": json_any, "metadata": json_any,
    }
    # max_tokens is always there (a missing one means "the rest of the context": slow, tested elsewhere)
    small_max = st.one_of(st.integers(1, 4), json_any, st.integers(-5, 10**6)) if wild else st.integers(1, 4)
    chat = st.fixed_dictionaries(
        {"messages": maybe(st.lists(message, min_size=0 if wild else 1, max_size=3)), "max_tokens": small_max},
        optional={**sampling,
                  "logprobs": maybe(st.booleans()), "top_logprobs": maybe(st.integers(-2 if wild else 0, 25 if wild else 20)),
                  "chat_template_kwargs": maybe(st.fixed_dictionaries({}, optional={"enable_thinking": st.booleans()})),
                  "tools": maybe(st.lists(st.fixed_dictionaries({"type": st.just("function"), "function": st.fixed_dictionaries(
                      {"name": st.text(min_size=1, max_size=8)})}), max_size=2)),
                  "response_format": maybe(st.fixed_dictionaries({"type": st.sampled_from(
                      ["text", "json_object"] if wild else ["text"])})),
                  "add_generation_prompt": maybe(st.booleans()),
                  "max_completion_tokens": st.one_of(st.integers(1, 4), json_any) if wild else st.integers(1, 4)})
    prompt = st.one_of(text.filter(bool), st.lists(st.integers(-3 if wild else 0, 600), min_size=0 if wild else 1,
                                                   max_size=6),
                       st.lists(text.filter(bool), min_size=0 if wild else 1, max_size=3),
                       st.lists(st.lists(st.integers(0, 600), min_size=0 if wild else 1, max_size=4),
                                min_size=0 if wild else 1, max_size=2))
    completion = st.fixed_dictionaries(
        {"prompt": maybe(prompt), "max_tokens": small_max},
        optional={**sampling, "logprobs": maybe(st.integers(-1 if wild else 0, 25 if wild else 20)),
                  "echo": maybe(st.booleans()), "suffix": maybe(st.none() if not wild else st.one_of(st.none(), text))})
    return chat, completion


_tame, _wild = bodies(False), bodies(True)
chat_body = st.one_of(_tame[0], _wild[0])
completion_body = st.one_of(_tame[1], _wild[1])


@pytest.fixture(scope="module")
def http(server):
    with httpx.Client(base_url=server.v1, headers=AUTH, timeout=60) as h:
        yield h


def check(r: httpx.Response, streamed: bool) -> None:
    event(f"status {r.status_code}" + (" stream" if streamed else ""))
    assert r.status_code < 500, (r.status_code, r.text[:500])
    if r.status_code >= 400:
        err = r.json()["error"]
        assert isinstance(err["message"], str)
    elif streamed:
        lines = [line for line in r.text.split("\n") if line]
        assert lines[-1] == "data: [DONE]", r.text[-500:]
        for line in lines[:-1]:
            obj = json.loads(line[len("data: "):])
            assert "error" not in obj, obj
    else:
        assert r.json()["choices"] is not None


FUZZ = settings(max_examples=120, deadline=None, suppress_health_check=list(HealthCheck), derandomize=True)


@FUZZ
@given(body=chat_body)
def test_fuzz_chat(http, body):
    r = http.post("/chat/completions", content=json.dumps(body))
    check(r, body.get("stream") is True)


@FUZZ
@given(body=completion_body)
def test_fuzz_completions(http, body):
    r = http.post("/completions", content=json.dumps(body))
    check(r, body.get("stream") is True)


@settings(max_examples=60, deadline=None, suppress_health_check=list(HealthCheck), derandomize=True)
@given(raw=st.one_of(st.binary(max_size=64), json_any.map(lambda v: json.dumps(v).encode())))
def test_fuzz_raw_bodies(http, raw):
    for path in ("/chat/completions", "/completions"):
        r = http.post(path, content=raw)
        assert 400 <= r.status_code < 500 or r.status_code == 200, (r.status_code, r.text[:300])
