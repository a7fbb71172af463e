"""POST /v1/responses against a real `g906 up` (tiny random model, qwen3 reasoning parser) through
the official openai client: the response object and its items validated against the openai
package's own types, usage, logprobs, tools (function, namespace, forced), text formats
(json_schema validated with jsonschema), vLLM's extras, and the ignored-fields header."""

from __future__ import annotations

import json

import httpx
import jsonschema
import pytest
from pydantic import BaseModel

from openai.types.responses import Response
from tests.server.conftest import API_KEY

NO_THINKING = {"effort": "none"}
WEATHER = {"type": "function", "name": "get_weather", "description": "The weather in a city.",
           "parameters": {"type": "object", "properties": {"unit": {"type": "string", "enum": ["c", "f"]},
                                                           "rain": {"type": "boolean"}},
                          "required": ["unit", "rain"], "additionalProperties": False}, "strict": True}


def post(server, body: dict, **kw) -> httpx.Response:
    return httpx.post(server.v1 + "/responses", json=body, headers={"Authorization": f"Bearer {API_KEY}"},
                      timeout=120, **kw)


def test_text_input_gives_a_valid_response(client, server):
    r = post(server, {"model": "tiny", "input": "Hello", "max_output_tokens": 24})
    assert r.status_code == 200
    body = r.json()
    resp = Response.model_validate(body)
    assert resp.id.startswith("resp_") and resp.object == "response"
    assert resp.model == "tiny" and resp.error is None and resp.store is True
    assert resp.status in ("completed", "incomplete")
    assert body["created_at"] <= body["completed_at"]
    assert resp.tool_choice == "auto" and resp.tools == [] and resp.parallel_tool_calls is True
    assert resp.text.format.type == "text" and resp.truncation == "disabled"
    # thinking on (the template opens it): the answer starts with a reasoning item
    assert resp.output[0].type == "reasoning"
    rs = resp.output[0]
    assert rs.id.startswith("rs_") and rs.summary == [] and rs.content[0].type == "reasoning_text"
    u = resp.usage
    assert u.total_tokens == u.input_tokens + u.output_tokens and 0 < u.output_tokens <= 24
    assert 0 < u.output_tokens_details.reasoning_tokens <= u.output_tokens
    assert u.input_tokens_details.cached_tokens >= 0


def test_thinking_off_gives_a_message_and_output_text(client):
    resp = client.responses.create(model="tiny", input="Hello", reasoning=NO_THINKING, max_output_tokens=16,
                                   instructions="Answer briefly.")
    assert [o.type for o in resp.output] == ["message"]
    msg = resp.output[0]
    assert msg.id.startswith("msg_") and msg.role == "assistant"
    assert msg.content[0].type == "output_text" and msg.content[0].annotations == []
    assert resp.output_text == msg.content[0].text != ""
    assert resp.usage.output_tokens_details.reasoning_tokens == 0
    assert resp.instructions == "Answer briefly." and resp.reasoning.effort == "none"


def test_length_limit_makes_an_incomplete_response(client):
    resp = client.responses.create(model="tiny", input="Tell me a long story", max_output_tokens=3,
                                   reasoning=NO_THINKING, temperature=0.0)
    assert resp.status == "incomplete"
    assert resp.incomplete_details.reason == "max_output_tokens"
    assert resp.output[-1].status == "incomplete" and resp.usage.output_tokens == 3
    assert resp.max_output_tokens == 3


def test_logprobs_on_output_text(client):
    resp = client.responses.create(model="tiny", input="Hi", reasoning=NO_THINKING, max_output_tokens=12,
                                   include=["message.output_text.logprobs"], top_logprobs=3)
    lps = resp.output[0].content[0].logprobs
    assert 0 < len(lps) <= resp.usage.output_tokens
    for lp in lps:
        assert lp.logprob <= 0.0 and len(lp.top_logprobs) == 3 and isinstance(lp.bytes, list)
    # not asked: none
    resp = client.responses.create(model="tiny", input="Hi", reasoning=NO_THINKING, max_output_tokens=4)
    assert not resp.output[0].content[0].logprobs


