"""Tool calls and structured outputs through a real `g906 up` (builtin:tiny-qwen35 with the real
Qwen3.5 chat template) and the official openai client, streamed and not:

- fixed model outputs (forced with structured_outputs.choice, so the random model writes exactly
  them) parse into the tool calls vLLM's qwen3_coder parser makes of them;
- tool_choice "required" and a named function give calls valid against the tool's schema;
- response_format json_schema / json_object, regex and choice outputs match, on chat and completions;
- an agent conversation renders the same prompt tokens as transformers and returns 200;
- bad tools, tool choices and constraints are 400s naming the field, and the server stays healthy."""

from __future__ import annotations

import json
import re

import httpx
import jsonschema
import pytest

from g906.engine.builtin import build_tokenizer

from .agent_conversation import (AGENT_CONVERSATION, QWEN35_TEMPLATE, QWEN35_TEMPLATE_PATH, TOOLS, hf_tokenizer_for,
                                 reference_messages)
from .conftest import API_KEY, openai_client, serving
from .tool_outputs import CASES

RECIPE = f"""
[model]
source = "builtin:tiny-qwen35"
name = "tiny"
chat_template = "{QWEN35_TEMPLATE_PATH}"

[limits]
max_model_len = 4096
max_num_seqs = 8
max_num_batched_tokens = 512

[engine]
reasoning_parser = "qwen3"

[server]
api_key_env = "G906_TEST_API_KEY"
"""

NO_THINK = {"chat_template_kwargs": {"enable_thinking": False}}
USER = [{"role": "user", "content": "Weather in Paris?"}]

# tools a random model can satisfy in a few tokens: bounded strings, numbers and lists
SMALL = [
    {"type": "function", "function": {"name": "get_weather", "parameters": {
        "type": "object", "properties": {
            "city": {"type": "string", "minLength": 1, "maxLength": 6},
            "days": {"type": "integer", "minimum": 1, "maximum": 14},
            "unit": {"type": "string", "enum": ["celsius", "fahrenheit"]}},
        "required": ["city", "unit"], "additionalProperties": False}}},
    {"type": "function", "function": {"name": "configure", "parameters": {
        "type": "object", "properties": {
            "enabled": {"type": "boolean"},
            "ratio": {"type": "number", "minimum": 0, "maximum": 1},
            "note": {"anyOf": [{"type": "string", "maxLength": 4}, {"type": "null"}]},
            "options": {"type": "object", "properties": {"depth": {"type": "integer", "minimum": 0, "maximum": 9}},
                        "required": ["depth"], "additionalProperties": False},
            "tags": {"type": "array", "items": {"type": "string", "enum": ["a", "b"]}, "maxItems": 2}},
        "required": ["enabled", "options"], "additionalProperties": False}}},
]
SCHEMAS = {t["function"]["name"]: t["function"]["parameters"] for t in SMALL}


@pytest.fixture(scope="module")
def tserver(tmp_path_factory):
    yield from serving(tmp_path_factory.mktemp("g906-tools"), RECIPE)


@pytest.fixture(scope="module")
def tclient(tserver):
    return openai_client(tserver)


def forced(text: str) -> dict:
    return {**NO_THINK, "structured_outputs": {"choice": [text]}}


def stream_message(client, **kw):
    """The streamed answer joined: (content, tool calls [(id, name, arguments)], finish_reason)."""
    content, calls, finish = "", {}, None
    for chunk in client.chat.completions.create(stream=True, **kw):
        if not chunk.choices:
            continue
        ch = chunk.choices[0]
        content += ch.delta.content or ""
        for t in ch.delta.tool_calls or []:
            if t.index not in calls:
                assert t.id and t.type == "function" and t.function.name
                calls[t.index] = [t.id, t.function.name, t.function.arguments or ""]
            else:
                calls[t.index][2] += t.function.arguments or ""
        finish = ch.finish_reason or finish
    return content or None, [tuple(calls[i]) for i in sorted(calls)], finish


STREAMED = {"single", "content_then_parallel", "typed", "nullable", "nested_object", "closing_tag_inside_a_value",
            "unknown_function", "invalid_json_object", "missing_closing_tags", "plain_text"}


