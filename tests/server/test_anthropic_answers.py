"""The Anthropic dialect at unit level, with fixed engine outputs: thinking split from text (the
qwen3 reasoning parser), tool_use blocks (the qwen3_coder tool parser), stop reasons, and the
streamed events, which the official client reassembles into the same message as the full answer;
and the request translation (blocks into chat messages)."""

from __future__ import annotations

import asyncio
import json

import pytest
from anthropic.lib.streaming._messages import accumulate_event
from anthropic.types import Message, RawMessageStreamEvent
from pydantic import TypeAdapter

from g906.server.anthropic_answers import message_full, message_stream
from g906.server.anthropic_protocol import MessagesRequest, to_chat_request
from g906.server.assembler import ResponseAssembler
from g906.server.errors import APIError
from g906.server.generation import GenerationRequest, Prompt
from g906.server.parsers.base import ToolSpec
from g906.server.tools import ToolChoice

from .agent_conversation import TOOLS
from .test_assembler import FakeStream, outputs
from .tool_outputs import call

OPEN_PROMPT = "<|im_start|>assistant\n<think>\n"
SPECS = [ToolSpec(name=t["function"]["name"], parameters=t["function"]["parameters"]) for t in TOOLS]


def assembler(prompt: str, tools: bool = False) -> ResponseAssembler:
    greq = GenerationRequest(request_id="msg-x", model="m", prompts=[Prompt(ids=[1, 2, 3], text=prompt)],
                             params=[None], n=1, tools=SPECS if tools else [],
                             tool_choice=ToolChoice("auto") if tools else None)
    return ResponseAssembler(greq, reasoning_parser="qwen3", tool_parser="qwen3_coder" if tools else None)


def run(pieces, *, prompt=OPEN_PROMPT, tools=False, finish="stop", stop_reason=None, stops=()):
    """(the full message, the streamed events, the message the client's accumulator makes of them)."""
    def streams():
        outs = outputs(pieces, finish_reason=finish)
        outs[-1].stop_reason = stop_reason
        return [FakeStream([(0, o) for o in outs])]

    full = asyncio.run(message_full(assembler(prompt, tools), streams(), list(stops)))

    async def collect():
        return [e async for e in message_stream(assembler(prompt, tools), streams(), list(stops))]

    raw = asyncio.run(collect())
    events = []
    for e in raw:
        kind, data = e.split("\n", 1)
        assert kind.startswith("event: ") and data.startswith("data: ") and e.endswith("\n\n")
        body = json.loads(data[len("data: "):])
        assert body["type"] == kind[len("event: "):]
        events.append(body)
    adapter = TypeAdapter(RawMessageStreamEvent)
    snapshot, bufs = None, {}
    for body in events:
        if body["type"] == "ping":
            continue
        snapshot = accumulate_event(event=adapter.validate_python(body), current_snapshot=snapshot,
                                    json_bufs=bufs)
    Message.model_validate(full)   # the client's own model of a message takes the full answer
    return full, events, snapshot


def test_thinking_is_split_from_text_full_and_streamed():
    full, events, snap = run(["Let me ", "think.", "</think>", "\n\nThe ", "answer."])
    assert [b["type"] for b in full["content"]] == ["thinking", "text"]
    assert full["content"][0]["thinking"] == "Let me think."
    assert full["content"][1]["text"] == "The answer."
    assert full["stop_reason"] == "end_turn" and full["usage"]["output_tokens"] == 5
    assert snap.model_dump(exclude_none=True)["content"] == full["content"]
    kinds = [e["type"] for e in events]
    assert kinds[:2] == ["message_start", "ping"] and kinds[-2:] == ["message_delta", "message_stop"]
    starts = [e["content_block"]["type"] for e in events if e["type"] == "content_block_start"]
    assert starts == ["thinking", "text"]
    assert kinds.count("content_block_stop") == 2
    deltas = {e["delta"]["type"] for e in events if e["type"] == "content_block_delta"}
    assert deltas == {"thinking_delta", "text_delta"}


def test_tool_use_blocks_and_stop_reason():
    text = "I check.\n\n" + call("get_weather", ("city", "Paris"), ("days", "3")) + "\n" + \
        call("get_weather", ("city", "Oslo"))
    pieces = [text[i:i + 7] for i in range(0, len(text), 7)]
    full, events, snap = run(pieces, prompt="<|im_start|>assistant\n", tools=True)
    assert [b["type"] for b in full["content"]] == ["text", "tool_use", "tool_use"]
    assert full["content"][1]["name"] == "get_weather" and full["content"][1]["input"] == {"city": "Paris", "days": 3}
    assert full["content"][2]["input"] == {"city": "Oslo"}
    assert full["stop_reason"] == "tool_use"
    def no_ids(blocks):   # the two runs name their calls apart
        return [{k: v for k, v in b.items() if k != "id"} for b in blocks]

    streamed = snap.model_dump(exclude_none=True)["content"]
    assert no_ids(streamed) == no_ids(full["content"]) and all(b["id"] for b in streamed[1:])
    assert any(e["type"] == "content_block_delta" and e["delta"]["type"] == "input_json_delta" for e in events)
    assert events[-2]["delta"]["stop_reason"] == "tool_use"


