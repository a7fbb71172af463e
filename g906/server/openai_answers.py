"""OpenAI's answer objects, from the response assembler: the full chat.completion and
text_completion objects, the chunks of their streams, and their logprobs.

Streams open with one chunk per choice (chat: its role; completions with echo: the prompt),
then send every delta that carries something, then a usage chunk when asked for, then
`data: [DONE]`. A delta with nothing to show (a tag the reasoning parser still holds back) is
not sent."""

from __future__ import annotations

import logging
from typing import AsyncIterator

from starlette.requests import Request
from starlette.responses import JSONResponse, Response

from g906.server import protocol as P
from g906.server.assembler import ResponseAssembler
from g906.server.disconnect import race_disconnect
from g906.server.generation import merge
from g906.server.intake import ignored_fields_header
from g906.server.sse import SSE_DONE, SSEResponse, sse_event, stream_error

log = logging.getLogger("g906.server")


async def send_answer(request: Request, asm: ResponseAssembler, streams: list, ignored: list[str], *,
                      events: AsyncIterator[str] | None = None, full=None) -> Response:
    """The stream of `events`, or the JSON of the awaited `full` answer (a coroutine): either
    way, a client that disconnects aborts the request."""
    headers = ignored_fields_header(ignored)
    if events is not None:
        return SSEResponse(events, headers=headers, request_id=asm.request.request_id, requests=streams)
    resp = await race_disconnect(request, full)
    if isinstance(resp, Response):
        return resp
    return JSONResponse(resp.model_dump(mode="json"), headers=headers)


def _usage(asm: ResponseAssembler) -> P.Usage:
    prompt, done = asm.request.prompt_tokens, asm.completion_tokens
    return P.Usage(prompt_tokens=prompt, completion_tokens=done, total_tokens=prompt + done,
                   prompt_tokens_details=P.PromptTokensDetails(cached_tokens=asm.cached_tokens))


def _base(asm: ResponseAssembler) -> dict:
    r = asm.request
    return dict(id=r.request_id, created=r.created, model=r.model)


# -- chat -------------------------------------------------------------------------------------------

async def chat_full(asm: ResponseAssembler, streams: list, eng, *, logprobs: bool) -> P.ChatCompletionResponse:
    async for k, (i, out) in merge(streams):
        asm.feed(k, i, out)
    choices = []
    for c in asm.choices:
        reasoning, content = c.answer()
        calls = [P.ToolCall(id=t.id, function=P.FunctionCall(name=t.name, arguments=t.arguments))
                 for t in c.tool_calls]
        choices.append(P.ChatChoice(
            index=c.index,
            message=P.ResponseMessage(content=content, reasoning_content=reasoning, reasoning=reasoning,
                                      tool_calls=calls),
            logprobs=P.ChoiceLogprobs(content=chat_logprobs(eng, c.logprobs)) if logprobs else None,
            finish_reason=c.final_finish_reason, stop_reason=c.stop_reason,
        ))
    return P.ChatCompletionResponse(**_base(asm), choices=choices, usage=_usage(asm))


async def chat_stream(asm: ResponseAssembler, streams: list, eng, opts: P.StreamOptions) -> AsyncIterator[str]:
    base = _base(asm)

    def usage():
        return _usage(asm) if opts.continuous_usage_stats else None

    try:
        for c in asm.choices:
            yield sse_event(P.ChatCompletionChunk(**base, choices=[P.ChatChunkChoice(
                index=c.index, delta=P.DeltaMessage(role="assistant", content=""))], usage=usage()))
        async for k, (i, out) in merge(streams):
            d = asm.feed(k, i, out)
            lp = P.ChoiceLogprobs(content=chat_logprobs(eng, d.logprobs)) if d.logprobs else None
            if not (d.reasoning or d.content or d.finished or lp or d.tool_calls):
                continue
            # text first, then each piece of a tool call in a chunk of its own (OpenAI's order:
            # a call's id and name, then its arguments in pieces); the step's finish on the last
            deltas = []
            if d.reasoning or d.content or lp or not d.tool_calls:
                deltas.append((P.DeltaMessage(content=d.content or None, reasoning_content=d.reasoning or None,
                                              reasoning=d.reasoning or None), lp))
            deltas += [(P.DeltaMessage(tool_calls=[_delta_call(t)]), None) for t in d.tool_calls]
            for j, (delta, dlp) in enumerate(deltas):
                last = j == len(deltas) - 1
                yield sse_event(P.ChatCompletionChunk(**base, choices=[P.ChatChunkChoice(
                    index=d.index, delta=delta, logprobs=dlp,
                    finish_reason=d.finish_reason if d.finished and last else None,
                    stop_reason=d.stop_reason if d.finished and last else None)], usage=usage()))
        if opts.include_usage:
            yield sse_event(P.ChatCompletionChunk(**base, choices=[], usage=_usage(asm)))
    except Exception as exc:  # noqa: BLE001 - the status line is gone; report in the stream
        log.exception("chat stream failed")
        yield stream_error(exc)
    yield SSE_DONE