@pytest.mark.parametrize("name", list(CASES))
def test_fixed_outputs_parse_as_vllm_does(tclient, name):
    text, content, calls = CASES[name]
    kw = dict(model="tiny", messages=USER, tools=TOOLS, max_tokens=400, extra_body=forced(text))
    r = tclient.chat.completions.create(**kw)
    msg = r.choices[0].message
    assert msg.content == content
    assert [(c.function.name, json.loads(c.function.arguments)) for c in msg.tool_calls or []] == calls
    assert all(c.id.startswith("call_") and c.type == "function" for c in msg.tool_calls or [])
    assert r.choices[0].finish_reason == ("tool_calls" if calls else "stop")
    if name not in STREAMED:
        return          # the assembler's property test covers every split of every output
    s_content, s_calls, s_finish = stream_message(tclient, **kw)
    assert s_content == content
    assert [(n, json.loads(a)) for _, n, a in s_calls] == calls
    assert s_finish == r.choices[0].finish_reason


@pytest.mark.parametrize("seed", range(3))
def test_thinking_stays_free_and_the_answer_is_constrained(tclient, seed):
    """With thinking on (the template opens <think>), the constraint starts after </think>: the
    random model's reasoning is its own, and once it closes it the answer is the forced call."""
    r = tclient.chat.completions.create(model="tiny", messages=USER, tools=TOOLS, max_tokens=300, seed=seed,
                                        extra_body={"structured_outputs": {"choice": [CASES["single"][0]]}})
    ch = r.choices[0]
    assert ch.message.reasoning_content and not ch.message.reasoning_content.startswith("<tool_call>")
    # the model may run out inside its reasoning (a stop token there closes it instead of ending
    # the request); whatever follows a </think> is the call
    assert ch.message.content is None
    if ch.message.tool_calls:
        assert ch.finish_reason == "tool_calls"
        assert [json.loads(c.function.arguments) for c in ch.message.tool_calls] == [{"city": "Paris"}]


def test_parallel_tool_calls_false_and_tool_choice_none(tclient):
    text = CASES["content_then_parallel"][0]
    r = tclient.chat.completions.create(model="tiny", messages=USER, tools=TOOLS, max_tokens=400,
                                        parallel_tool_calls=False, extra_body=forced(text))
    assert [json.loads(c.function.arguments) for c in r.choices[0].message.tool_calls] == [{"city": "Paris", "days": 3}]
    r = tclient.chat.completions.create(model="tiny", messages=USER, tools=TOOLS, max_tokens=400,
                                        tool_choice="none", extra_body=forced(text))
    assert r.choices[0].message.content == text and not r.choices[0].message.tool_calls
    assert r.choices[0].finish_reason == "stop"


def _check_calls(calls, allowed):
    assert calls, "no tool call"
    for name, args in calls:
        assert name in allowed
        jsonschema.validate(json.loads(args), SCHEMAS[name])


@pytest.mark.parametrize("seed", range(3))
def test_tool_choice_required_gives_schema_valid_calls(tclient, seed):
    kw = dict(model="tiny", messages=USER, tools=SMALL, tool_choice="required", max_tokens=600, seed=seed,
              extra_body=NO_THINK)
    r = tclient.chat.completions.create(parallel_tool_calls=False, **kw)
    assert r.choices[0].finish_reason == "tool_calls"
    assert len(r.choices[0].message.tool_calls) == 1
    _check_calls([(c.function.name, c.function.arguments) for c in r.choices[0].message.tool_calls], SCHEMAS)
    content, calls, finish = stream_message(tclient, **kw)
    if finish == "tool_calls":
        _check_calls([(n, a) for _, n, a in calls], SCHEMAS)


@pytest.mark.parametrize("seed", range(3))
def test_named_tool_choice_calls_that_function(tclient, seed):
    r = tclient.chat.completions.create(
        model="tiny", messages=USER, tools=SMALL, max_tokens=200, seed=seed, n=2,
        tool_choice={"type": "function", "function": {"name": "configure"}})
    for ch in r.choices:   # thinking on: the reasoning is free, the call follows </think> (unless cut by length)
        if ch.finish_reason == "tool_calls":
            _check_calls([(c.function.name, c.function.arguments) for c in ch.message.tool_calls], {"configure"})
    r = tclient.chat.completions.create(
        model="tiny", messages=USER, tools=SMALL, max_tokens=600, seed=seed, extra_body=NO_THINK,
        tool_choice={"type": "function", "function": {"name": "configure"}})
    assert r.choices[0].finish_reason == "tool_calls"
    _check_calls([(c.function.name, c.function.arguments) for c in r.choices[0].message.tool_calls], {"configure"})


# the random model pushed to end inside its thinking: a stop token comes early, while the
# constraint still waits for </think> (g906/engine/constrained_thinking.py)
STOPS_EARLY = {"425": 3, "427": 3}
NAMED = {"type": "function", "function": {"name": "configure"}}