@pytest.mark.parametrize("finish,stop_reason,stops,expect,seq", [
    ("length", None, (), "max_tokens", None),
    ("stop", "END", ("END",), "stop_sequence", "END"),
    ("stop", 151645, (), "end_turn", None),
])
def test_stop_reasons(finish, stop_reason, stops, expect, seq):
    full, events, snap = run(["</think>", "hi"], finish=finish, stop_reason=stop_reason, stops=stops)
    assert (full["stop_reason"], full["stop_sequence"]) == (expect, seq)
    assert (snap.stop_reason, snap.stop_sequence) == (expect, seq)


def test_a_failing_engine_ends_the_stream_with_an_error_event():
    class Failing(FakeStream):
        async def __anext__(self):
            raise APIError(503, "engine gone")

    async def collect():
        return [e async for e in message_stream(assembler(OPEN_PROMPT), [Failing([])], [])]

    last = asyncio.run(collect())[-1]
    assert last.startswith("event: error\n")
    body = json.loads(last.split("data: ", 1)[1])
    assert body == {"type": "error", "error": {"type": "overloaded_error", "message": "engine gone"}}


def test_request_translation():
    req = MessagesRequest.model_validate({
        "max_tokens": 9, "system": [{"type": "text", "text": "a"}, {"type": "text", "text": "b"}],
        "stop_sequences": ["X"], "thinking": {"type": "enabled", "budget_tokens": 100},
        "tools": [{"name": "f", "input_schema": {"type": "object", "properties": {}}}],
        "tool_choice": {"type": "any", "disable_parallel_tool_use": True},
        "messages": [
            {"role": "user", "content": [{"type": "text", "text": "look"},
                                         {"type": "image", "source": {"type": "base64", "media_type": "image/png",
                                                                      "data": "AAAA"}}]},
            {"role": "assistant", "content": [{"type": "thinking", "thinking": "hm", "signature": "s"},
                                              {"type": "tool_use", "id": "t1", "name": "f", "input": {"a": 1}}]},
            {"role": "user", "content": [{"type": "tool_result", "tool_use_id": "t1", "content": "boom",
                                          "is_error": True}, {"type": "text", "text": "next"}]},
        ]})
    chat = to_chat_request(req)
    assert chat.max_completion_tokens == 9 and chat.stop == ["X"]
    assert chat.tool_choice == "required" and chat.parallel_tool_calls is False
    assert chat.chat_template_kwargs == {"enable_thinking": True}
    assert chat.tools == [{"type": "function", "function": {"name": "f", "parameters":
                                                           {"type": "object", "properties": {}}}}]
    msgs = [m.model_dump(exclude_none=True) for m in chat.messages]
    assert msgs[0] == {"role": "system", "content": "a\nb"}
    assert msgs[1]["content"][1]["image_url"] == {"url": "data:image/png;base64,AAAA"}
    assert msgs[2]["reasoning_content"] == "hm"
    assert msgs[2]["tool_calls"][0]["function"] == {"name": "f", "arguments": {"a": 1}}
    assert msgs[3] == {"role": "tool", "tool_call_id": "t1", "content": "Error: boom"}
    assert msgs[4]["role"] == "user" and msgs[4]["content"][0]["text"] == "next"


def test_tool_result_blocks_and_bad_blocks():
    def chat(content, role="user"):
        return to_chat_request(MessagesRequest.model_validate(
            {"max_tokens": 1, "messages": [{"role": role, "content": content}]}))

    img = {"type": "image", "source": {"type": "url", "url": "https://example.com/a.png"}}
    m = chat([{"type": "tool_result", "tool_use_id": "t", "is_error": True,
               "content": [{"type": "text", "text": "see"}, img]}]).messages[0]
    assert m.role == "tool" and [p.model_dump() for p in m.content] == [
        {"type": "text", "text": "Error: "}, {"type": "text", "text": "see"},
        {"type": "image_url", "image_url": {"url": "https://example.com/a.png"}}]
    for content, role, param in [
        ([{"type": "tool_result", "tool_use_id": "t", "content": [{"type": "video"}]}], "user",
         "messages.0.content.0.content.0"),
        ([{"type": "thinking", "thinking": "x"}], "user", "messages.0.content.0.type"),
        ([{"type": "image", "source": {"type": "file", "file_id": "f"}}], "user", "messages.0.content.0.source.type"),
        ([{"type": "tool_use", "id": "a", "name": "f", "input": "x"}], "assistant", "messages.0.content.0"),
        ([{"type": "tool_result", "content": "x"}], "user", "messages.0.content.0.tool_use_id"),
    ]:
        with pytest.raises(APIError) as e:
            chat(content, role)
        assert e.value.status == 400 and e.value.param == param, (content, e.value.message)


def test_a_call_cut_off_by_max_tokens_stops_for_max_tokens():
    text = call("get_weather", ("city", "Paris")) + "\n" + call("get_weather", ("city", "Os"), close=False)
    full, events, snap = run([text[:40], text[40:]], prompt="<|im_start|>assistant\n", tools=True, finish="length")
    assert full["stop_reason"] == "max_tokens" and snap.stop_reason == "max_tokens"
    assert any(b["type"] == "tool_use" for b in full["content"])
