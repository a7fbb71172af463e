"""The response assembler: whatever pieces the engine's text comes in, the streamed answer
reassembled equals the full answer, and the full answer equals the reasoning parser's answer for
the whole text at once. Driven through the OpenAI renderers with fake engine streams."""

from __future__ import annotations

import asyncio
import json
from types import SimpleNamespace

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from g906.engine.llm_engine import StepOutput
from g906.server import protocol as P
from g906.server.assembler import ResponseAssembler
from g906.server.generation import GenerationRequest, Prompt
from g906.server.openai_answers import chat_full, chat_stream, completion_full, completion_stream
from g906.server.parsers.qwen3_reasoning import Qwen3ReasoningParser

OPEN_PROMPT = "<|im_start|>assistant\n<think>\n"      # the template opened the reasoning
PLAIN_PROMPT = "<|im_start|>assistant\n"

# pieces that make tags, near-tags and the whitespace the parser strips
PIECES = ["<think>", "</think>", "<", "</", "think", "thi", ">", "\n", " ", "a", "b", "é", "</thinking>"]


class FakeStream:
    """An engine RequestStream: (sample index, StepOutput) pairs in a given order."""

    def __init__(self, items):
        self.items = list(items)
        self.closed = False

    def __aiter__(self):
        return self

    async def __anext__(self):
        await asyncio.sleep(0)
        if not self.items:
            raise StopAsyncIteration
        return self.items.pop(0)

    async def aclose(self):
        self.closed = True

    def close(self):
        self.closed = True


class FakeEngine:
    """token_text / token_bytes for logprobs: token id t is the letter chr(97 + t % 26)."""

    def token_text(self, t):
        return chr(97 + t % 26)

    def token_bytes(self, t):
        return self.token_text(t).encode()


def split(text: str, cuts: list[int]) -> list[str]:
    points = sorted({min(c, len(text)) for c in cuts} | {0, len(text)})
    return [text[a:b] for a, b in zip(points, points[1:])] or [""]


def outputs(pieces: list[str], finish_reason: str = "length", token_base: int = 0) -> list[StepOutput]:
    outs = []
    for k, piece in enumerate(pieces):
        last = k == len(pieces) - 1
        outs.append(StepOutput(
            request_id="r", new_token_ids=[token_base + k], new_text=piece,
            new_logprobs=[SimpleNamespace(token_id=token_base + k, logprob=-0.5, top=[(token_base + k, -0.5)])],
            finished=last, finish_reason=finish_reason if last else None, stop_reason=None))
    return outs


def interleave(per_choice: list[list[StepOutput]], order: list[int]) -> list[tuple[int, StepOutput]]:
    """The choices' outputs in one stream, as the engine interleaves an n > 1 request."""
    queues = [list(enumerate(outs)) for outs in per_choice]
    items = []
    for pick in order:
        live = [i for i, q in enumerate(queues) if q]
        if not live:
            break
        i = live[pick % len(live)]
        items.append((i, queues[i].pop(0)[1]))
    for i, q in enumerate(queues):
        items.extend((i, out) for _, out in q)
    return items


def events(lines: list[str]) -> list[dict]:
    out = []
    for e in lines:
        assert e.startswith("data: ") and e.endswith("\n\n")
        body = e[len("data: "):-2]
        if body == "[DONE]":
            break
        out.append(json.loads(body))
    assert lines[-1] == "data: [DONE]\n\n"
    return out


def request(prompt_text: str, n: int) -> GenerationRequest:
    return GenerationRequest(request_id="chatcmpl-x", model="m", prompts=[Prompt(ids=[1, 2, 3], text=prompt_text)],
                             params=[None], n=n)


async def collect(agen) -> list[str]:
    return [e async for e in agen]


texts = st.lists(st.sampled_from(PIECES), max_size=12).map("".join)
cut_lists = st.lists(st.integers(0, 60), max_size=12)