@pytest.mark.parametrize("seed", range(4))
def test_forced_tool_choice_with_thinking_always_calls(tclient, seed):
    """Thinking on, tool_choice "required" or named: a stop token inside the thinking closes it
    and the call follows, every time, streamed or not, n = 2 too; tool_choice auto (no
    constraint) still ends inside the thinking."""
    assert build_tokenizer().encode("</think>") == [429]
    kw = dict(model="tiny", messages=USER, tools=SMALL, max_tokens=600, seed=seed, logit_bias=STOPS_EARLY)
    for choice, allowed in (("required", set(SCHEMAS)), (NAMED, {"configure"})):
        r = tclient.chat.completions.create(tool_choice=choice, n=2, **kw)
        for ch in r.choices:
            assert ch.finish_reason == "tool_calls" and ch.message.tool_calls, ch
            assert ch.message.content is None and ch.message.reasoning_content is not None
            _check_calls([(c.function.name, c.function.arguments) for c in ch.message.tool_calls], allowed)
        content, calls, finish = stream_message(tclient, tool_choice=choice, **kw)
        assert finish == "tool_calls" and calls and content is None
        _check_calls([(n, a) for _, n, a in calls], allowed)
    # without a constraint (and with </think> out of reach) the same request ends in its thinking
    kw["logit_bias"] = {**STOPS_EARLY, "429": -100}
    free = tclient.chat.completions.create(tool_choice="auto", **kw).choices[0]
    assert free.finish_reason == "stop" and not free.message.tool_calls and free.message.content is None


PERSON = {"type": "object", "properties": {
    "name": {"type": "string", "maxLength": 8}, "age": {"type": "integer", "minimum": 0, "maximum": 120},
    "tags": {"type": "array", "items": {"enum": ["x", "y"]}, "maxItems": 3}},
    "required": ["name", "age"], "additionalProperties": False}


@pytest.mark.parametrize("seed", range(3))
def test_json_schema_outputs_validate(tclient, seed):
    rf = {"type": "json_schema", "json_schema": {"name": "person", "schema": PERSON, "strict": True}}
    r = tclient.chat.completions.create(model="tiny", messages=USER, response_format=rf, max_tokens=300, seed=seed,
                                        extra_body=NO_THINK)
    assert r.choices[0].finish_reason == "stop"
    jsonschema.validate(json.loads(r.choices[0].message.content), PERSON)
    chunks = tclient.chat.completions.create(model="tiny", messages=USER, response_format=rf, max_tokens=300,
                                             seed=seed, stream=True, extra_body=NO_THINK)
    text = "".join(c.choices[0].delta.content or "" for c in chunks if c.choices)
    assert text == r.choices[0].message.content          # same seed, same tokens
    r = tclient.chat.completions.create(model="tiny", messages=USER, response_format={"type": "json_object"},
                                        max_tokens=300, seed=seed, extra_body=NO_THINK)
    if r.choices[0].finish_reason == "stop":
        assert isinstance(json.loads(r.choices[0].message.content), dict)


@pytest.mark.parametrize("seed", range(4))
def test_json_schema_with_thinking_always_answers(tclient, seed):
    """Thinking on, response_format json_schema / json_object: the reasoning, then JSON valid
    under the schema, even where the model samples its end token while thinking."""
    rf = {"type": "json_schema", "json_schema": {"name": "person", "schema": PERSON, "strict": True}}
    kw = dict(model="tiny", messages=USER, max_tokens=400, seed=seed, logit_bias=STOPS_EARLY)
    r = tclient.chat.completions.create(response_format=rf, **kw)
    ch = r.choices[0]
    assert ch.finish_reason == "stop" and ch.message.reasoning_content is not None
    jsonschema.validate(json.loads(ch.message.content), PERSON)
    chunks = tclient.chat.completions.create(response_format=rf, stream=True, **kw)
    assert "".join(c.choices[0].delta.content or "" for c in chunks if c.choices) == ch.message.content
    ch = tclient.chat.completions.create(response_format={"type": "json_object"}, **kw).choices[0]
    assert ch.message.content.lstrip().startswith("{")      # the answer began (a random object may run long)
    if ch.finish_reason == "stop":
        assert isinstance(json.loads(ch.message.content), dict)


