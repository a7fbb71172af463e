"""Anthropic's answer objects, from the response assembler (the same one the OpenAI routes use):
the full `message`, its stream of events, its errors.

A stream is message_start, ping, then content blocks in the order the answer has them (thinking,
text, tool_use: each opened by content_block_start, filled by deltas, closed by
content_block_stop), then message_delta (stop_reason, usage) and message_stop. An error after
the status line went out is an `error` event."""

from __future__ import annotations

import json
import logging
from typing import AsyncIterator

from starlette.responses import JSONResponse

from g906.server.assembler import ChoiceAssembler, ResponseAssembler
from g906.server.errors import APIError
from g906.server.generation import merge

log = logging.getLogger("g906.server")

# Anthropic's error types by status (https://docs.anthropic.com/en/api/errors)
_ERROR_TYPES = {400: "invalid_request_error", 401: "authentication_error", 403: "permission_error",
                404: "not_found_error", 408: "timeout_error", 413: "request_too_large", 429: "rate_limit_error",
                500: "api_error", 503: "overloaded_error", 529: "overloaded_error"}


def error_body(exc: APIError) -> dict:
    return {"type": "error", "error": {"type": _ERROR_TYPES.get(exc.status, "invalid_request_error" if
                                                                exc.status < 500 else "api_error"),
                                       "message": exc.message}}


def error_response(exc: APIError) -> JSONResponse:
    return JSONResponse(error_body(exc), status_code=exc.status, headers=exc.headers)


def _event(kind: str, data: dict) -> str:
    return f"event: {kind}\ndata: {json.dumps(data)}\n\n"


def stop_reason(c: ChoiceAssembler, stop_sequences: list[str]) -> tuple[str | None, str | None]:
    """(stop_reason, stop_sequence) of a finished choice."""
    if c.finish_reason == "length":    # even with calls: the last one may be cut off
        return "max_tokens", None
    if c.tool_calls:
        return "tool_use", None
    if isinstance(c.stop_reason, str) and c.stop_reason in stop_sequences:
        return "stop_sequence", c.stop_reason
    if c.finish_reason is None:
        return None, None
    return "end_turn", None


def usage(asm: ResponseAssembler) -> dict:
    """input_tokens counts the prompt tokens the prefix cache did not supply (Anthropic's split:
    the whole prompt is input_tokens + cache_read_input_tokens)."""
    cached = asm.cached_tokens
    return {"input_tokens": asm.request.prompt_tokens - cached, "output_tokens": asm.completion_tokens,
            "cache_creation_input_tokens": 0, "cache_read_input_tokens": cached}


def _input(arguments: str) -> dict:
    try:
        value = json.loads(arguments) if arguments.strip() else {}
    except json.JSONDecodeError:
        return {}
    return value if isinstance(value, dict) else {}


def _message(asm: ResponseAssembler, content: list, reason, sequence) -> dict:
    r = asm.request
    return {"id": r.request_id, "type": "message", "role": "assistant", "model": r.model, "content": content,
            "stop_reason": reason, "stop_sequence": sequence, "usage": usage(asm)}


async def message_full(asm: ResponseAssembler, streams: list, stop_sequences: list[str]) -> dict:
    async for k, (i, out) in merge(streams):
        asm.feed(k, i, out)
    c = asm.choices[0]
    reasoning, text = c.answer()
    content: list[dict] = []
    if reasoning:
        content.append({"type": "thinking", "thinking": reasoning, "signature": ""})
    if text:
        content.append({"type": "text", "text": text})
    content += [{"type": "tool_use", "id": t.id, "name": t.name, "input": _input(t.arguments)}
                for t in c.tool_calls]
    return _message(asm, content, *stop_reason(c, stop_sequences))


async def message_stream(asm: ResponseAssembler, streams: list, stop_sequences: list[str]) -> AsyncIterator[str]:
    start = _message(asm, [], None, None)
    start["usage"]["output_tokens"] = 0
    yield _event("message_start", {"type": "message_start", "message": start})
    yield _event("ping", {"type": "ping"})
    index = -1
    open_kind: str | None = None
    call_blocks: dict[int, int] = {}        # tool call index -> its block index

    def close():
        nonlocal open_kind
        if open_kind is None:
            return []
        open_kind = None
        return [_event("content_block_stop", {"type": "content_block_stop", "index": index})]

    def open_block(kind: str, block: dict):
        nonlocal index, open_kind
        events = close()
        index += 1
        open_kind = kind
        return events + [_event("content_block_start", {"type": "content_block_start", "index": index,
                                                        "content_block": block})]

    def delta(d: dict, at: int | None = None) -> str:
        return _event("content_block_delta", {"type": "content_block_delta",
                                              "index": index if at is None else at, "delta": d})

    try:
        async for k, (i, out) in merge(streams):
            d = asm.feed(k, i, out)
            if d.reasoning:
                if open_kind != "thinking":
                    for e in open_block("thinking", {"type": "thinking", "thinking": "", "signature": ""}):
                        yield e
                yield delta({"type": "thinking_delta", "thinking": d.reasoning})
            if d.content:
                if open_kind != "text":
                    for e in open_block("text", {"type": "text", "text": ""}):
                        yield e
                yield delta({"type": "text_delta", "text": d.content})
            for t in d.tool_calls:
                if t.index not in call_blocks:
                    for e in open_block("tool_use", {"type": "tool_use", "id": t.id, "name": t.name, "input": {}}):
                        yield e
                    call_blocks[t.index] = index
                if t.arguments:
                    yield delta({"type": "input_json_delta", "partial_json": t.arguments}, call_blocks[t.index])
        for e in close():
            yield e
        reason, sequence = stop_reason(asm.choices[0], stop_sequences)
        yield _event("message_delta", {"type": "message_delta",
                                       "delta": {"stop_reason": reason, "stop_sequence": sequence},
                                       "usage": usage(asm)})
        yield _event("message_stop", {"type": "message_stop"})
    except Exception as exc:  # noqa: BLE001 - the status line is gone; report in the stream
        log.exception("messages stream failed")
        err = exc if isinstance(exc, APIError) else APIError(500, f"the engine failed while streaming: {exc}")
        yield _event("error", error_body(err))