def _delta_call(t) -> P.DeltaToolCall:
    if t.name is not None:
        return P.DeltaToolCall(index=t.index, id=t.id, type="function",
                               function=P.DeltaFunctionCall(name=t.name, arguments=t.arguments))
    return P.DeltaToolCall(index=t.index, function=P.DeltaFunctionCall(arguments=t.arguments))


# -- completions ------------------------------------------------------------------------------------

async def completion_full(asm: ResponseAssembler, streams: list, eng, *,
                          logprobs: int | None) -> P.CompletionResponse:
    async for k, (i, out) in merge(streams):
        asm.feed(k, i, out)
    choices = [P.CompletionChoice(
        index=c.index, text=c.prefix + c.text,
        logprobs=completion_logprobs(eng, c.logprob_runs) if logprobs is not None else None,
        finish_reason=c.finish_reason, stop_reason=c.stop_reason) for c in asm.choices]
    return P.CompletionResponse(**_base(asm), choices=choices, usage=_usage(asm))


async def completion_stream(asm: ResponseAssembler, streams: list, eng, opts: P.StreamOptions, *,
                            logprobs: int | None, echo: bool) -> AsyncIterator[str]:
    base = _base(asm)
    try:
        if echo:
            for c in asm.choices:
                yield sse_event(P.CompletionResponse(**base, choices=[P.CompletionChoice(
                    index=c.index, text=c.prefix, finish_reason=None)]))
        async for k, (i, out) in merge(streams):
            d = asm.feed(k, i, out)
            lp = completion_logprobs(eng, [(d.text_offset, d.logprobs)]) if logprobs is not None else None
            if not (d.text or d.finished or lp):
                continue
            yield sse_event(P.CompletionResponse(**base, choices=[P.CompletionChoice(
                index=d.index, text=d.text, logprobs=lp,
                finish_reason=d.finish_reason if d.finished else None,
                stop_reason=d.stop_reason if d.finished else None)],
                usage=_usage(asm) if opts.continuous_usage_stats else None))
        if opts.include_usage:
            yield sse_event(P.CompletionResponse(**base, choices=[], usage=_usage(asm)))
    except Exception as exc:  # noqa: BLE001 - the status line is gone; report in the stream
        log.exception("completion stream failed")
        yield stream_error(exc)
    yield SSE_DONE


# -- logprobs ---------------------------------------------------------------------------------------

def _finite(x: float) -> float:
    # JSON has no infinities or NaN: a token the sampler could never pick gets a very low logprob
    return x if x == x and x not in (float("inf"), float("-inf")) else -9999.0


def chat_logprobs(eng, lps) -> list[P.TokenLogprob]:
    out = []
    for lp in lps:
        b = eng.token_bytes(lp.token_id)
        out.append(P.TokenLogprob(
            token=eng.token_text(lp.token_id), logprob=_finite(lp.logprob), bytes=list(b),
            top_logprobs=[P.TopLogprob(token=eng.token_text(t), logprob=_finite(v), bytes=list(eng.token_bytes(t)))
                          for t, v in lp.top],
        ))
    return out


def completion_logprobs(eng, runs: list[tuple[int, list]]) -> P.CompletionLogprobs:
    """runs: (text offset of the run's first token, its TokenLogprobs)."""
    res = P.CompletionLogprobs()
    for offset, lps in runs:
        for lp in lps:
            text = eng.token_text(lp.token_id)
            res.tokens.append(text)
            res.token_logprobs.append(_finite(lp.logprob))
            top: dict[str, float] = {}
            for t, v in lp.top:
                top.setdefault(eng.token_text(t), _finite(v))
            res.top_logprobs.append(top)
            res.text_offset.append(offset)
            offset += len(text)
    return res