@pytest.mark.parametrize("seed", range(3))
def test_regex_and_choice_on_completions_and_chat(tclient, seed):
    pattern = r"[a-c]{2}-[0-9]{1,3}"
    r = tclient.completions.create(model="tiny", prompt="Code:", max_tokens=20, seed=seed, n=2,
                                   extra_body={"structured_outputs": {"regex": pattern}})
    for ch in r.choices:
        assert re.fullmatch(pattern, ch.text) and ch.finish_reason == "stop"
    r = tclient.completions.create(model="tiny", prompt="Pick:", max_tokens=20, seed=seed,
                                   extra_body={"guided_choice": ["red", "green", "blue"]}, stream=True)
    assert "".join(c.choices[0].text for c in r) in ("red", "green", "blue")
    r = tclient.chat.completions.create(model="tiny", messages=USER, max_tokens=20, seed=seed,
                                        extra_body={**NO_THINK, "guided_regex": pattern})
    assert re.fullmatch(pattern, r.choices[0].message.content)
    r = tclient.completions.create(model="tiny", prompt="{", max_tokens=120, seed=seed, extra_body={
        "structured_outputs": {"json": PERSON, "disable_any_whitespace": True}})
    assert r.choices[0].text.startswith('{"') and " " not in r.choices[0].text.split('"name":')[0]
    jsonschema.validate(json.loads(r.choices[0].text), PERSON)
    r = tclient.completions.create(model="tiny", prompt="x", max_tokens=30, seed=seed, stop=["-"],
                                   extra_body={"structured_outputs": {"grammar": 'start: "ab" "-" /[0-9]+/'}})
    assert r.choices[0].text == "ab" and r.choices[0].finish_reason == "stop"   # a stop string still stops


def test_agent_conversation_prompt_tokens(tclient):
    r = tclient.chat.completions.create(model="tiny", messages=AGENT_CONVERSATION, tools=TOOLS, max_tokens=2)
    hf = hf_tokenizer_for(build_tokenizer(), QWEN35_TEMPLATE)
    ids = hf.apply_chat_template(reference_messages(AGENT_CONVERSATION), tools=TOOLS, add_generation_prompt=True,
                                 tokenize=True, return_dict=False)
    assert r.usage.prompt_tokens == len(ids)


BAD = [
    ({"tools": [{"type": "function", "function": {"parameters": {}}}]}, "tools.0.function.name"),
    ({"tools": [{"type": "function", "function": {"name": "f", "parameters": {"type": "string"}}}]},
     "tools.0.function.parameters"),
    ({"tools": [{"type": "retrieval"}]}, "tools.0.type"),
    ({"tools": SMALL, "tool_choice": {"type": "function", "function": {"name": "nope"}}}, "tool_choice"),
    ({"tools": SMALL, "tool_choice": "sometimes"}, "tool_choice"),
    ({"tools": [{"type": "function", "function": {"name": "f", "parameters": {
        "type": "object", "properties": {"a": {"type": "wat"}}}}}], "tool_choice": "required"}, "tool_choice"),
    ({"tool_choice": "required"}, "tool_choice"),
    ({"structured_outputs": {"regex": "a(b"}}, "structured_outputs"),
    ({"structured_outputs": {"json": {"type": "wat"}}}, "structured_outputs"),
    ({"structured_outputs": {"grammar": "start: nothing_here"}}, "structured_outputs"),
    ({"structured_outputs": {"regex": "a", "choice": ["a"]}}, "structured_outputs"),
    ({"structured_outputs": {"choice": []}}, "structured_outputs"),
    ({"guided_json": "{not json"}, "guided_json"),
    ({"response_format": {"type": "json_schema"}}, "response_format.json_schema"),
    ({"response_format": {"type": "json_object"}, "guided_regex": "a"}, "response_format"),
    ({"tools": SMALL, "tool_choice": "required", "guided_regex": "a"}, "guided_regex"),
    ({"messages": [{"role": "user", "content": "x"}, {"role": "assistant", "tool_calls": [
        {"type": "function", "function": {"name": "f", "arguments": "{oops"}}]}, {"role": "user", "content": "y"}]},
     "messages.1.tool_calls.0.function.arguments"),
]


@pytest.mark.parametrize("extra,param", BAD)
def test_bad_tools_and_constraints_are_400(tserver, extra, param):
    body = {"messages": USER, "max_tokens": 2, **extra}
    r = httpx.post(tserver.v1 + "/chat/completions", json=body, headers={"Authorization": f"Bearer {API_KEY}"},
                   timeout=60)
    assert r.status_code == 400, r.text
    err = r.json()["error"]
    assert err["param"] == param and err["message"], err
    ok = httpx.post(tserver.v1 + "/completions", json={"prompt": "hi", "max_tokens": 2,
                                                       "structured_outputs": {"regex": "[0-9"}},
                    headers={"Authorization": f"Bearer {API_KEY}"}, timeout=60)
    assert ok.status_code == 400 and "regex" in ok.json()["error"]["message"]
    assert httpx.get(tserver.url + "/health", timeout=10).status_code == 200
