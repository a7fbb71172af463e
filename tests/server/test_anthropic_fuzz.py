"""Property-based fuzz of /v1/messages and /v1/messages/count_tokens bodies: whatever an
Anthropic client sends, the answer is a 2xx or a 4xx in Anthropic's error shape, never a 5xx,
and it comes back."""

from __future__ import annotations

import json

import httpx
import pytest
from hypothesis import HealthCheck, event, given, settings
from hypothesis import strategies as st

from tests.server.conftest import API_KEY

from .test_fuzz import json_any

HEADERS = {"x-api-key": API_KEY, "anthropic-version": "2023-06-01", "content-type": "application/json"}


def bodies(wild: bool):
    """With wild=False every field is plausible (most requests run); with wild=True any field may
    hold any JSON value."""

    def maybe(good):
        return st.one_of(good, good, good, json_any) if wild else good

    text = st.text(max_size=30)
    source = st.one_of(st.fixed_dictionaries({"type": st.just("base64"), "media_type": st.just("image/png"),
                                              "data": maybe(text)}),
                       st.fixed_dictionaries({"type": st.sampled_from(["url", "file"] if wild else ["url"]),
                                              "url": maybe(text)}))
    blocks = [
        st.fixed_dictionaries({"type": st.just("text"), "text": maybe(text)}),
        st.fixed_dictionaries({"type": st.just("thinking"), "thinking": maybe(text), "signature": text}),
        st.fixed_dictionaries({"type": st.just("tool_use"), "id": maybe(text),
                               "name": maybe(st.sampled_from(["f", "g"])),
                               "input": maybe(st.dictionaries(st.sampled_from(["a", "b"]), st.integers(),
                                                              max_size=2))}),
        st.fixed_dictionaries({"type": st.just("tool_result"), "tool_use_id": maybe(text)},
                              optional={"is_error": maybe(st.booleans()), "content": maybe(st.one_of(
                                  text, st.lists(st.fixed_dictionaries({"type": st.just("text"), "text": text}),
                                                 max_size=2)))}),
        st.fixed_dictionaries({"type": st.just("image"), "source": maybe(source)}),
        st.fixed_dictionaries({"type": st.sampled_from(["redacted_thinking", "document", "x"])}),
    ]
    block = st.one_of(*blocks, json_any) if wild else st.one_of(*blocks[:4])
    message = st.fixed_dictionaries({"role": maybe(st.sampled_from(["user", "assistant"])),
                                     "content": maybe(st.one_of(text, st.lists(block, max_size=3)))})
    tool = st.fixed_dictionaries({"name": maybe(st.sampled_from(["f", "g"]))}, optional={
        "description": maybe(text), "type": st.sampled_from(["custom", "bash_20250124"] if wild else ["custom"]),
        "input_schema": maybe(st.just({"type": "object", "properties": {"a": {"type": "integer"}}}))})
    body = st.fixed_dictionaries(
        {"messages": maybe(st.lists(message, min_size=0 if wild else 1, max_size=3)),
         "max_tokens": st.one_of(st.integers(1, 3), json_any) if wild else st.integers(1, 3)},
        optional={
            "model": maybe(st.just("tiny")), "system": maybe(st.one_of(text, st.lists(block, max_size=2))),
            "stop_sequences": maybe(st.lists(text, max_size=3)), "temperature": maybe(st.floats(0, 1)),
            "top_p": maybe(st.floats(0.01, 1)), "top_k": maybe(st.integers(-2 if wild else 0, 50)),
            "stream": maybe(st.booleans()),
            "metadata": json_any, "tools": maybe(st.lists(tool, max_size=2)),
            "tool_choice": maybe(st.fixed_dictionaries(
                {"type": st.sampled_from(["auto", "any", "tool", "none", "x"] if wild else ["auto", "none"])},
                optional={"name": maybe(st.sampled_from(["f", "g"])),
                          "disable_parallel_tool_use": maybe(st.booleans())})),
            "thinking": maybe(st.fixed_dictionaries(
                {"type": st.sampled_from(["enabled", "disabled", "x"] if wild else ["enabled", "disabled"])},
                optional={"budget_tokens": maybe(st.integers(-5 if wild else 1, 2000))})),
        })
    return body


@pytest.fixture(scope="module")
def http(server):
    with httpx.Client(base_url=server.url, headers=HEADERS, timeout=120) as c:
        yield c


def check(r: httpx.Response) -> None:
    assert r.status_code < 500, r.text
    if r.status_code >= 400:
        j = r.json()
        assert j["type"] == "error" and isinstance(j["error"]["message"], str) and j["error"]["type"], j
        return
    if r.headers["content-type"].startswith("text/event-stream"):
        kinds = [line[len("event: "):] for line in r.text.splitlines() if line.startswith("event: ")]
        assert kinds[0] == "message_start" and kinds[-1] == "message_stop", kinds
    else:
        j = r.json()
        assert "input_tokens" in j or (j["type"] == "message" and j["stop_reason"] is not None)


@settings(max_examples=100, deadline=None, suppress_health_check=list(HealthCheck), derandomize=True)
@given(body=st.one_of(bodies(False), bodies(True)), count=st.booleans())
def test_fuzz_messages(http, body, count):
    path = "/v1/messages/count_tokens" if count else "/v1/messages"
    r = http.post(path, content=json.dumps(body))
    event(f"{path.rsplit('/', 1)[-1]} {r.status_code}")
    check(r)
