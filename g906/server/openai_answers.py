"""OpenAI's answer objects, from the response assembler: the full chat.completion and
text_completion objects, the chunks of their streams, and their logprobs.

Streams open with one chunk per choice (chat: its role; completions with echo: the prompt),
then send every delta that carries something, then a usage chunk when asked for, then
`data: [DONE]`. A delta with nothing to show (a tag the reasoning parser still holds back, part
of a UTF-8 character) is not sent: its tokens' logprobs and ids go with the next chunk that has
text (_Held)."""

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
from g906.server.request_metrics import request_metrics
from g906.server.sse import SSE_DONE, SSEResponse, sse_event, stream_error
from g906.server.vllm_extras import AnswerOptions, echo_logprobs, prompt_logprobs_json, token_label
from g906.server.vllm_extras import usage as vllm_usage

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
    u = vllm_usage(asm.request.prompt_tokens, asm.completion_tokens, asm.reasoning_tokens)
    u.prompt_tokens_details = P.PromptTokensDetails(cached_tokens=asm.cached_tokens)
    return u


def _opts(asm: ResponseAssembler) -> AnswerOptions:
    return asm.request.options or AnswerOptions()


def _ids(asm: ResponseAssembler, ids: list[int]) -> list[int] | None:
    return list(ids) if _opts(asm).return_token_ids else None


def _base(asm: ResponseAssembler) -> dict:
    r = asm.request
    return dict(id=r.request_id, created=r.created, model=r.model)


# -- chat -------------------------------------------------------------------------------------------

async def chat_full(asm: ResponseAssembler, streams: list, eng, *, logprobs: bool) -> P.ChatCompletionResponse:
    async for k, (i, out) in merge(streams):
        asm.feed(k, i, out)
    choices = []
    o = _opts(asm)
    for c in asm.choices:
        reasoning, content = c.answer()
        if not o.include_reasoning:
            reasoning = None
        calls = [P.ToolCall(id=t.id, function=P.FunctionCall(name=t.name, arguments=t.arguments))
                 for t in c.tool_calls] or None
        choices.append(P.ChatChoice(
            index=c.index,
            message=P.ResponseMessage(content=content, reasoning_content=reasoning, reasoning=reasoning,
                                      tool_calls=calls),
            logprobs=P.ChoiceLogprobs(content=chat_logprobs(eng, c.logprobs, o.tokens_as_ids)) if logprobs else None,
            finish_reason=c.final_finish_reason, stop_reason=c.stop_reason, token_ids=_ids(asm, c.token_ids),
        ))
    return P.ChatCompletionResponse(
        **_base(asm), choices=choices, usage=_usage(asm), prompt_token_ids=_ids(asm, asm.request.prompts[0].ids),
        prompt_logprobs=prompt_logprobs_json(eng, asm.choices[0].prompt_logprobs, o.prompt_logprobs, o.tokens_as_ids),
        metrics=request_metrics(asm.choices, o.per_request_metrics))


async def chat_stream(asm: ResponseAssembler, streams: list, eng, opts: P.StreamOptions) -> AsyncIterator[str]:
    base = _base(asm)
    o = _opts(asm)
    held = _Held(asm)
    try:
        for c in asm.choices:
            yield sse_event(P.ChatCompletionChunk(**base, choices=[P.ChatChunkChoice(
                index=c.index, delta=P.DeltaMessage(role="assistant", content=""))], usage=held.usage(opts),
                prompt_token_ids=_ids(asm, asm.request.prompts[0].ids)))
        async for k, (i, out) in merge(streams):
            d = asm.feed(k, i, out)
            held.add(d, out)
            reasoning = d.reasoning if o.include_reasoning else ""
            text = bool(reasoning or d.content)
            if not (text or d.finished or d.tool_calls):
                continue            # nothing to show yet: its tokens wait for the next text (see _Held)
            # text first, then each piece of a tool call in a chunk of its own (OpenAI's order:
            # a call's id and name, then its arguments in pieces); the step's finish on the last.
            # The tokens held so far go with the text, else with the last chunk.
            deltas = []
            if text or not d.tool_calls:
                deltas.append(P.DeltaMessage(content=d.content or None, reasoning_content=reasoning or None,
                                             reasoning=reasoning or None))
            deltas += [P.DeltaMessage(tool_calls=[_delta_call(t)]) for t in d.tool_calls]
            for j, delta in enumerate(deltas):
                last = j == len(deltas) - 1
                lps, ids = held.take(d.index) if (j == 0 and text) or last else ([], [])
                lp = P.ChoiceLogprobs(content=chat_logprobs(eng, [x for _, run in lps for x in run], o.tokens_as_ids)) \
                    if lps else None
                yield sse_event(P.ChatCompletionChunk(**base, choices=[P.ChatChunkChoice(
                    index=d.index, delta=delta, logprobs=lp,
                    finish_reason=d.finish_reason if d.finished and last else None,
                    stop_reason=d.stop_reason if d.finished and last else None,
                    token_ids=_ids(asm, ids) if last or ids else None)], usage=held.usage(opts)))
        if opts.include_usage:
            yield sse_event(P.ChatCompletionChunk(**base, choices=[], usage=_usage(asm),
                                                  metrics=request_metrics(asm.choices, o.per_request_metrics)))
    except Exception as exc:  # noqa: BLE001 - the status line is gone; report in the stream
        log.exception("chat stream failed")
        yield stream_error(exc)
    yield SSE_DONE