@settings(max_examples=300, deadline=None)
@given(data=st.data(), opened=st.booleans(), n=st.integers(1, 3), logprobs=st.booleans())
def test_streamed_chat_reassembles_to_the_full_answer(data, opened, n, logprobs):
    prompt = OPEN_PROMPT if opened else PLAIN_PROMPT
    choice_texts = [data.draw(texts, label=f"text{i}") for i in range(n)]
    full_outs = [outputs(split(t, data.draw(cut_lists, label=f"full cuts{i}"))) for i, t in enumerate(choice_texts)]
    stream_outs = [outputs(split(t, data.draw(cut_lists, label=f"stream cuts{i}"))) for i, t in enumerate(choice_texts)]
    order = data.draw(st.lists(st.integers(0, 5), max_size=30), label="interleaving")
    eng = FakeEngine()


    def full(outs):
        return asyncio.run(chat_full(ResponseAssembler(request(prompt, n), reasoning_parser="qwen3"),
                                     [FakeStream(interleave(outs, order))], eng, logprobs=logprobs))

    full_a, full_b = full(full_outs), full(stream_outs)
    opts = P.StreamOptions(include_usage=True)
    chunks = events(asyncio.run(collect(chat_stream(ResponseAssembler(request(prompt, n), reasoning_parser="qwen3"),
                                                    [FakeStream(interleave(stream_outs, order))], eng, opts))))

    for i, text in enumerate(choice_texts):
        # the full answer is what the parser makes of the whole text at once, however it was split
        msg = full_b.choices[i].message
        assert (msg.reasoning_content, msg.content) == Qwen3ReasoningParser(prompt).parse(text)
        assert full_a.choices[i].message == msg
        # and the stream of the same steps, joined, says the same
        mine = [c["choices"][0] for c in chunks if c["choices"] and c["choices"][0]["index"] == i]
        assert mine[0]["delta"]["role"] == "assistant"
        assert "".join(c["delta"].get("reasoning_content") or "" for c in mine) == (msg.reasoning_content or "")
        assert "".join(c["delta"].get("content") or "" for c in mine) == (msg.content or "")
        assert mine[-1]["finish_reason"] == full_b.choices[i].finish_reason == "length"
        streamed_lps = [t for c in mine if c.get("logprobs") for t in c["logprobs"]["content"]]
        if logprobs:
            assert streamed_lps == full_b.choices[i].logprobs.model_dump(mode="json")["content"]
    assert chunks[-1]["usage"] == full_b.usage.model_dump(mode="json")