def test_forced_tool_choice_gives_a_function_call(client):
    for choice in ("required", {"type": "function", "name": "get_weather"}):
        resp = client.responses.create(model="tiny", input="Weather in Paris?", tools=[WEATHER], tool_choice=choice,
                                       reasoning=NO_THINKING, max_output_tokens=200, temperature=0.0)
        calls = [o for o in resp.output if o.type == "function_call"]
        assert resp.status == "completed" and len(calls) >= 1
        call = calls[0]
        assert call.name == "get_weather" and call.id.startswith("fc_") and call.call_id and call.namespace is None
        jsonschema.validate(json.loads(call.arguments), WEATHER["parameters"])
        assert resp.tools[0].name == "get_weather"
        assert resp.tool_choice == choice or resp.tool_choice.name == "get_weather"
    # the call and its output sent back continue the conversation
    follow = client.responses.create(model="tiny", tools=[WEATHER], reasoning=NO_THINKING, max_output_tokens=8,
                                     input=[{"role": "user", "content": "Weather in Paris?"}, call,
                                            {"type": "function_call_output", "call_id": call.call_id,
                                             "output": "sunny, 21 C"}])
    assert follow.status in ("completed", "incomplete")
    items = list(client.responses.input_items.list(follow.id, order="asc"))
    assert [i.type for i in items] == ["message", "function_call", "function_call_output"]
    assert items[1].call_id == call.call_id and items[2].output == "sunny, 21 C"


def test_a_call_cut_by_max_output_tokens_is_not_returned(client):
    resp = client.responses.create(model="tiny", input="Weather?", tools=[WEATHER], tool_choice="required",
                                   reasoning=NO_THINKING, max_output_tokens=6)
    assert resp.status == "incomplete" and resp.incomplete_details.reason == "max_output_tokens"
    assert all(o.type != "function_call" for o in resp.output)


NAMESPACE = {"type": "namespace", "name": "mcp__computer", "description": "Computer control.",
             "tools": [{"type": "function", "name": "get_app_state", "description": "An app's state.",
                        "parameters": {"type": "object", "properties": {"app": {"type": "string",
                                                                                 "enum": ["chrome", "mail"]}},
                                       "required": ["app"], "additionalProperties": False}}]}


def test_namespace_tools_come_back_with_their_namespace(client):
    resp = client.responses.create(model="tiny", input="Inspect Chrome.", tools=[NAMESPACE], tool_choice="required",
                                   reasoning=NO_THINKING, max_output_tokens=200, temperature=0.0,
                                   extra_body={"enable_response_messages": True})
    call = next(o for o in resp.output if o.type == "function_call")
    assert call.name == "get_app_state" and call.namespace == "mcp__computer"
    assert json.loads(call.arguments)["app"] in ("chrome", "mail")
    # the model saw (and wrote) the flat name
    assert "mcp__computer__get_app_state" in resp.input_messages[0]["message"]
    assert resp.tools[0].type == "namespace"
    # named through its namespace
    resp = client.responses.create(model="tiny", input="Inspect Chrome.", tools=[NAMESPACE], reasoning=NO_THINKING,
                                   tool_choice={"type": "function", "name": "get_app_state",
                                                "namespace": "mcp__computer"}, max_output_tokens=200)
    call = next(o for o in resp.output if o.type == "function_call")
    assert (call.namespace, call.name) == ("mcp__computer", "get_app_state")
    # sent back: the template gets the flat name again
    follow = client.responses.create(model="tiny", tools=[NAMESPACE], reasoning=NO_THINKING, max_output_tokens=4,
                                     input=[{"role": "user", "content": "Inspect Chrome."}, call,
                                            {"type": "function_call_output", "call_id": call.call_id, "output": "ok"}],
                                     extra_body={"enable_response_messages": True})
    prompt = follow.input_messages[0]["message"]
    assert prompt.count("mcp__computer__get_app_state") >= 2 and "ok" in prompt


SCHEMA = {"type": "object", "properties": {"color": {"type": "string", "enum": ["red", "green"]},
                                           "ok": {"type": "boolean"}},
          "required": ["color", "ok"], "additionalProperties": False}


def test_json_schema_format_constrains_the_output(client):
    resp = client.responses.create(model="tiny", input="A color?", reasoning=NO_THINKING, max_output_tokens=120,
                                   temperature=0.0, text={"format": {"type": "json_schema", "name": "pick",
                                                                     "schema": SCHEMA, "strict": True}})
    assert resp.status == "completed"
    jsonschema.validate(json.loads(resp.output_text), SCHEMA)
    assert resp.text.format.type == "json_schema" and resp.text.format.name == "pick"
    resp = client.responses.create(model="tiny", input="JSON please", reasoning=NO_THINKING, max_output_tokens=200,
                                   temperature=0.0, text={"format": {"type": "json_object"}})
    if resp.status == "completed":
        assert isinstance(json.loads(resp.output_text), dict)


