"""The Responses API's answer: the `response` object and its stream of events, built from the one
response assembler's parsed deltas (the same ones the chat and Anthropic answers render).

Output items are made in the order the model produced them, by one builder for the full answer
and the stream alike, so that the two cannot disagree: a `reasoning` item (its reasoning_text),
a `message` item (its output_text, with logprobs when asked), a `function_call` item per call.
A stream opens each item (output_item.added, content_part.added), sends its deltas, closes it
(...done events, output_item.done) and ends with response.completed, or response.incomplete
when max_output_tokens cut the answer (OpenAI's and vLLM's final event for it). A call cut off by
max_output_tokens is not part of the answer (its streamed item is closed as incomplete)."""

from __future__ import annotations

import json
import logging
import time
from dataclasses import dataclass, field
from typing import Any, AsyncIterator

from g906.server.assembler import ParsedDelta, ResponseAssembler
from g906.server.errors import APIError
from g906.server.generation import merge
from g906.server.openai_answers import chat_logprobs
from g906.server.responses_protocol import ResponsesRequest, Translation, new_item_id

log = logging.getLogger("g906.server")


@dataclass
class ResponseContext:
    """What the response object echoes of its request, and how its output is rendered."""

    id: str
    req: ResponsesRequest
    tr: Translation
    eng: Any
    model: str = ""
    created_at: int = field(default_factory=lambda: int(time.time()))


class OutputBuilder:
    """The output items of one answer, from its parsed deltas; feed() and finish() return the
    stream events (dicts without sequence numbers) that the change makes."""

    def __init__(self, ctx: ResponseContext):
        self.ctx = ctx
        self.items: list[dict] = []
        self.open: dict | None = None          # the item deltas go to now
        self.calls: dict[int, dict] = {}       # the choice's tool call index -> its item
        self.whole_calls: set[int] = set()     # calls whose arguments were complete before the last delta
        self.pending_lp: list = []             # logprobs of tokens not shown yet (a held-back tag)
        self.status = "completed"

    # -- items ------------------------------------------------------------------------------------

    def _open(self, item: dict) -> list[dict]:
        events = self._close()
        self.items.append(item)
        self.open = item
        index = len(self.items) - 1
        events.append({"type": "response.output_item.added", "output_index": index, "item": _copy(item)})
        part = None
        if item["type"] == "reasoning":
            part = {"type": "reasoning_text", "text": ""}
        elif item["type"] == "message":
            part = {"type": "output_text", "text": "", "annotations": [], "logprobs": []}
        if part is not None:
            item["content"].append(part)
            events.append({"type": "response.content_part.added", "item_id": item["id"], "output_index": index,
                           "content_index": 0, "part": _copy(part)})
        return events

    def _close(self, status: str = "completed") -> list[dict]:
        item, self.open = self.open, None
        if item is None:
            return []
        index = self.items.index(item)
        item["status"] = status
        base = {"item_id": item["id"], "output_index": index}
        events = []
        if item["type"] in ("reasoning", "message"):
            part = item["content"][0]
            if item["type"] == "reasoning":
                events.append({"type": "response.reasoning_text.done", **base, "content_index": 0,
                               "text": part["text"]})
            else:
                events.append({"type": "response.output_text.done", **base, "content_index": 0,
                               "text": part["text"], "logprobs": part["logprobs"]})
            events.append({"type": "response.content_part.done", **base, "content_index": 0, "part": _copy(part)})
        else:
            events.append({"type": "response.function_call_arguments.done", **base, "name": item["name"],
                           "arguments": item["arguments"]})
        events.append({"type": "response.output_item.done", "output_index": index, "item": _copy(item)})
        return events

    def _logprobs(self) -> list[dict]:
        if not self.ctx.tr.logprobs:
            self.pending_lp = []
            return []
        lps, self.pending_lp = self.pending_lp, []
        return [lp.model_dump(mode="json") for lp in chat_logprobs(self.ctx.eng, lps)]

    # -- deltas -----------------------------------------------------------------------------------

    def feed(self, d: ParsedDelta) -> list[dict]:
        events: list[dict] = []
        self.pending_lp.extend(d.logprobs or [])
        if d.reasoning:
            if not d.content:               # the reasoning's tokens: output_text logprobs are the text's
                self.pending_lp = []        # (a step that ends the reasoning and starts the text gives its to the text)
            if self.open is None or self.open["type"] != "reasoning":
                events += self._open({"id": new_item_id("rs"), "type": "reasoning", "summary": [], "content": [],
                                      "status": "in_progress"})
            item = self.open
            item["content"][0]["text"] += d.reasoning
            events.append({"type": "response.reasoning_text.delta", "item_id": item["id"],
                           "output_index": len(self.items) - 1, "content_index": 0, "delta": d.reasoning})
        if d.content:
            if self.open is None or self.open["type"] != "message":
                events += self._open({"id": new_item_id("msg"), "type": "message", "role": "assistant",
                                      "status": "in_progress", "content": []})
            item = self.open
            lps = self._logprobs()
            part = item["content"][0]
            part["text"] += d.content
            part["logprobs"] += lps
            events.append({"type": "response.output_text.delta", "item_id": item["id"],
                           "output_index": len(self.items) - 1, "content_index": 0, "delta": d.content,
                           "logprobs": lps})
        for t in d.tool_calls:
            self.pending_lp = []
            item = self.calls.get(t.index)
            if item is None:
                flat = t.name or ""
                ns, name = self.ctx.tr.namespaces.get(flat, (None, flat))
                item = {"id": new_item_id("fc"), "type": "function_call", "call_id": t.id or new_item_id("call"),
                        "name": name, "arguments": "", "status": "in_progress"}
                if ns is not None:
                    item["namespace"] = ns
                events += self._open(item)
                self.calls[t.index] = item
            elif self.open is not item:     # a later piece of an earlier call: back to it (not expected)
                events += self._close()
                self.open = item
            if t.arguments:
                item["arguments"] += t.arguments
                events.append({"type": "response.function_call_arguments.delta", "item_id": item["id"],
                               "output_index": self.items.index(item), "delta": t.arguments})
            if not d.finished and _is_object(item["arguments"]):
                self.whole_calls.add(t.index)    # written whole before the output ended
        return events

    def finish(self, finish_reason: str | None) -> list[dict]:
        """Close the last item; with a length finish, the answer is incomplete and a call that was
        still being written is dropped from it."""
        cut = finish_reason == "length"
        self.status = "incomplete" if cut else "completed"
        events = self._close("incomplete" if cut else "completed")
        if cut:
            dropped = [item for idx, item in self.calls.items() if idx not in self.whole_calls]
            self.items = [i for i in self.items if not any(i is d for d in dropped)]
        return events


