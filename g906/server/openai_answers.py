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
        prompt_logprobs=prompt_logprobs_json(eng, asm.choices[0].prompt_logprobs, o.prompt_logprobs, o.tokens_as_ids))


async def chat_stream(asm: ResponseAssembler, streams: list, eng, opts: P.StreamOptions) -> AsyncIterator[str]:
    base = _base(asm)

    def usage():
        return _usage(asm) if opts.continuous_usage_stats else None

    o = _opts(asm)
    pending: dict[int, list[int]] = {}     # token ids of deltas not sent yet (a held-back tag)
    try:
        for c in asm.choices:
            yield sse_event(P.ChatCompletionChunk(**base, choices=[P.ChatChunkChoice(
                index=c.index, delta=P.DeltaMessage(role="assistant", content=""))], usage=usage(),
                prompt_token_ids=_ids(asm, asm.request.prompts[0].ids)))
        async for k, (i, out) in merge(streams):
            d = asm.feed(k, i, out)
            pending.setdefault(d.index, []).extend(out.new_token_ids)
            lp = P.ChoiceLogprobs(content=chat_logprobs(eng, d.logprobs, o.tokens_as_ids)) if d.logprobs else None
            reasoning = d.reasoning if o.include_reasoning else ""
            if not (reasoning or d.content or d.finished or lp or d.tool_calls):
                continue
            # text first, then each piece of a tool call in a chunk of its own (OpenAI's order:
            # a call's id and name, then its arguments in pieces); the step's finish on the last
            deltas = []
            if reasoning or d.content or lp or not d.tool_calls:
                deltas.append((P.DeltaMessage(content=d.content or None, reasoning_content=reasoning or None,
                                              reasoning=reasoning or None), lp))
            deltas += [(P.DeltaMessage(tool_calls=[_delta_call(t)]), None) for t in d.tool_calls]
            for j, (delta, dlp) in enumerate(deltas):
                last = j == len(deltas) - 1
                yield sse_event(P.ChatCompletionChunk(**base, choices=[P.ChatChunkChoice(
                    index=d.index, delta=delta, logprobs=dlp,
                    finish_reason=d.finish_reason if d.finished and last else None,
                    stop_reason=d.stop_reason if d.finished and last else None,
                    token_ids=_ids(asm, pending.pop(d.index, [])) if last else None)], usage=usage()))
        if opts.include_usage:
            yield sse_event(P.ChatCompletionChunk(**base, choices=[], usage=_usage(asm)))
    except Exception as exc:  # noqa: BLE001 - the status line is gone; report in the stream
        log.exception("chat stream failed")
        yield stream_error(exc)
    yield SSE_DONE


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
    return P.CompletionResponse(**_base(asm), choices=choices, usage=_usage(asm))


async def completion_stream(asm: ResponseAssembler, streams: list, eng, opts: P.StreamOptions, *,
                            logprobs: int | None, echo: bool) -> AsyncIterator[str]:
    base = _base(asm)
    n, as_ids = asm.request.n, _opts(asm).tokens_as_ids
    first = {c.index for c in asm.choices}   # choices whose prompt_token_ids were not sent yet
    pending: dict[int, list[int]] = {}
    try:
        late_echo = echo and logprobs is not None   # its logprobs come with the first token
        if echo and not late_echo:
            for c in asm.choices:
                first.discard(c.index)
                yield sse_event(P.CompletionResponse(**base, choices=[P.CompletionChoice(
                    index=c.index, text=c.prefix, finish_reason=None,
                    prompt_token_ids=_ids(asm, asm.request.prompts[c.index // n].ids))]))
        async for k, (i, out) in merge(streams):
            d = asm.feed(k, i, out)
            pending.setdefault(d.index, []).extend(out.new_token_ids)
            if late_echo and d.index in first:
                first.discard(d.index)
                c = asm.choices[d.index]
                ids = asm.request.prompts[d.index // n].ids
                yield sse_event(P.CompletionResponse(**base, choices=[P.CompletionChoice(
                    index=c.index, text=c.prefix, finish_reason=None, prompt_token_ids=_ids(asm, ids),
                    logprobs=echo_logprobs(eng, ids, c.prompt_logprobs, logprobs, as_ids))]))
            lp = completion_logprobs(eng, [(d.text_offset, d.logprobs)], as_ids) if logprobs is not None else None
            if not (d.text or d.finished or lp):
                continue
            prompt_ids = None
            if d.index in first:
                first.discard(d.index)
                prompt_ids = _ids(asm, asm.request.prompts[d.index // n].ids)
            yield sse_event(P.CompletionResponse(**base, choices=[P.CompletionChoice(
                index=d.index, text=d.text, logprobs=lp,
                finish_reason=d.finish_reason if d.finished else None,
                stop_reason=d.stop_reason if d.finished else None,
                prompt_token_ids=prompt_ids, token_ids=_ids(asm, pending.pop(d.index, [])))],
                usage=_usage(asm) if opts.continuous_usage_stats else None))
        if opts.include_usage:
            yield sse_event(P.CompletionResponse(**base, choices=[], usage=_usage(asm)))
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
