"""The Responses output builder in-process, on made-up parsed deltas: items in the order the model
produced them, the events of each, a call cut off by the length limit left out (one written whole
before the limit kept), and logprobs only on the text's tokens."""

from __future__ import annotations

from types import SimpleNamespace

from g906.server.assembler import ParsedDelta
from g906.server.parsers import ToolCallDelta
from g906.server.responses_answers import OutputBuilder
from g906.server.responses_protocol import ResponsesRequest, translate


def builder(body: dict) -> OutputBuilder:
    req = ResponsesRequest.model_validate(body)
    ctx = SimpleNamespace(tr=translate(req, []), eng=FakeEngine())
    return OutputBuilder(ctx)


class FakeEngine:
    def token_bytes(self, t):
        return f"t{t}".encode()

    def token_text(self, t):
        return f"t{t}"


def lp(t):
    return SimpleNamespace(token_id=t, logprob=-0.5, top=[(t, -0.5)])


def delta(reasoning="", content="", calls=(), lps=(), finished=False, reason=None) -> ParsedDelta:
    return ParsedDelta(index=0, text=reasoning + content, reasoning=reasoning, content=content,
                       tool_calls=list(calls), logprobs=list(lps), text_offset=0, finished=finished,
                       finish_reason=reason, stop_reason=None)


TOOLS = {"input": "x", "tools": [{"type": "function", "name": "f"},
                                 {"type": "namespace", "name": "ns", "tools": [{"type": "function", "name": "g"}]}]}


def test_items_in_order_with_their_events():
    b = builder(TOOLS | {"include": ["message.output_text.logprobs"]})
    events = []
    events += b.feed(delta(reasoning="think", lps=[lp(1)]))
    events += b.feed(delta(reasoning="ing", content="Hi", lps=[lp(2), lp(3)]))
    events += b.feed(delta(calls=[ToolCallDelta(0, "call_1", "f", "{\"a\": ")], lps=[lp(4)]))
    events += b.feed(delta(calls=[ToolCallDelta(0, None, None, "1}"), ToolCallDelta(1, "call_2", "ns__g", "{}")]))
    events += b.feed(delta(finished=True, reason="stop"))
    events += b.finish("stop")
    assert [i["type"] for i in b.items] == ["reasoning", "message", "function_call", "function_call"]
    rs, msg, f, g = b.items
    assert rs["content"] == [{"type": "reasoning_text", "text": "thinking"}]
    assert msg["content"][0]["text"] == "Hi" and [x["token"] for x in msg["content"][0]["logprobs"]] == ["t2", "t3"]
    assert (f["name"], f["arguments"], f["call_id"]) == ("f", "{\"a\": 1}", "call_1") and "namespace" not in f
    assert (g["name"], g["namespace"]) == ("g", "ns")
    assert all(i["status"] == "completed" for i in b.items) and b.status == "completed"
    kinds = [e["type"] for e in events]
    assert kinds.count("response.output_item.added") == kinds.count("response.output_item.done") == 4
    done = [e for e in events if e["type"] == "response.function_call_arguments.done"]
    assert [(e["name"], e["arguments"]) for e in done] == [("f", "{\"a\": 1}"), ("g", "{}")]


def test_length_cut_drops_an_unfinished_call_only():
    b = builder(TOOLS)
    b.feed(delta(calls=[ToolCallDelta(0, "c1", "f", "{}")]))               # whole before the end
    b.feed(delta(calls=[ToolCallDelta(1, "c2", "f", "{\"a\": ")]))
    events = b.feed(delta(calls=[ToolCallDelta(1, None, None, "1}")], finished=True, reason="length"))
    events += b.finish("length")
    assert b.status == "incomplete"
    assert [i["call_id"] for i in b.items] == ["c1"]
    # the stream had announced it: its item is closed as incomplete
    assert events[-1]["type"] == "response.output_item.done" and events[-1]["item"]["status"] == "incomplete"


def test_no_logprobs_unless_asked():
    b = builder({"input": "x"})
    b.feed(delta(content="Hi", lps=[lp(1)]))
    assert b.items[0]["content"][0]["logprobs"] == []
