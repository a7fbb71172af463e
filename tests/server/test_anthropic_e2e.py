"""Anthropic's Messages API through a real `g906 up` (builtin:tiny-qwen35 with the real Qwen3.5
chat template) and the official `anthropic` client: plain and streamed messages, tool use forced
with tool_choice "any" (schema-valid input on a random model), a tool_result turn, count_tokens
equal to the served input tokens, the same conversation rendering the same prompt tokens through
both dialects, and malformed requests answered 400 in Anthropic's error shape."""

from __future__ import annotations

import anthropic
import httpx
import jsonschema
import pytest

from .agent_conversation import AGENT_CONVERSATION, TOOLS
from .conftest import API_KEY, openai_client, serving
from .test_tools_e2e import RECIPE, SCHEMAS, SMALL

A_TOOLS = [{"name": t["function"]["name"], "description": "a tool", "input_schema": t["function"]["parameters"]}
           for t in SMALL]
USER = [{"role": "user", "content": "Weather in Paris?"}]


@pytest.fixture(scope="module")
def aserver(tmp_path_factory):
    yield from serving(tmp_path_factory.mktemp("g906-anthropic"), RECIPE)


@pytest.fixture(scope="module")
def aclient(aserver):
    # the client sends the key as x-api-key
    return anthropic.Anthropic(base_url=aserver.url, api_key=API_KEY, max_retries=0, timeout=120)


def test_plain_message(aclient):
    m = aclient.messages.create(model="tiny", max_tokens=5, messages=USER, extra_body={"temperature": 0.0},
                                thinking={"type": "disabled"})
    assert m.type == "message" and m.role == "assistant" and m.id.startswith("msg")
    assert m.stop_reason in ("max_tokens", "end_turn")
    assert m.usage.output_tokens <= 5 and m.usage.input_tokens > 0
    assert all(b.type in ("text", "thinking") for b in m.content)


def test_streamed_text_and_final_message(aclient):
    with aclient.messages.stream(model="tiny", max_tokens=6, messages=USER, thinking={"type": "disabled"},
                                 system=[{"type": "text", "text": "Be brief."}]) as s:
        text = "".join(s.text_stream)
        final = s.get_final_message()
    assert final.stop_reason in ("max_tokens", "end_turn")
    assert "".join(b.text for b in final.content if b.type == "text") == text
    assert 0 < final.usage.output_tokens <= 6 and final.usage.input_tokens > 0


@pytest.mark.parametrize("stream", [False, True])
def test_tool_choice_any_gives_a_schema_valid_tool_use(aclient, stream):
    # one call (bounded schemas) finishes well within max_tokens; parallel calls of a random model may not
    kw = dict(model="tiny", max_tokens=600, messages=USER, tools=A_TOOLS,
              tool_choice={"type": "any", "disable_parallel_tool_use": True}, thinking={"type": "disabled"})
    if stream:
        with aclient.messages.stream(**kw) as s:
            m = s.get_final_message()
    else:
        m = aclient.messages.create(**kw)
    uses = [b for b in m.content if b.type == "tool_use"]
    assert len(uses) == 1 and m.stop_reason == "tool_use"
    for u in uses:
        assert u.id and u.name in SCHEMAS
        jsonschema.validate(u.input, SCHEMAS[u.name])


def test_named_tool_and_no_parallel_calls(aclient):
    m = aclient.messages.create(model="tiny", max_tokens=600, messages=USER, tools=A_TOOLS,
                                tool_choice={"type": "tool", "name": "configure", "disable_parallel_tool_use": True},
                                thinking={"type": "disabled"})
    uses = [b for b in m.content if b.type == "tool_use"]
    assert len(uses) == 1 and uses[0].name == "configure" and m.stop_reason == "tool_use"
    jsonschema.validate(uses[0].input, SCHEMAS["configure"])


def test_tool_result_turn(aclient):
    convo = USER + [
        {"role": "assistant", "content": [{"type": "tool_use", "id": "toolu_1", "name": "get_weather",
                                           "input": {"city": "Paris", "unit": "celsius"}}]},
        {"role": "user", "content": [{"type": "tool_result", "tool_use_id": "toolu_1",
                                      "content": [{"type": "text", "text": "21 C"}]},
                                     {"type": "text", "text": "And now?"}]},
    ]
    m = aclient.messages.create(model="tiny", max_tokens=3, messages=convo, tools=A_TOOLS)
    assert m.stop_reason in ("max_tokens", "end_turn", "tool_use")
    n = aclient.messages.count_tokens(model="tiny", messages=convo, tools=A_TOOLS)
    assert n.input_tokens == m.usage.input_tokens + (m.usage.cache_read_input_tokens or 0)
    failed = convo[:-1] + [{"role": "user", "content": [{"type": "tool_result", "tool_use_id": "toolu_1",
                                                          "content": "no network", "is_error": True}]}]
    assert aclient.messages.create(model="tiny", max_tokens=1, messages=failed, tools=A_TOOLS).usage.input_tokens > 0