@settings(max_examples=100, deadline=None)
@given(data=st.data(), echo=st.booleans(), n=st.integers(1, 2))
def test_streamed_completion_reassembles_to_the_full_answer(data, echo, n):
    prompts = ["first prompt", "second"]
    per_prompt = []
    for k in range(len(prompts)):
        choice_texts = [data.draw(texts, label=f"text{k}.{i}") for i in range(n)]
        cuts = [data.draw(cut_lists, label=f"cuts{k}.{i}") for i in range(n)]
        per_prompt.append([(t, c) for t, c in zip(choice_texts, cuts)])
    eng = FakeEngine()

    def run(render, **kw):
        greq = GenerationRequest(request_id="cmpl-x", model="m", prompts=[Prompt(ids=[1], text=p) for p in prompts],
                                 params=[None, None], n=n)
        asm = ResponseAssembler(greq, prefixes=prompts if echo else None)
        streams = [FakeStream(interleave([outputs(split(t, c), "stop", 10 * k) for t, c in choices], []))
                   for k, choices in enumerate(per_prompt)]
        return asyncio.run(render(asm, streams, eng, **kw))

    full = run(completion_full, logprobs=1)
    chunks = events(run(lambda *a, **kw: collect(completion_stream(*a, **kw)), opts=P.StreamOptions(),
                        logprobs=1, echo=echo))
    for j, choice in enumerate(full.choices):
        mine = [c["choices"][0] for c in chunks if c["choices"][0]["index"] == j]
        assert "".join(c["text"] for c in mine) == choice.text
        assert choice.text.startswith(prompts[j // n] if echo else "")
        lps = choice.logprobs
        streamed = [c["logprobs"] for c in mine if c.get("logprobs")]
        assert [t for lp in streamed for t in lp["tokens"]] == lps.tokens
        assert [o for lp in streamed for o in lp["text_offset"]] == lps.text_offset
        assert mine[-1]["finish_reason"] == choice.finish_reason == "stop"


# -- tool calls -------------------------------------------------------------------------------------

TOOL_PIECES = ["<tool_call>", "</tool_call>", "<function=get_weather>", "<function=configure>", "<function=",
               "</function>", "<parameter=city>", "<parameter=count>", "<parameter=options>", "<parameter=",
               "</parameter>", "<tool", "</", "<", ">", "\n", " ", "Paris", "3", "{\"depth\": 1}", "{bad", "null",
               "</think>", "a"]
TOOL_SPECS = None


def _tool_specs():
    from g906.server.parsers.base import ToolSpec

    return [ToolSpec("get_weather", {"type": "object", "properties": {"city": {"type": "string"}}}),
            ToolSpec("configure", {"type": "object", "properties": {
                "count": {"type": "integer"}, "options": {"type": "object"},
                "city": {"anyOf": [{"type": "string"}, {"type": "null"}]}}})]


def tool_request(prompt_text: str, n: int, parallel: bool) -> GenerationRequest:
    from g906.server.tools import ToolChoice

    return GenerationRequest(request_id="chatcmpl-x", model="m", prompts=[Prompt(ids=[1, 2, 3], text=prompt_text)],
                             params=[None], n=n, tools=_tool_specs(), tool_choice=ToolChoice("auto"),
                             parallel_tool_calls=parallel)


tool_texts = st.lists(st.sampled_from(TOOL_PIECES), max_size=24).map("".join)


def streamed_calls(mine: list[dict]) -> list[tuple[str, str, str]]:
    calls: dict[int, list[str]] = {}
    for c in mine:
        for t in c["delta"].get("tool_calls") or []:
            if t["index"] not in calls:
                assert t["id"].startswith("call_") and t["type"] == "function" and t["function"]["name"]
                assert t["index"] == len(calls)          # calls open in order
                calls[t["index"]] = [t["id"], t["function"]["name"], ""]
            else:
                assert t["id"] is None and t["function"]["name"] is None
            calls[t["index"]][2] += t["function"]["arguments"] or ""
    return [tuple(calls[i]) for i in sorted(calls)]


@settings(max_examples=300, deadline=None)
@given(data=st.data(), opened=st.booleans(), n=st.integers(1, 2), parallel=st.booleans(),
       reason=st.sampled_from(["stop", "length"]))
def test_streamed_tool_calls_reassemble_to_the_full_answer(data, opened, n, parallel, reason):
    from g906.server.parsers.qwen3_coder import Qwen3CoderToolParser

    prompt = OPEN_PROMPT if opened else PLAIN_PROMPT
    choice_texts = [data.draw(tool_texts, label=f"text{i}") for i in range(n)]
    full_outs = [outputs(split(t, data.draw(cut_lists, label=f"full cuts{i}")), reason) for i, t in enumerate(choice_texts)]
    stream_outs = [outputs(split(t, data.draw(cut_lists, label=f"stream cuts{i}")), reason)
                   for i, t in enumerate(choice_texts)]
    order = data.draw(st.lists(st.integers(0, 5), max_size=30), label="interleaving")
    eng = FakeEngine()

    def asm():
        return ResponseAssembler(tool_request(prompt, n, parallel), reasoning_parser="qwen3", tool_parser="qwen3_coder")

    full_a = asyncio.run(chat_full(asm(), [FakeStream(interleave(full_outs, order))], eng, logprobs=False))
    full_b = asyncio.run(chat_full(asm(), [FakeStream(interleave(stream_outs, order))], eng, logprobs=False))
    chunks = events(asyncio.run(collect(chat_stream(asm(), [FakeStream(interleave(stream_outs, order))], eng,
                                                    P.StreamOptions()))))
    for i, text in enumerate(choice_texts):
        msg = full_b.choices[i].message
        # the full answer: the reasoning parser on the whole text, then the tool parser on its content
        reasoning, content = Qwen3ReasoningParser(prompt).parse(text)
        p = Qwen3CoderToolParser(tools=_tool_specs(), max_calls=None if parallel else 1)
        c1, k1 = p.feed(content or "")
        c2, k2 = p.finish(cut=reason == "length")
        from g906.server.parsers.base import merge_tool_calls

        whole = merge_tool_calls(k1 + k2)
        # no calls: null, as vLLM and OpenAI answer
        assert [(t.function.name, t.function.arguments) for t in msg.tool_calls or []] == [(t.name, t.arguments) for t in whole]
        assert (msg.tool_calls is None) == (not whole)
        assert msg.reasoning_content == reasoning
        assert msg.content == (None if whole and not c1 + c2 else (c1 + c2 if content is not None or whole else None))
        whole_calls = msg.tool_calls or []
        if reason == "length" and whole_calls:   # the last call may be cut off: then it is no JSON at all
            last = whole_calls[-1].function.arguments
            assert last.startswith("{")
            if not last.endswith("}"):
                with pytest.raises(json.JSONDecodeError):
                    json.loads(last)
                whole_calls = whole_calls[:-1]
        for t in whole_calls:
            assert isinstance(json.loads(t.function.arguments), dict)     # a JSON object
        if not parallel:
            assert len(msg.tool_calls or []) <= 1
        a = full_a.choices[i].message
        assert (a.content, a.reasoning_content, [(t.function.name, t.function.arguments) for t in a.tool_calls or []]) == \
            (msg.content, msg.reasoning_content, [(t.function.name, t.function.arguments) for t in msg.tool_calls or []])
        # the stream of the same steps, joined, says the same
        mine = [c["choices"][0] for c in chunks if c["choices"] and c["choices"][0]["index"] == i]
        assert "".join(c["delta"].get("reasoning_content") or "" for c in mine) == (msg.reasoning_content or "")
        assert "".join(c["delta"].get("content") or "" for c in mine) == (msg.content or "")
        assert [(name, args) for _, name, args in streamed_calls(mine)] == \
            [(t.function.name, t.function.arguments) for t in msg.tool_calls or []]
        want = "tool_calls" if msg.tool_calls and reason == "stop" else reason
        assert mine[-1]["finish_reason"] == full_b.choices[i].finish_reason == want
        assert all(c["finish_reason"] is None for c in mine[:-1])