def test_parse_with_a_pydantic_model(client):
    class Pick(BaseModel):
        color: str
        ok: bool

    # the client turns the model into a strict json_schema format; the answer parses back into it
    resp = client.responses.parse(model="tiny", input="A color?", text_format=Pick, reasoning=NO_THINKING,
                                  max_output_tokens=300, temperature=0.0)
    assert resp.status == "completed"
    assert isinstance(resp.output_parsed, Pick)


def test_vllm_extras_and_response_messages(client):
    resp = client.responses.create(model="tiny", input="Hello?", max_output_tokens=8, temperature=0.7, top_p=0.9,
                                   extra_body={"top_k": 40, "repetition_penalty": 1.2, "seed": 42, "min_p": 0.01,
                                               "enable_response_messages": True})
    im, om = resp.input_messages[0], resp.output_messages[0]
    assert im["type"] == om["type"] == "raw_message_tokens"
    assert "Hello?" in im["message"] and len(im["tokens"]) == resp.usage.input_tokens
    assert len(om["tokens"]) == resp.usage.output_tokens and isinstance(om["message"], str)
    # a seed makes the answer reproducible
    again = client.responses.create(model="tiny", input="Hello?", max_output_tokens=8, temperature=0.7, top_p=0.9,
                                    extra_body={"top_k": 40, "repetition_penalty": 1.2, "seed": 42, "min_p": 0.01,
                                                "enable_response_messages": True})
    assert again.output_messages[0]["tokens"] == om["tokens"]


def test_input_items_shapes_reach_the_template(client):
    history = [
        {"role": "developer", "content": "Be terse."},
        {"type": "message", "role": "user", "content": [{"type": "input_text", "text": "MARK-1"}]},
        {"type": "reasoning", "id": "rs_x", "summary": [], "content": [{"type": "reasoning_text", "text": "THINK-2"}]},
        {"type": "message", "role": "assistant", "id": "msg_x", "status": "completed",
         "content": [{"type": "output_text", "text": "ANSWER-3"}]},
        {"type": "reasoning", "summary": [], "encrypted_content": None},       # empty: dropped
        {"role": "user", "content": "MARK-4"},
    ]
    resp = client.responses.create(model="tiny", input=history, max_output_tokens=4,
                                   extra_body={"enable_response_messages": True})
    prompt = resp.input_messages[0]["message"]
    order = [prompt.index(s) for s in ("Be terse.", "MARK-1", "ANSWER-3", "MARK-4")]
    assert order == sorted(order) and prompt.startswith("<|im_start|>system")


def test_ignored_fields_are_named(server):
    r = post(server, {"input": "Hi", "max_output_tokens": 2, "service_tier": "flex", "user": "u1",
                      "reasoning": {"effort": "high", "summary": "auto"}, "frobnicate": 1,
                      "include": ["reasoning.encrypted_content"], "truncation": "auto"})
    assert r.status_code == 200
    names = r.headers["x-g906-ignored-fields"].split(", ")
    for n in ("frobnicate", "service_tier", "user", "reasoning.summary", "reasoning.effort",
              "include[reasoning.encrypted_content]"):
        assert n in names
    body = r.json()
    assert body["service_tier"] == "flex" and body["user"] == "u1" and body["truncation"] == "auto"