def test_count_tokens_equals_served_input_tokens(aclient):
    convo = [{"role": "user", "content": "count me, a fresh prompt nobody sent before"}]
    n = aclient.messages.count_tokens(model="tiny", messages=convo, system="sys", thinking={"type": "disabled"})
    m = aclient.messages.create(model="tiny", max_tokens=1, messages=convo, system="sys",
                                thinking={"type": "disabled"})
    assert n.input_tokens == m.usage.input_tokens + (m.usage.cache_read_input_tokens or 0) > 0


def _anthropic_agent_conversation() -> tuple[str, list[dict]]:
    """AGENT_CONVERSATION written in Anthropic's dialect."""
    def use(call):
        import json
        args = call["function"]["arguments"]
        return {"type": "tool_use", "id": call["id"], "name": call["function"]["name"],
                "input": json.loads(args) if isinstance(args, str) else args}

    c = AGENT_CONVERSATION
    return c[0]["content"], [
        {"role": "user", "content": c[1]["content"]},
        {"role": "assistant", "content": [{"type": "thinking", "thinking": c[2]["reasoning_content"], "signature": ""},
                                          {"type": "text", "text": c[2]["content"]}]
         + [use(t) for t in c[2]["tool_calls"]]},
        {"role": "user", "content": [{"type": "tool_result", "tool_use_id": "call_1", "content": c[3]["content"]},
                                     {"type": "tool_result", "tool_use_id": "call_2", "content": c[4]["content"]}]},
        {"role": "assistant", "content": [{"type": "thinking", "thinking": c[5]["reasoning"], "signature": ""},
                                          use(c[5]["tool_calls"][0])]},
        {"role": "user", "content": [{"type": "tool_result", "tool_use_id": "call_3", "content": c[6]["content"]}]},
        {"role": "assistant", "content": c[7]["content"]},
        {"role": "user", "content": [{"type": "text", "text": c[8]["content"]}]},
    ]


def test_same_conversation_same_prompt_tokens_in_both_dialects(aserver, aclient):
    system, convo = _anthropic_agent_conversation()
    tools = [{"name": t["function"]["name"], "description": t["function"].get("description"),
              "input_schema": t["function"]["parameters"]} for t in TOOLS]
    r = openai_client(aserver).chat.completions.create(model="tiny", messages=AGENT_CONVERSATION, tools=TOOLS,
                                                       max_tokens=1)
    n = aclient.messages.count_tokens(model="tiny", system=system, messages=convo, tools=tools)
    assert n.input_tokens == r.usage.prompt_tokens
    m = aclient.messages.create(model="tiny", system=system, messages=convo, tools=tools, max_tokens=1)
    assert m.usage.input_tokens + (m.usage.cache_read_input_tokens or 0) == r.usage.prompt_tokens
    # the same prompt again: the prefix cache supplies most of it, and usage says so
    again = aclient.messages.create(model="tiny", system=system, messages=convo, tools=tools, max_tokens=1)
    assert again.usage.cache_read_input_tokens > 0
    assert again.usage.input_tokens + again.usage.cache_read_input_tokens == r.usage.prompt_tokens


BAD = [
    ({"messages": USER}, "max_tokens"),
    ({"max_tokens": 4, "messages": [{"role": "user", "content": [{"type": "video", "url": "x"}]}]}, "video"),
    ({"max_tokens": 4, "messages": [{"role": "assistant", "content": [{"type": "tool_result", "tool_use_id": "a"}]}]},
     "tool_result"),
    ({"max_tokens": 4, "messages": USER, "tools": A_TOOLS, "tool_choice": {"type": "tool", "name": "nope"}}, "nope"),
    ({"max_tokens": 4, "messages": USER, "tool_choice": {"type": "any"}}, "needs tools"),
    ({"max_tokens": 4, "messages": [{"role": "system", "content": "x"}]}, "role"),
    ({"max_tokens": 4, "messages": USER, "thinking": {"type": "sometimes"}}, "thinking.type"),
    ({"max_tokens": 4, "messages": USER, "model": "other"}, "other"),
    ({"max_tokens": 0, "messages": USER}, "max_tokens"),
]