def _copy(obj):
    return json.loads(json.dumps(obj))


def _is_object(text: str) -> bool:
    try:
        return isinstance(json.loads(text), dict)
    except (json.JSONDecodeError, ValueError):
        return False


# -- the response object ------------------------------------------------------------------------------

def usage(asm: ResponseAssembler) -> dict:
    r = asm.request
    out_tokens = asm.completion_tokens
    return {"input_tokens": r.prompt_tokens,
            "input_tokens_details": {"cached_tokens": asm.cached_tokens, "cache_write_tokens": 0},
            "output_tokens": out_tokens, "output_tokens_details": {"reasoning_tokens": asm.reasoning_tokens or 0},
            "total_tokens": r.prompt_tokens + out_tokens}


def response_object(ctx: ResponseContext, *, status: str, output: list[dict] | None = None,
                    usage_: dict | None = None, error: dict | None = None, asm: ResponseAssembler | None = None) -> dict:
    req = ctx.req
    text = dict(req.text) if req.text else {}
    text.setdefault("format", {"type": "text"})
    reasoning = None
    if req.reasoning is not None:
        reasoning = {"effort": req.reasoning.get("effort"), "summary": req.reasoning.get("summary")}
    body = {
        "id": ctx.id, "object": "response", "created_at": ctx.created_at, "status": status,
        "background": req.background, "error": error,
        "incomplete_details": {"reason": "max_output_tokens"} if status == "incomplete" else None,
        "instructions": req.instructions, "max_output_tokens": req.max_output_tokens, "metadata": req.metadata or {},
        "model": ctx.model, "output": output or [],
        "parallel_tool_calls": req.parallel_tool_calls is not False,
        "previous_response_id": req.previous_response_id, "reasoning": reasoning,
        "service_tier": req.service_tier or "auto", "store": req.store,
        "temperature": 1.0 if req.temperature is None else req.temperature, "text": text,
        "tool_choice": req.tool_choice if req.tool_choice is not None else "auto", "tools": ctx.tr.tools,
        "top_logprobs": req.top_logprobs or 0, "top_p": 1.0 if req.top_p is None else req.top_p,
        "truncation": req.truncation or "disabled", "usage": usage_, "user": req.user,
        "prompt_cache_key": req.prompt_cache_key, "safety_identifier": req.safety_identifier,
    }
    if status in ("completed", "incomplete"):
        body["completed_at"] = int(time.time())
    if req.enable_response_messages and asm is not None:
        p, c = asm.request.prompts[0], asm.choices[0]
        body["input_messages"] = [{"type": "raw_message_tokens", "message": p.text or "", "tokens": list(p.ids)}]
        body["output_messages"] = [{"type": "raw_message_tokens", "message": c.text, "tokens": list(c.token_ids)}]
    return body