@pytest.mark.parametrize("body,param,words", [
    ({"input": "x", "tools": [WEATHER, {"type": "web_search"}]}, "tools.1.type", "web_search"),
    ({"input": [{"role": "user", "content": [{"type": "input_audio"}]}]}, "input.0.content.0.type", "input_audio"),
    ({"input": [{"role": "user", "content": "a"}, {"type": "item_reference", "id": "x"}]}, "input.1.type",
     "item_reference"),
    ({"input": [{"role": "tool", "content": "a"}]}, "input.0.role", "role"),
    ({"input": [{"type": "function_call", "call_id": "c", "name": "f", "arguments": "{nope"}]}, "input.0.arguments",
     "JSON"),
    ({"input": [{"type": "function_call_output", "output": "x"}]}, "input.0.call_id", "call_id"),
    ({"input": "x", "text": {"format": {"type": "yaml"}}}, "text.format.type", "yaml"),
    ({"input": "x", "text": {"format": {"type": "json_schema", "name": "a"}}}, "text.format.schema", "schema"),
    ({"input": "x", "reasoning": {"effort": "max"}}, "reasoning.effort", "max"),
    ({"input": "x", "include": ["everything"]}, "include.0", "everything"),
    ({"input": "x", "tools": [WEATHER], "tool_choice": {"type": "function", "name": "nope"}}, "tool_choice.name",
     "nope"),
    ({"input": "x", "tool_choice": {"type": "web_search_preview"}}, "tool_choice.type", "web_search"),
    ({"input": "x", "tool_choice": "required"}, "tool_choice", "needs tools"),
    ({"input": "x", "tools": [{"type": "namespace", "name": "n", "tools": [{"type": "mcp"}]}]},
     "tools.0.tools.0.type", "mcp"),
    ({"input": "x", "tools": [{"type": "function", "name": "a b"}]}, "tools.0.name", "a b"),
    ({"input": "x", "top_logprobs": 21}, "top_logprobs", "20"),
    ({"input": "x", "max_output_tokens": 0}, "max_output_tokens", "1"),
    ({"input": 5}, "input", "input"),
    ({"input": []}, "input", "no content"),
    ({"input": "x", "background": True, "store": False}, "background", "background can only be used when `store` is true"),
    ({"input": "x", "model": "gpt-5"}, "model", "gpt-5"),
])
def test_bad_requests_name_the_field(server, body, param, words):
    r = post(server, body)
    assert r.status_code == 400, r.text
    err = r.json()["error"]
    assert err["param"] == param and words in err["message"], err
    assert err["type"] == "invalid_request_error"


def test_api_key_applies_to_every_route(server):
    for method, path in (("POST", "/responses"), ("GET", "/responses/resp_x"), ("DELETE", "/responses/resp_x"),
                         ("POST", "/responses/resp_x/cancel"), ("GET", "/responses/resp_x/input_items")):
        r = httpx.request(method, server.v1 + path, json={"input": "x"}, timeout=30)
        assert r.status_code == 401, (method, path, r.text)
        assert r.json()["error"]["type"] == "invalid_request_error"


def test_requests_are_counted_in_metrics(client, server):
    before = server.metrics().get("g906:prompt_tokens_total", 0.0)
    resp = client.responses.create(model="tiny", input="count me", max_output_tokens=2)
    assert server.metrics()["g906:prompt_tokens_total"] >= before + resp.usage.input_tokens


def test_openapi_lists_the_routes(server):
    doc = httpx.get(server.url + "/openapi.json", timeout=30, headers={"Authorization": f"Bearer {API_KEY}"}).json()
    for path in ("/v1/responses", "/v1/responses/{response_id}", "/v1/responses/{response_id}/cancel",
                 "/v1/responses/{response_id}/input_items"):
        assert path in doc["paths"]
    assert "ResponsesRequest" in doc["components"]["schemas"]


def test_errors_of_the_chat_route_name_responses_fields(server):
    # the context limit; a template variable the template cannot take
    r = post(server, {"input": "x", "chat_template_kwargs": {"tools": 5}})
    assert r.status_code == 400 and r.json()["error"]["param"] == "chat_template_kwargs", r.text
    r = post(server, {"input": "word " * 600, "max_output_tokens": 4})
    assert r.status_code == 400 and r.json()["error"]["param"] == "input", r.text
    assert r.json()["error"]["code"] == "context_length_exceeded"


def test_truncation_auto_drops_the_oldest_exchanges(client, server):
    long = "word " * 40                         # some 40-80 tokens a turn; the context is 512
    convo = []
    for k in range(8):
        convo += [{"role": "user", "content": f"TURN-{k} {long}"}, {"role": "assistant", "content": f"ANSWER-{k}"}]
    convo.append({"role": "user", "content": "LAST"})
    r = post(server, {"input": convo, "instructions": "SYS", "max_output_tokens": 4})
    assert r.status_code == 400 and r.json()["error"]["code"] == "context_length_exceeded"
    resp = client.responses.create(model="tiny", input=convo, instructions="SYS", max_output_tokens=4,
                                   truncation="auto", extra_body={"enable_response_messages": True})
    prompt = resp.input_messages[0]["message"]
    kept = [k for k in range(8) if f"TURN-{k}" in prompt]
    assert "SYS" in prompt and "LAST" in prompt and kept and kept == list(range(8 - len(kept), 8)) and 0 not in kept
    assert resp.truncation == "auto" and resp.usage.input_tokens < 512
    # the stored conversation is whole: only what this request sent was cut
    assert len(list(client.responses.input_items.list(resp.id, limit=100))) == len(convo)