@pytest.mark.parametrize("body,needle", BAD)
def test_malformed_requests_are_400_in_anthropic_shape(aserver, body, needle):
    for path in ("/v1/messages", "/v1/messages/count_tokens"):
        if path.endswith("count_tokens") and needle == "max_tokens":
            continue
        r = httpx.post(aserver.url + path, json=body, timeout=60,
                       headers={"x-api-key": API_KEY, "anthropic-version": "2023-06-01"})
        assert r.status_code == 400, (path, r.text)
        j = r.json()
        assert j["type"] == "error" and j["error"]["type"] == "invalid_request_error"
        assert needle in j["error"]["message"]
    assert httpx.get(aserver.url + "/health", timeout=10).status_code == 200


def test_the_client_raises_its_own_errors(aserver, aclient):
    with pytest.raises(anthropic.BadRequestError) as e:
        aclient.messages.create(model="tiny", max_tokens=4, messages=USER, tools=A_TOOLS,
                                tool_choice={"type": "tool", "name": "nope"})
    assert e.value.body["error"]["type"] == "invalid_request_error"
    bad = anthropic.Anthropic(base_url=aserver.url, api_key="wrong", max_retries=0)
    with pytest.raises(anthropic.AuthenticationError):
        bad.messages.create(model="tiny", max_tokens=1, messages=USER)
    bearer = httpx.post(aserver.url + "/v1/messages", json={"max_tokens": 1, "messages": USER},
                        headers={"Authorization": f"Bearer {API_KEY}"}, timeout=60)
    assert bearer.status_code == 200 and bearer.json()["type"] == "message"


def test_max_tokens_beyond_the_context_is_cut_to_it(aclient):
    m = aclient.messages.create(model="tiny", max_tokens=64000, messages=USER, thinking={"type": "disabled"},
                                stop_sequences=["\n"],
                                extra_body={"temperature": 0.5, "top_k": 5, "top_p": 0.9})  # older clients send them
    assert m.stop_reason in ("max_tokens", "end_turn", "stop_sequence")
    if m.stop_reason == "stop_sequence":
        assert m.stop_sequence == "\n"


@pytest.mark.parametrize("thinking,enable", [({"type": "enabled", "budget_tokens": 1024}, True),
                                             ({"type": "disabled"}, False)])
def test_thinking_switch_reaches_the_template(aserver, aclient, thinking, enable):
    n = aclient.messages.count_tokens(model="tiny", messages=USER, thinking=thinking)
    r = openai_client(aserver).chat.completions.create(model="tiny", messages=USER, max_tokens=1,
                                                       extra_body={"chat_template_kwargs": {"enable_thinking": enable}})
    assert n.input_tokens == r.usage.prompt_tokens
    other = aclient.messages.count_tokens(model="tiny", messages=USER,
                                          thinking={"type": "disabled" if enable else "enabled", "budget_tokens": 1024})
    assert other.input_tokens != n.input_tokens
    raw = httpx.post(aserver.url + "/v1/messages", json={"max_tokens": 1, "messages": USER, "thinking": thinking},
                     headers={"x-api-key": API_KEY}, timeout=60)
    assert raw.status_code == 200
    # this server has a reasoning parser: the budget is enforced, so never reported as ignored
    assert "thinking.budget_tokens" not in raw.headers.get("x-g906-ignored-fields", "")


def test_auth_and_size_errors_in_anthropic_shape(aserver):
    url = aserver.url + "/v1/messages"
    r = httpx.post(url, json={"max_tokens": 1, "messages": USER}, headers={"x-api-key": "wrong"}, timeout=60)
    assert r.status_code == 401 and r.json()["error"]["type"] == "authentication_error"
    r = httpx.post(url, json={"max_tokens": 1, "messages": USER}, timeout=60)
    assert r.status_code == 401 and r.json()["type"] == "error"
    big = {"max_tokens": 1, "messages": [{"role": "user", "content": "x" * (2 * 1024 * 1024)}]}
    r = httpx.post(url, json=big, headers={"x-api-key": API_KEY}, timeout=60)
    assert r.status_code == 413 and r.json()["error"]["type"] == "request_too_large"
    r = httpx.post(url, content=b"{not json", headers={"x-api-key": API_KEY}, timeout=60)
    assert r.status_code == 400 and r.json()["error"]["type"] == "invalid_request_error"
    assert httpx.get(aserver.url + "/health", timeout=10).status_code == 200


def test_thinking_budget_is_enforced_with_a_reasoning_parser(aclient):
    # the served model has the qwen3 reasoning parser: budget_tokens caps the thinking (the end
    # tag is forced), so the answer carries no ignored-field notice for it
    r = aclient.messages.with_raw_response.create(
        model="tiny", max_tokens=24, messages=[{"role": "user", "content": "think"}],
        thinking={"type": "enabled", "budget_tokens": 3})
    assert r.http_response.status_code == 200
    assert "budget_tokens" not in (r.http_response.headers.get("x-g906-ignored-fields") or "")