def history_of(output: list[dict], namespaces: dict[str, tuple[str, str]]) -> list[dict]:
    """The answer as chat messages (one assistant turn), for a later previous_response_id."""
    flat = {v: k for k, v in namespaces.items()}
    turn: dict = {"role": "assistant", "content": ""}
    for item in output:
        if item["type"] == "reasoning":
            turn["reasoning_content"] = item["content"][0]["text"]
        elif item["type"] == "message":
            turn["content"] += item["content"][0]["text"]
        elif item["type"] == "function_call":
            name = flat.get((item.get("namespace"), item["name"]), item["name"])
            turn.setdefault("tool_calls", []).append({"id": item["call_id"], "type": "function",
                                                      "function": {"name": name, "arguments": item["arguments"]}})
    return [turn] if len(turn) > 2 or turn["content"] else []


# -- full and streamed ----------------------------------------------------------------------------

async def response_full(ctx: ResponseContext, asm: ResponseAssembler, streams: list) -> dict:
    b = OutputBuilder(ctx)
    async for k, (i, out) in merge(streams):
        b.feed(asm.feed(k, i, out))
    b.finish(asm.choices[0].finish_reason)
    return response_object(ctx, status=b.status, output=b.items, usage_=usage(asm), asm=asm)


def failure(response_id: str, exc: BaseException) -> APIError:
    """The error a generation that failed under way reports (logged here, as the app's handlers do)."""
    from g906.engine.async_engine import EngineDead

    if isinstance(exc, APIError):
        return exc
    if isinstance(exc, EngineDead):      # the engine stopped under it: unavailable, not a bug here
        log.error("response %s: %s", response_id, exc)
        return APIError(503, str(exc), code="engine_unavailable")
    log.error("response %s failed", response_id, exc_info=exc)
    return APIError(500, f"internal error: {type(exc).__name__}", code="internal_error")


def sse(event: dict, seq: int) -> str:
    event = {**event, "sequence_number": seq}
    return f"event: {event['type']}\ndata: {json.dumps(event)}\n\n"


async def response_stream(ctx: ResponseContext, asm: ResponseAssembler, streams: list, on_done,
                          on_failed=None) -> AsyncIterator[str]:
    """The events of one response; on_done(response) is called with the final object (storing
    it), on_failed(APIError) when the generation failed."""
    seq = 0
    start = response_object(ctx, status="in_progress")
    for kind in ("response.created", "response.in_progress"):
        yield sse({"type": kind, "response": start}, seq)
        seq += 1
    b = OutputBuilder(ctx)
    try:
        async for k, (i, out) in merge(streams):
            for e in b.feed(asm.feed(k, i, out)):
                yield sse(e, seq)
                seq += 1
        for e in b.finish(asm.choices[0].finish_reason):
            yield sse(e, seq)
            seq += 1
        final = response_object(ctx, status=b.status, output=b.items, usage_=usage(asm), asm=asm)
        on_done(final)
        yield sse({"type": f"response.{b.status}", "response": final}, seq)
    except Exception as exc:  # noqa: BLE001 - the status line is gone; report in the stream
        err = failure(ctx.id, exc)
        if on_failed is not None:
            on_failed(err)
        yield sse({"type": "error", "code": err.code or err.type, "message": err.message, "param": err.param}, seq)