class _Held:
    """A stream's tokens that were generated but not sent yet, per choice.

    A token whose text the engine holds back (an incomplete UTF-8 character, the start of a
    possible stop string) or that the output parsers hold back (a partial tag) adds no text; its
    logprobs and id then wait for the next chunk that has text, so that a chunk never carries a
    token without text (vLLM's stream rule, which clients that count tokens by their logprobs rely
    on), and the usage a chunk carries counts exactly the tokens sent so far. A finish chunk
    carries whatever is still held, with or without text."""

    def __init__(self, asm: ResponseAssembler):
        self.asm = asm
        self.runs: dict[int, list[tuple[int, list]]] = {}   # (text offset, TokenLogprobs) runs
        self.ids: dict[int, list[int]] = {}
        self.sent = 0

    def add(self, d, out) -> None:
        self.ids.setdefault(d.index, []).extend(out.new_token_ids)
        if d.logprobs:
            self.runs.setdefault(d.index, []).append((d.text_offset, list(d.logprobs)))

    def take(self, index: int) -> tuple[list[tuple[int, list]], list[int]]:
        ids = self.ids.pop(index, [])
        self.sent += len(ids)
        return self.runs.pop(index, []), ids

    def usage(self, opts: P.StreamOptions) -> P.Usage | None:
        if not opts.continuous_usage_stats:
            return None
        asm = self.asm
        reasoning = asm.reasoning_tokens
        u = vllm_usage(asm.request.prompt_tokens, self.sent, None if reasoning is None else min(reasoning, self.sent))
        u.prompt_tokens_details = P.PromptTokensDetails(cached_tokens=asm.cached_tokens)
        return u


# -- completions ------------------------------------------------------------------------------------

