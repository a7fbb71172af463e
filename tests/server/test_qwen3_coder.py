"""The qwen3_coder tool parser: Qwen3.5's XML calls, converted by the tools' schemas and with the
malformed-output fallbacks of vLLM's parser of the same name (tool_outputs.CASES); every split of
the same output gives the same answer."""

from __future__ import annotations

import json

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from g906.server.parsers.base import ToolSpec, merge_tool_calls
from g906.server.parsers.qwen3_coder import Qwen3CoderToolParser
from g906.server.parsers.values import convert_value

from .agent_conversation import TOOLS
from .tool_outputs import CASES

SPECS = [ToolSpec(t["function"]["name"], t["function"]["parameters"]) for t in TOOLS]


def parse(pieces, max_calls=None):
    p = Qwen3CoderToolParser(tools=SPECS, max_calls=max_calls)
    content, deltas = "", []
    for piece in pieces:
        c, d = p.feed(piece)
        content, deltas = content + c, deltas + d
    c, d = p.finish()
    content, deltas = content + c, deltas + d
    calls = merge_tool_calls(deltas)
    return (content if content or not calls else None), [(c.name, json.loads(c.arguments)) for c in calls], calls


@pytest.mark.parametrize("name", list(CASES))
def test_outputs_parse_as_vllm_does(name):
    text, content, calls = CASES[name]
    got_content, got_calls, raw = parse([text])
    assert (got_content, got_calls) == (content, calls)
    for c in raw:
        assert c.id.startswith("call_") and len(c.id) == 29
        assert c.arguments == json.dumps(json.loads(c.arguments), ensure_ascii=False)   # vLLM's spacing


@settings(max_examples=200, deadline=None)
@given(name=st.sampled_from(list(CASES)), cuts=st.lists(st.integers(0, 200), max_size=20))
def test_any_split_gives_the_same_answer(name, cuts):
    text = CASES[name][0]
    points = sorted({min(c, len(text)) for c in cuts} | {0, len(text)})
    pieces = [text[a:b] for a, b in zip(points, points[1:])]
    assert parse(pieces)[:2] == parse([text])[:2]


def test_a_call_cut_by_the_token_limit_is_left_unterminated():
    text = CASES["content_then_parallel"][0]
    last_param = text.rindex("<parameter=")
    for end, written in ((last_param + len("<parameter=unit>\ncel"), '{"city": "Oslo"'),   # inside a value
                         (last_param, '{"city": "Oslo"'), (text.rindex("</function>"), '{"city": "Oslo", "unit": "celsius"')):
        p = Qwen3CoderToolParser(tools=SPECS)
        _, deltas = p.feed(text[:end])
        calls = merge_tool_calls(deltas + p.finish(cut=True)[1])
        assert [json.loads(c.arguments) for c in calls[:-1]] == [{"city": "Paris", "days": 3}]
        assert calls[-1].arguments == written     # no "}": no client takes it for a whole call (nor does OpenAI send one)
    p = Qwen3CoderToolParser(tools=SPECS)          # calls that ended before the limit stay whole
    _, deltas = p.feed(text)
    assert all(isinstance(json.loads(c.arguments), dict) for c in merge_tool_calls(deltas + p.finish(cut=True)[1]))


def test_parallel_tool_calls_false_keeps_the_first():
    _, calls, _ = parse([CASES["content_then_parallel"][0]], max_calls=1)
    assert calls == [("get_weather", {"city": "Paris", "days": 3})]


def test_stream_order_header_then_arguments():
    p = Qwen3CoderToolParser(tools=SPECS)
    content, deltas = p.feed("Hi " + CASES["single"][0][:40])
    assert content == "Hi "
    assert deltas[0].name == "get_weather" and deltas[0].id and deltas[0].arguments == ""
    assert all(d.name is None for d in deltas[1:])


@pytest.mark.parametrize("schema,text,value", [
    ({"type": "string"}, "null", "null"),
    ({"type": "integer"}, "-7", -7),
    ({"type": "integer"}, "None", None),
    ({"type": "number"}, "1e3", 1000),
    ({"type": "number"}, "inf", "inf"),
    ({"type": "boolean"}, "TRUE", True),
    ({"type": "array"}, "['a', 1]", ["a", 1]),
    ({"type": "object"}, "\"{'k': 1}\"", {"k": 1}),
    ({"type": "object"}, "{1, 2}", "{1, 2}"),              # a Python set: JSON cannot hold it
    ({"anyOf": [{"type": "integer"}, {"type": "null"}]}, "4", 4),
    ({"type": "null"}, "None", None),
    ({}, "3", "3"),                                       # no type: text
])
def test_value_conversion(schema, text, value):
    assert convert_value(text, "p", {"p": schema}) == value
