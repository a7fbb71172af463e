"""One request as the engine runs it, whichever API route or dialect it came in through: its
prompts and their sampling parameters; and the engine side of a request: admission, starting
and merging its engine streams.

Every prompt is checked (context length, queue room) before any of them starts, so that a
request is admitted whole or not at all."""

from __future__ import annotations

import asyncio
from contextlib import contextmanager
from dataclasses import dataclass, field
from typing import Any, AsyncIterator

from g906.server import protocol as P
from g906.server.errors import APIError, bad_request
from g906.server.state import ServerState


@dataclass
class Prompt:
    ids: list[int]
    text: str | None = None          # the text the ids came from; None for token ids sent as such
    mm: Any = None                   # its images, prepared for the engine (g906/engine/vision)


@dataclass
class GenerationRequest:
    request_id: str
    model: str                       # the served name, as responses report it
    prompts: list[Prompt]
    params: list[Any]                # SamplingParams, one per prompt
    n: int                           # choices per prompt
    created: int = field(default_factory=P.now)
    options: Any = None              # vllm_extras.AnswerOptions: how the answer is rendered
    tools: list = field(default_factory=list)        # ToolSpec (g906/server/parsers/base.py)
    tool_choice: Any = None                          # ToolChoice (g906/server/tools.py); None: no tools
    parallel_tool_calls: bool = True

    @property
    def parses_tool_calls(self) -> bool:
        """Whether the answers are searched for tool calls (tools offered, and not tool_choice "none")."""
        return bool(self.tools) and self.tool_choice is not None and self.tool_choice.mode != "none"

    @property
    def num_choices(self) -> int:
        return len(self.prompts) * self.n

    @property
    def prompt_tokens(self) -> int:
        return sum(len(p.ids) for p in self.prompts)


def max_tokens_in_context(requested: int | None, *, prompt_len: int, max_model_len: int, prompt_param: str,
                          default: int | None = None) -> int:
    """The tokens a request may generate: what it asked for (by default the server's default, at
    most the rest of the context); 400 context_length_exceeded when the prompt, or the prompt and
    what it asked for, do not fit."""
    if prompt_len >= max_model_len:
        raise bad_request(
            f"the prompt has {prompt_len} tokens, but this model's context (max_model_len) is {max_model_len} tokens",
            param=prompt_param, code="context_length_exceeded")
    room = max_model_len - prompt_len
    if requested is None:
        return room if default is None else min(default, room)
    if requested > room:
        raise bad_request(
            f"this model's context (max_model_len) is {max_model_len} tokens; the prompt has {prompt_len} and "
            f"{requested} more were requested (at most {room})",
            param="max_tokens", code="context_length_exceeded")
    return requested


def openai_sampling_params(req: P._SamplingFields, *, max_tokens: int | None, prompt_len: int,
                           max_model_len: int, logprobs: int | None, prompt_param: str, structured=None,
                           logit_bias: dict[int, float] | None = None, extra: dict | None = None,
                           default_max_tokens: int | None = None):
    """The engine's SamplingParams from the sampling fields both OpenAI requests share;
    structured: the request's StructuredOutputsParams (g906/server/structured.py), if any."""
    from g906.engine.sampling_params import SamplingParams

    max_tokens = max_tokens_in_context(max_tokens, prompt_len=prompt_len, max_model_len=max_model_len,
                                       prompt_param=prompt_param, default=default_max_tokens)
    stop = req.stop if req.stop is not None else []
    temperature = req.temperature
    if temperature is None:
        temperature = 0.0 if req.use_beam_search else 1.0     # beam search ranks, it does not sample
    beam = dict(use_beam_search=True, length_penalty=req.length_penalty,
                early_stopping=req.early_stopping) if req.use_beam_search else {}
    try:
        return SamplingParams(
            n=req.n, temperature=temperature,
            top_p=1.0 if req.top_p is None else req.top_p, top_k=req.top_k or 0,
            min_p=req.min_p or 0.0, seed=req.seed, presence_penalty=req.presence_penalty,
            frequency_penalty=req.frequency_penalty, repetition_penalty=req.repetition_penalty,
            max_tokens=max_tokens, min_tokens=min(req.min_tokens, max_tokens), stop=stop,
            stop_token_ids=req.stop_token_ids or [], ignore_eos=req.ignore_eos,
            include_stop_str_in_output=req.include_stop_str_in_output, logprobs=logprobs,
            skip_special_tokens=req.skip_special_tokens, structured_outputs=structured, logit_bias=logit_bias,
            **beam, **(extra or {}),
        )
    except ValueError as exc:
        raise bad_request(str(exc), param=getattr(exc, "param", None)) from None