async def completion_full(asm: ResponseAssembler, streams: list, eng, *,
                          logprobs: int | None) -> P.CompletionResponse:
    async for k, (i, out) in merge(streams):
        asm.feed(k, i, out)
    n, o = asm.request.n, _opts(asm)
    choices = []
    for c in asm.choices:
        lp = None
        if logprobs is not None:
            lp = completion_logprobs(eng, c.logprob_runs, o.tokens_as_ids)
            if c.prefix:       # echo: the prompt's tokens come first
                lp = _join(echo_logprobs(eng, asm.request.prompts[c.index // n].ids, c.prompt_logprobs, logprobs,
                                         o.tokens_as_ids), lp)
        choices.append(P.CompletionChoice(
            index=c.index, text=c.prefix + c.text, logprobs=lp, finish_reason=c.finish_reason,
            stop_reason=c.stop_reason, prompt_token_ids=_ids(asm, asm.request.prompts[c.index // n].ids),
            token_ids=_ids(asm, c.token_ids),
            prompt_logprobs=prompt_logprobs_json(eng, c.prompt_logprobs, o.prompt_logprobs, o.tokens_as_ids)))
    return P.CompletionResponse(**_base(asm), choices=choices, usage=_usage(asm),
                                metrics=request_metrics(asm.choices, o.per_request_metrics))


async def completion_stream(asm: ResponseAssembler, streams: list, eng, opts: P.StreamOptions, *,
                            logprobs: int | None, echo: bool) -> AsyncIterator[str]:
    base = _base(asm)
    o = _opts(asm)
    n, as_ids = asm.request.n, o.tokens_as_ids
    first = {c.index for c in asm.choices}   # choices whose prompt_token_ids were not sent yet
    held = _Held(asm)
    try:
        late_echo = echo and logprobs is not None   # its logprobs come with the first token
        if echo and not late_echo:
            for c in asm.choices:
                first.discard(c.index)
                yield sse_event(P.CompletionChunk(**base, choices=[P.CompletionChoice(
                    index=c.index, text=c.prefix, finish_reason=None,
                    prompt_token_ids=_ids(asm, asm.request.prompts[c.index // n].ids))], usage=held.usage(opts)))
        async for k, (i, out) in merge(streams):
            d = asm.feed(k, i, out)
            held.add(d, out)
            if late_echo and d.index in first:
                first.discard(d.index)
                c = asm.choices[d.index]
                ids = asm.request.prompts[d.index // n].ids
                yield sse_event(P.CompletionChunk(**base, choices=[P.CompletionChoice(
                    index=c.index, text=c.prefix, finish_reason=None, prompt_token_ids=_ids(asm, ids),
                    logprobs=echo_logprobs(eng, ids, c.prompt_logprobs, logprobs, as_ids))], usage=held.usage(opts)))
            if not (d.text or d.finished):
                continue            # no text yet: its tokens wait for the next text (see _Held)
            runs, ids = held.take(d.index)
            lp = completion_logprobs(eng, runs, as_ids) if logprobs is not None else None
            prompt_ids = None
            if d.index in first:
                first.discard(d.index)
                prompt_ids = _ids(asm, asm.request.prompts[d.index // n].ids)
            yield sse_event(P.CompletionChunk(**base, choices=[P.CompletionChoice(
                index=d.index, text=d.text, logprobs=lp,
                finish_reason=d.finish_reason if d.finished else None,
                stop_reason=d.stop_reason if d.finished else None,
                prompt_token_ids=prompt_ids, token_ids=_ids(asm, ids))], usage=held.usage(opts)))
        if opts.include_usage:
            yield sse_event(P.CompletionChunk(**base, choices=[], usage=_usage(asm),
                                              metrics=request_metrics(asm.choices, o.per_request_metrics)))
    except Exception as exc:  # noqa: BLE001 - the status line is gone; report in the stream
        log.exception("completion stream failed")
        yield stream_error(exc)
    yield SSE_DONE


# -- logprobs ---------------------------------------------------------------------------------------

def _delta_call(t) -> P.DeltaToolCall:
    if t.name is not None:
        return P.DeltaToolCall(index=t.index, id=t.id, type="function",
                               function=P.DeltaFunctionCall(name=t.name, arguments=t.arguments))
    return P.DeltaToolCall(index=t.index, function=P.DeltaFunctionCall(arguments=t.arguments))


def _join(head: P.CompletionLogprobs, tail: P.CompletionLogprobs) -> P.CompletionLogprobs:
    """The echoed prompt's logprobs, then the output's (its offsets already count the prompt text)."""
    return P.CompletionLogprobs(tokens=head.tokens + tail.tokens, token_logprobs=head.token_logprobs + tail.token_logprobs,
                                top_logprobs=head.top_logprobs + tail.top_logprobs,
                                text_offset=head.text_offset + tail.text_offset)


def _finite(x: float) -> float:
    # JSON has no infinities or NaN: a token the sampler could never pick gets a very low logprob
    return x if x == x and x not in (float("inf"), float("-inf")) else -9999.0


def chat_logprobs(eng, lps, as_ids: bool = False) -> list[P.TokenLogprob]:
    out = []
    for lp in lps:
        b = eng.token_bytes(lp.token_id)
        out.append(P.TokenLogprob(
            token=token_label(eng, lp.token_id, as_ids), logprob=_finite(lp.logprob), bytes=list(b),
            top_logprobs=[P.TopLogprob(token=token_label(eng, t, as_ids), logprob=_finite(v),
                                       bytes=list(eng.token_bytes(t))) for t, v in lp.top],
        ))
    return out


def completion_logprobs(eng, runs: list[tuple[int, list]], as_ids: bool = False) -> P.CompletionLogprobs:
    """runs: (text offset of the run's first token, its TokenLogprobs). A step's top_logprobs
    hold the sampled token and the top k (vLLM's shape: `logprobs: 0` gives the sampled token
    alone)."""
    res = P.CompletionLogprobs()
    for offset, lps in runs:
        for lp in lps:
            text = eng.token_text(lp.token_id)
            label = token_label(eng, lp.token_id, as_ids)
            res.tokens.append(label)
            res.token_logprobs.append(_finite(lp.logprob))
            top: dict[str, float] = {label: _finite(lp.logprob)}
            for t, v in lp.top:
                top.setdefault(token_label(eng, t, as_ids), _finite(v))
            res.top_logprobs.append(top)
            res.text_offset.append(offset)
            offset += len(text)
    return res