@contextmanager
def _admission():
    """The engine's refusals of a request, as API errors."""
    from g906.engine.async_engine import EngineDead, QueueFull

    try:
        yield
    except QueueFull as exc:
        raise APIError(503, str(exc), code="queue_full", headers={"Retry-After": "1"}) from None
    except EngineDead as exc:
        code = "server_shutting_down" if "shutting down" in str(exc) else "engine_unavailable"
        raise APIError(503, str(exc), code=code) from None
    except ValueError as exc:
        raise bad_request(str(exc), param=getattr(exc, "param", None),
                          code="context_length_exceeded" if "max_model_len" in str(exc) else None) from None


def admit(st: ServerState, greq: GenerationRequest) -> None:
    """Raise the API error the engine would refuse the request with (400, or 503 when full or
    down); no side effects."""
    from g906.engine.sampling_params import SamplingParams

    eng = st.engine
    capacity = eng.max_waiting_requests + eng.engine.config.max_num_seqs
    total_n = sum(params.n for params in greq.params)
    if total_n > capacity:   # never fits, however long the client waits: not a 503 to retry
        raise bad_request(
            f"the request asks for {total_n} sequences ({len(greq.prompts)} prompt(s) x n={greq.n}), more than "
            f"this server can ever hold at once ({capacity}: max_waiting_requests {eng.max_waiting_requests} + "
            f"max_num_seqs {eng.engine.config.max_num_seqs})", param="n", code="too_many_sequences")
    with _admission():
        for p, params in zip(greq.prompts, greq.params):
            eng.check(p.ids, params)
        if len(greq.prompts) > 1:   # room in the queue for the whole batch, not just for each prompt alone
            eng.check(greq.prompts[0].ids, SamplingParams(n=total_n, max_tokens=1))


def start(st: ServerState, greq: GenerationRequest) -> list:
    """Admit and start every prompt of the request (its engine streams, in prompt order), or none."""
    admit(st, greq)
    eng = st.engine
    streams: list = []
    try:
        with _admission():
            for k, (p, params) in enumerate(zip(greq.prompts, greq.params)):
                rid = greq.request_id if len(greq.prompts) == 1 else f"{greq.request_id}-{k}"
                streams.append(eng.generate(rid, p.ids, params, mm=p.mm))
    except BaseException:
        for s in streams:
            s.close()
        raise
    for p in greq.prompts:
        st.metrics.on_prompt(len(p.ids))
    return streams


async def merge(streams: list[AsyncIterator]) -> AsyncIterator[tuple[int, Any]]:
    """(stream index, item) from several async iterators as they come; closing this one closes
    (aborts) all of them."""
    if len(streams) == 1:
        try:
            async for item in streams[0]:
                yield 0, item
        finally:
            await streams[0].aclose()
        return
    q: asyncio.Queue = asyncio.Queue()
    done = object()

    async def pump(i, g):
        try:
            async for item in g:
                await q.put((i, item))
        except Exception as exc:  # noqa: BLE001 - re-raised by the consumer
            await q.put((i, exc))
        finally:
            q.put_nowait((i, done))

    tasks = [asyncio.ensure_future(pump(i, g)) for i, g in enumerate(streams)]
    try:
        left = len(streams)
        while left:
            i, item = await q.get()
            if item is done:
                left -= 1
            elif isinstance(item, Exception):
                raise item
            else:
                yield i, item
    finally:
        for t in tasks:
            t.cancel()
        await asyncio.gather(*tasks, return_exceptions=True)
