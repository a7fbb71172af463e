"""The Starlette app: OpenAI-compatible routes over the async engine.

    state = ServerState(served_model_name="tiny", ...)
    app = create_app(state)          # /health answers 503 until state.set_ready(engine, ...)

Every error leaves in OpenAI's JSON shape. Streams are server-sent events ending in
`data: [DONE]`; a client that disconnects (from a stream or while waiting for a non-stream
answer) aborts its request at once."""

from __future__ import annotations

import asyncio
import hmac
import json
import logging
from dataclasses import dataclass, field
from typing import Any, AsyncIterator

from pydantic import BaseModel, ValidationError
from starlette.applications import Starlette
from starlette.exceptions import HTTPException
from starlette.requests import Request
from starlette.responses import JSONResponse, Response
from starlette.routing import Route

from g906 import __version__
from g906.server import protocol as P
from g906.server.errors import APIError, bad_request, pydantic_message
from g906.server.metrics import Metrics
from g906.server.reasoning import make_parser

log = logging.getLogger("g906.server")

DEFAULT_MAX_BODY_BYTES = 32 * 1024 * 1024


@dataclass
class ServerState:
    served_model_name: str
    reasoning_parser: str = "none"
    api_key: str | None = None
    max_body_bytes: int = DEFAULT_MAX_BODY_BYTES
    engine: Any = None                   # AsyncEngine, once ready
    prompts: Any = None                  # PromptBuilder
    status: str = "loading"              # loading | ok | failed
    detail: str | None = None
    engine_info: dict = field(default_factory=dict)
    _logged_ignored: set = field(default_factory=set)
    metrics: Metrics | None = None

    def __post_init__(self) -> None:
        if self.metrics is None:
            self.metrics = Metrics(self)

    def set_ready(self, engine, prompts, info: dict | None = None) -> None:
        engine.observer = self.metrics
        self.engine = engine
        self.prompts = prompts
        self.engine_info = info or {}
        self.status = "ok"

    def set_failed(self, detail: str) -> None:
        self.status = "failed"
        self.detail = detail

    @property
    def max_model_len(self) -> int | None:
        return self.engine.engine.max_model_len if self.engine is not None else None


# -- request plumbing -------------------------------------------------------------------------------

def _state(request: Request) -> ServerState:
    return request.app.state.g906


def _check_auth(request: Request, st: ServerState) -> None:
    if not st.api_key:
        return
    header = request.headers.get("authorization", "")
    scheme, _, token = header.partition(" ")
    if scheme.lower() != "bearer" or not hmac.compare_digest(token.strip().encode(), st.api_key.encode()):
        raise APIError(401, "missing or incorrect API key: send it as 'Authorization: Bearer <key>'",
                       code="invalid_api_key", headers={"WWW-Authenticate": "Bearer"})


def _check_ready(st: ServerState) -> None:
    if st.status != "ok" or st.engine is None:
        detail = "the model is still loading" if st.status == "loading" else f"the engine failed: {st.detail}"
        raise APIError(503, detail, code="not_ready", headers={"Retry-After": "5"})


async def _read_body(request: Request, limit: int) -> bytes:
    cl = request.headers.get("content-length")
    if cl is not None:
        try:
            if int(cl) > limit:
                raise APIError(413, f"the request body ({cl} bytes) is larger than the limit of {limit} bytes",
                               code="request_too_large")
        except ValueError:
            raise bad_request("invalid Content-Length header") from None
    chunks, size = [], 0
    async for chunk in request.stream():
        size += len(chunk)
        if size > limit:
            raise APIError(413, f"the request body is larger than the limit of {limit} bytes", code="request_too_large")
        chunks.append(chunk)
    return b"".join(chunks)


async def _parse(request: Request, st: ServerState, model_cls: type[BaseModel]) -> tuple[BaseModel, list[str]]:
    _check_auth(request, st)
    _check_ready(st)
    body = await _read_body(request, st.max_body_bytes)
    if not body.strip():
        raise bad_request("the request body is empty: send a JSON object")
    try:
        data = json.loads(body)
    except (json.JSONDecodeError, UnicodeDecodeError) as exc:
        raise bad_request(f"the request body is not valid JSON: {exc}", code="invalid_json") from None
    if not isinstance(data, dict):
        raise bad_request(f"the request body must be a JSON object, not {type(data).__name__}")
    try:
        req = model_cls.model_validate_json(body)
    except ValidationError as exc:
        msg, param = pydantic_message(exc)
        raise bad_request(msg, param=param) from None
    except (ValueError, RecursionError) as exc:
        raise bad_request(f"invalid request body: {exc}") from None
    ignored = P.ignored_fields(req)
    new = [f for f in ignored if f not in st._logged_ignored]
    if new:
        st._logged_ignored.update(new)
        log.warning("ignoring request fields that g906 does not implement: %s "
                    "(each is named once here; responses list them in x-g906-ignored-fields)", ", ".join(new))
    if req.model is not None and req.model != st.served_model_name:
        raise APIError(400, f"the model {req.model!r} does not exist; this server serves {st.served_model_name!r}",
                       param="model", code="model_not_found")
    return req, ignored


def _headers(ignored: list[str]) -> dict[str, str]:
    return {"x-g906-ignored-fields": ", ".join(ignored)} if ignored else {}


def _sampling(req, *, max_tokens: int | None, prompt_len: int, st: ServerState, logprobs: int | None):
    from g906.engine.sampling_params import SamplingParams

    max_len = st.max_model_len
    if prompt_len >= max_len:
        raise bad_request(
            f"the prompt has {prompt_len} tokens, but this model's context (max_model_len) is {max_len} tokens",
            param="messages" if hasattr(req, "messages") else "prompt", code="context_length_exceeded")
    room = max_len - prompt_len
    if max_tokens is None:
        max_tokens = room
    elif max_tokens > room:
        raise bad_request(
            f"this model's context (max_model_len) is {max_len} tokens; the prompt has {prompt_len} and "
            f"{max_tokens} more were requested (at most {room})",
            param="max_tokens", code="context_length_exceeded")
    stop = req.stop if req.stop is not None else []
    try:
        return SamplingParams(
            n=req.n, temperature=1.0 if req.temperature is None else req.temperature,
            top_p=1.0 if req.top_p is None else req.top_p, top_k=req.top_k or 0,
            min_p=req.min_p or 0.0, seed=req.seed, presence_penalty=req.presence_penalty,
            frequency_penalty=req.frequency_penalty, repetition_penalty=req.repetition_penalty,
            max_tokens=max_tokens, min_tokens=min(req.min_tokens, max_tokens), stop=stop,
            stop_token_ids=req.stop_token_ids or [], ignore_eos=req.ignore_eos,
            include_stop_str_in_output=req.include_stop_str_in_output, logprobs=logprobs,
            skip_special_tokens=req.skip_special_tokens,
        )
    except ValueError as exc:
        raise bad_request(str(exc), param=getattr(exc, "param", None)) from None


def _start(st: ServerState, rid: str, ids: list[int], params, mm=None):
    """Admit and start one request (the errors of _admit); mm: its images, if any."""
    return _admit(st, ids, params, start=rid, mm=mm)


def _admit(st: ServerState, ids: list[int], params, start: str | None = None, mm=None):
    from g906.engine.async_engine import EngineDead, QueueFull

    try:
        if start is not None:
            if mm is not None:
                return st.engine.generate(start, ids, params, mm=mm)
            return st.engine.generate(start, ids, params)
        st.engine.check(ids, params)
    except QueueFull as exc:
        raise APIError(503, str(exc), code="queue_full", headers={"Retry-After": "1"}) from None
    except EngineDead as exc:
        raise APIError(503, str(exc), code="engine_unavailable") from None
    except ValueError as exc:
        raise bad_request(str(exc), code="context_length_exceeded" if "max_model_len" in str(exc) else None) from None


async def _merge(gens: list[AsyncIterator]) -> AsyncIterator[tuple[int, Any]]:
    """Interleave several async iterators; closing this one closes (aborts) all of them."""
    if len(gens) == 1:
        try:
            async for item in gens[0]:
                yield 0, item
        finally:
            await gens[0].aclose()
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

    tasks = [asyncio.ensure_future(pump(i, g)) for i, g in enumerate(gens)]
    try:
        left = len(gens)
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


async def _until_disconnect(receive) -> None:
    while True:
        msg = await receive()
        if msg["type"] == "http.disconnect":
            return


class SSEResponse(Response):
    """Server-sent events from an async iterator of str events; stops (and so aborts the request)
    as soon as the client disconnects, even while the engine has nothing new to send.

    request_id names the stream in the log; requests are its engine streams (RequestStream), closed
    (aborted) at once if the server cancels the response while it runs."""

    media_type = "text/event-stream"

    def __init__(self, events: AsyncIterator[str], headers: dict[str, str] | None = None, *,
                 request_id: str = "?", requests: list | tuple = ()):
        self.status_code = 200
        self.background = None
        self.events = events
        self.request_id = request_id
        self.requests = requests
        self.raw_headers = [
            (b"content-type", b"text/event-stream; charset=utf-8"),
            (b"cache-control", b"no-cache"),
            (b"x-accel-buffering", b"no"),
        ] + [(k.lower().encode("latin-1"), v.encode("latin-1")) for k, v in (headers or {}).items()]

    async def __call__(self, scope, receive, send) -> None:
        await send({"type": "http.response.start", "status": self.status_code, "headers": self.raw_headers})
        watcher = asyncio.ensure_future(_until_disconnect(receive))
        it = self.events.__aiter__()
        nxt: asyncio.Future | None = None
        completed = cut_off = False
        try:
            while True:
                nxt = asyncio.ensure_future(it.__anext__())
                done, _ = await asyncio.wait({nxt, watcher}, return_when=asyncio.FIRST_COMPLETED)
                if nxt not in done:
                    nxt.cancel()
                    await asyncio.gather(nxt, return_exceptions=True)
                    break
                try:
                    chunk = nxt.result()
                except StopAsyncIteration:
                    completed = True
                    break
                try:
                    await send({"type": "http.response.body", "body": chunk.encode("utf-8"), "more_body": True})
                except OSError:
                    break
            if completed:
                try:
                    await send({"type": "http.response.body", "body": b"", "more_body": False})
                except OSError:
                    pass
        except asyncio.CancelledError:
            cut_off = True
            await self._cut_off(send, nxt)
        finally:
            watcher.cancel()
            if not cut_off:   # after a cut-off nothing more is awaited (see _cut_off)
                await asyncio.gather(watcher, return_exceptions=True)
                await self.events.aclose()

    async def _cut_off(self, send, nxt: asyncio.Future | None) -> None:
        """The server cancelled this response while it streamed: uvicorn does so when a stream outlasts
        its graceful-shutdown period, and its event loop stops (cancelling every task once more) right
        after. So: abort the engine request, end the stream with an error event and [DONE] if the
        connection takes them without waiting, log one line, and return normally. Re-raising the
        CancelledError would only make uvicorn log a traceback and drop the connection mid-chunk."""
        asyncio.current_task().uncancel()    # handled here; lets asyncio.timeout below work as usual
        for r in self.requests:
            r.close()                        # the disconnect path's abort (RequestStream._cleanup), at once
        if nxt is not None:
            nxt.cancel()                     # unwinds the event generator; not awaited: the loop may be stopping
        err = APIError(503, "the server is shutting down: this stream was still running when its drain "
                            "period ended, so it was stopped", code="server_shutting_down")
        sent = False
        try:
            # send() returns at once unless the client stopped reading (paused writes): bounded for that case
            async with asyncio.timeout(1.0):
                await send({"type": "http.response.body", "body": (_stream_error(err) + SSE_DONE).encode(),
                            "more_body": True})
                await send({"type": "http.response.body", "body": b"", "more_body": False})
            sent = True
        except (OSError, TimeoutError, asyncio.CancelledError):
            pass   # the connection is gone or stuck; uvicorn closes it
        log.warning("stream %s cut off: the server is shutting down and it outlasted the drain period; "
                    "the request was aborted%s", self.request_id,
                    ", the client was sent a server_shutting_down error" if sent else
                    " (the client could not be told)")


async def _race_disconnect(request: Request, coro):
    """Run coro; if the client disconnects first, cancel it (which aborts its engine requests)."""
    task = asyncio.ensure_future(coro)
    watcher = asyncio.ensure_future(_until_disconnect(request.receive))
    try:
        done, _ = await asyncio.wait({task, watcher}, return_when=asyncio.FIRST_COMPLETED)
        if task in done:
            return task.result()
        task.cancel()
        await asyncio.gather(task, return_exceptions=True)
        return Response(status_code=499)
    finally:
        watcher.cancel()
        await asyncio.gather(watcher, return_exceptions=True)


SSE_DONE = "data: [DONE]\n\n"     # a stream's last event


def _sse(obj: BaseModel | dict) -> str:
    if isinstance(obj, BaseModel):
        text = obj.model_dump_json(exclude_none=False)
    else:
        text = json.dumps(obj)
    return f"data: {text}\n\n"


def _stream_error(exc: Exception) -> str:
    if isinstance(exc, APIError):
        return _sse(exc.body())
    return _sse(APIError(500, f"the engine failed while streaming: {exc}").body())


# -- logprobs formatting ------------------------------------------------------------------------

def _chat_logprobs(eng, lps) -> list[P.TokenLogprob]:
    out = []
    for lp in lps:
        b = eng.token_bytes(lp.token_id)
        out.append(P.TokenLogprob(
            token=eng.token_text(lp.token_id), logprob=_finite(lp.logprob), bytes=list(b),
            top_logprobs=[P.TopLogprob(token=eng.token_text(t), logprob=_finite(v), bytes=list(eng.token_bytes(t)))
                          for t, v in lp.top],
        ))
    return out


def _finite(x: float) -> float:
    return x if x == x and x not in (float("inf"), float("-inf")) else -9999.0


def _completion_logprobs(eng, lps, offset: int) -> P.CompletionLogprobs:
    res = P.CompletionLogprobs()
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


# -- chat -----------------------------------------------------------------------------------------

def _messages(req: P.ChatCompletionRequest, images: list[str] | None = None) -> list[dict]:
    """The messages as template input; image parts (collected into `images`, when given) become
    the model's image placeholder in the text (g906/engine/vision/glue.py)."""
    from g906.engine.vision.glue import IMAGE_PART_TYPES, image_part_url, placeholder_text
    from g906.errors import G906Error

    out = []
    for i, m in enumerate(req.messages):
        d = m.model_dump(exclude_none=True, exclude=set(m.model_extra or {}))
        if isinstance(m.content, list):
            texts = []
            for j, part in enumerate(m.content):
                if images is not None and not isinstance(part, P.TextPart) and part.type in IMAGE_PART_TYPES:
                    try:
                        images.append(image_part_url(part.model_dump(), f"messages[{i}].content[{j}]"))
                    except G906Error as exc:
                        raise bad_request(exc.message, param=f"messages.{i}.content.{j}") from None
                    texts.append(placeholder_text())
                    continue
                if not isinstance(part, P.TextPart):
                    raise bad_request(f"messages[{i}].content: content parts of type {part.type!r} are not supported "
                                      "by this server (text and image_url only)", param=f"messages.{i}.content")
                texts.append(part.text)
            d["content"] = "".join(texts)
        out.append(d)
    return out


async def chat_completions(request: Request) -> Response:
    st = _state(request)
    req, ignored = await _parse(request, st, P.ChatCompletionRequest)
    assert isinstance(req, P.ChatCompletionRequest)
    if req.response_format is not None and req.response_format.type != "text":
        raise bad_request(f"response_format {req.response_format.type!r} is not supported (only \"text\")",
                          param="response_format")
    from g906.errors import G906Error

    images: list[str] = []
    try:
        prompt_text = st.prompts.render_chat(
            _messages(req, images), add_generation_prompt=req.add_generation_prompt, tools=req.tools,
            **(req.chat_template_kwargs or {}),
        )
        ids = st.prompts.encode(prompt_text)
    except G906Error as exc:
        raise bad_request(exc.message, param="messages") from None
    except TypeError as exc:
        raise bad_request(f"chat_template_kwargs: {exc}", param="chat_template_kwargs") from None
    if not ids:
        raise bad_request("the rendered prompt is empty", param="messages")
    mm = None
    if images:  # fetched, checked against the limits, resized; placeholders expanded (400 on failure)
        from g906.engine.vision.glue import prepare_chat_images

        try:
            ids, mm = await prepare_chat_images(getattr(st.engine.engine, "vision", None), ids, images)
        except G906Error as exc:
            raise bad_request(exc.message, param="messages", code="invalid_image") from None
    logprobs = (req.top_logprobs or 0) if req.logprobs else None
    params = _sampling(req, max_tokens=req.max_completion_tokens or req.max_tokens, prompt_len=len(ids), st=st,
                       logprobs=logprobs)
    rid = P.new_id("chatcmpl")
    gen = _start(st, rid, ids, params, mm)
    st.metrics.on_prompt(len(ids))
    ctx = dict(rid=rid, created=P.now(), model=st.served_model_name, n=req.n, prompt_len=len(ids),
               prompt_text=prompt_text, logprobs=req.logprobs)
    if req.stream:
        opts = req.stream_options or P.StreamOptions()
        return SSEResponse(_chat_stream(st, gen, ctx, opts), headers=_headers(ignored), request_id=rid,
                           requests=[gen])
    resp = await _race_disconnect(request, _chat_full(st, gen, ctx))
    if isinstance(resp, Response):
        return resp
    return JSONResponse(resp.model_dump(mode="json"), headers=_headers(ignored))


async def _chat_full(st: ServerState, gen, ctx) -> P.ChatCompletionResponse:
    eng = st.engine.engine
    n = ctx["n"]
    texts = [""] * n
    counts = [0] * n
    lps: list[list] = [[] for _ in range(n)]
    finish: list[Any] = [None] * n
    stop_reason: list[Any] = [None] * n
    async for _, (i, out) in _merge([gen]):
        texts[i] += out.new_text
        counts[i] += len(out.new_token_ids)
        lps[i].extend(out.new_logprobs)
        if out.finished:
            finish[i], stop_reason[i] = out.finish_reason, out.stop_reason
    choices = []
    for i in range(n):
        parser = make_parser(st.reasoning_parser, ctx["prompt_text"])
        if parser is not None:
            reasoning, content = parser.parse(texts[i])
        else:
            reasoning, content = None, texts[i]
        choices.append(P.ChatChoice(
            index=i,
            message=P.ResponseMessage(content=content, reasoning_content=reasoning, reasoning=reasoning),
            logprobs=P.ChoiceLogprobs(content=_chat_logprobs(eng, lps[i])) if ctx["logprobs"] else None,
            finish_reason=finish[i], stop_reason=stop_reason[i],
        ))
    done = sum(counts)
    return P.ChatCompletionResponse(
        id=ctx["rid"], created=ctx["created"], model=ctx["model"], choices=choices,
        usage=P.Usage(prompt_tokens=ctx["prompt_len"], completion_tokens=done, total_tokens=ctx["prompt_len"] + done),
    )


async def _chat_stream(st: ServerState, gen, ctx, opts: P.StreamOptions) -> AsyncIterator[str]:
    eng = st.engine.engine
    n = ctx["n"]
    base = dict(id=ctx["rid"], created=ctx["created"], model=ctx["model"])
    parsers = [make_parser(st.reasoning_parser, ctx["prompt_text"]) for _ in range(n)]
    counts = [0] * n

    def usage():
        c = sum(counts)
        return P.Usage(prompt_tokens=ctx["prompt_len"], completion_tokens=c, total_tokens=ctx["prompt_len"] + c)

    try:
        for i in range(n):
            yield _sse(P.ChatCompletionChunk(**base, choices=[P.ChatChunkChoice(
                index=i, delta=P.DeltaMessage(role="assistant", content=""))],
                usage=usage() if opts.continuous_usage_stats else None))
        async for _, (i, out) in _merge([gen]):
            counts[i] += len(out.new_token_ids)
            reasoning, content = "", out.new_text
            p = parsers[i]
            if p is not None:
                reasoning, content = p.feed(out.new_text)
                if out.finished:
                    r2, c2 = p.finish()
                    reasoning, content = reasoning + r2, content + c2
            lp = P.ChoiceLogprobs(content=_chat_logprobs(eng, out.new_logprobs)) if out.new_logprobs else None
            if not (reasoning or content or out.finished or lp):
                continue
            delta = P.DeltaMessage(content=content or None, reasoning_content=reasoning or None,
                                   reasoning=reasoning or None)
            yield _sse(P.ChatCompletionChunk(**base, choices=[P.ChatChunkChoice(
                index=i, delta=delta, logprobs=lp,
                finish_reason=out.finish_reason if out.finished else None,
                stop_reason=out.stop_reason if out.finished else None)],
                usage=usage() if opts.continuous_usage_stats else None))
        if opts.include_usage:
            yield _sse(P.ChatCompletionChunk(**base, choices=[], usage=usage()))
    except Exception as exc:  # noqa: BLE001 - the status line is gone; report in the stream
        log.exception("chat stream failed")
        yield _stream_error(exc)
    yield SSE_DONE


# -- completions ---------------------------------------------------------------------------------

def _completion_prompts(st: ServerState, req: P.CompletionRequest) -> list[tuple[str | None, list[int]]]:
    p = req.prompt
    if isinstance(p, str):
        items: list = [p]
    elif p and all(isinstance(x, int) for x in p):
        items = [p]
    else:
        items = list(p)
    out = []
    for item in items:
        if isinstance(item, str):
            ids = st.prompts.encode(item)
            if not ids:
                raise bad_request("a prompt encodes to no tokens", param="prompt")
            out.append((item, ids))
        else:
            out.append((None, list(item)))
    return out


async def completions(request: Request) -> Response:
    st = _state(request)
    req, ignored = await _parse(request, st, P.CompletionRequest)
    assert isinstance(req, P.CompletionRequest)
    if req.suffix:
        raise bad_request("suffix is not supported", param="suffix")
    prompts = _completion_prompts(st, req)
    plist = []
    for text, ids in prompts:
        params = _sampling(req, max_tokens=req.max_tokens, prompt_len=len(ids), st=st, logprobs=req.logprobs)
        plist.append(params)
    for (text, ids), params in zip(prompts, plist):
        _admit(st, ids, params)      # prompt checks (and a queue check) before anything starts
    # check the whole batch fits in the queue before starting any of it
    from g906.engine.sampling_params import SamplingParams as _SP

    total_n = sum(p.n for p in plist)
    if len(plist) > 1:
        _admit(st, prompts[0][1], _SP(n=total_n, max_tokens=1))
    rid = P.new_id("cmpl")
    gens = []
    try:
        for k, ((text, ids), params) in enumerate(zip(prompts, plist)):
            gens.append(_start(st, rid if len(prompts) == 1 else f"{rid}-{k}", ids, params))
    except BaseException:
        for g in gens:
            g.close()
        raise
    for _, ids in prompts:
        st.metrics.on_prompt(len(ids))
    ctx = dict(rid=rid, created=P.now(), model=st.served_model_name, n=req.n, prompts=prompts)
    if req.stream:
        opts = req.stream_options or P.StreamOptions()
        return SSEResponse(_completion_stream(st, req, gens, ctx, opts), headers=_headers(ignored),
                           request_id=rid, requests=gens)
    resp = await _race_disconnect(request, _completion_full(st, req, gens, ctx))
    if isinstance(resp, Response):
        return resp
    return JSONResponse(resp.model_dump(mode="json"), headers=_headers(ignored))


def _prompt_text(st: ServerState, text: str | None, ids: list[int]) -> str:
    return text if text is not None else st.engine.engine.tokenizer.decode(ids, skip_special_tokens=False)


async def _completion_full(st, req: P.CompletionRequest, gens, ctx) -> P.CompletionResponse:
    eng = st.engine.engine
    n = ctx["n"]
    total = len(gens) * n
    texts = [""] * total
    counts = [0] * total
    lps: list[list] = [[] for _ in range(total)]
    finish: list[Any] = [None] * total
    stop_reason: list[Any] = [None] * total
    async for k, (i, out) in _merge(gens):
        j = k * n + i
        texts[j] += out.new_text
        counts[j] += len(out.new_token_ids)
        lps[j].extend(out.new_logprobs)
        if out.finished:
            finish[j], stop_reason[j] = out.finish_reason, out.stop_reason
    choices = []
    for j in range(total):
        k = j // n
        prefix = _prompt_text(st, *ctx["prompts"][k]) if req.echo else ""
        choices.append(P.CompletionChoice(
            index=j, text=prefix + texts[j],
            logprobs=_completion_logprobs(eng, lps[j], len(prefix)) if req.logprobs is not None else None,
            finish_reason=finish[j], stop_reason=stop_reason[j]))
    plen = sum(len(ids) for _, ids in ctx["prompts"]) * 1
    done = sum(counts)
    return P.CompletionResponse(id=ctx["rid"], created=ctx["created"], model=ctx["model"], choices=choices,
                                usage=P.Usage(prompt_tokens=plen, completion_tokens=done, total_tokens=plen + done))


async def _completion_stream(st, req: P.CompletionRequest, gens, ctx, opts: P.StreamOptions) -> AsyncIterator[str]:
    eng = st.engine.engine
    n = ctx["n"]
    base = dict(id=ctx["rid"], created=ctx["created"], model=ctx["model"])
    plen = sum(len(ids) for _, ids in ctx["prompts"])
    counts: dict[int, int] = {}
    offsets: dict[int, int] = {}

    def usage():
        c = sum(counts.values())
        return P.Usage(prompt_tokens=plen, completion_tokens=c, total_tokens=plen + c)

    try:
        if req.echo:
            for k, (text, ids) in enumerate(ctx["prompts"]):
                for i in range(n):
                    t = _prompt_text(st, text, ids)
                    offsets[k * n + i] = len(t)
                    yield _sse(P.CompletionResponse(**base, choices=[P.CompletionChoice(
                        index=k * n + i, text=t, finish_reason=None)]))
        async for k, (i, out) in _merge(gens):
            j = k * n + i
            counts[j] = counts.get(j, 0) + len(out.new_token_ids)
            lp = None
            if req.logprobs is not None:
                lp = _completion_logprobs(eng, out.new_logprobs, offsets.get(j, 0))
            offsets[j] = offsets.get(j, 0) + len(out.new_text)
            if not (out.new_text or out.finished or lp):
                continue
            yield _sse(P.CompletionResponse(**base, choices=[P.CompletionChoice(
                index=j, text=out.new_text, logprobs=lp,
                finish_reason=out.finish_reason if out.finished else None,
                stop_reason=out.stop_reason if out.finished else None)],
                usage=usage() if opts.continuous_usage_stats else None))
        if opts.include_usage:
            yield _sse(P.CompletionResponse(**base, choices=[], usage=usage()))
    except Exception as exc:  # noqa: BLE001
        log.exception("completion stream failed")
        yield _stream_error(exc)
    yield SSE_DONE


# -- the rest -------------------------------------------------------------------------------------

async def list_models(request: Request) -> Response:
    st = _state(request)
    _check_auth(request, st)
    card = P.ModelCard(id=st.served_model_name, created=P.now(), root=st.served_model_name,
                       max_model_len=st.max_model_len)
    return JSONResponse(P.ModelList(data=[card]).model_dump(mode="json"))


async def get_model(request: Request) -> Response:
    st = _state(request)
    _check_auth(request, st)
    mid = request.path_params["model_id"]
    if mid != st.served_model_name:
        raise APIError(404, f"the model {mid!r} does not exist", param="model", code="model_not_found")
    card = P.ModelCard(id=st.served_model_name, created=P.now(), root=st.served_model_name,
                       max_model_len=st.max_model_len)
    return JSONResponse(card.model_dump(mode="json"))


async def health(request: Request) -> Response:
    st = _state(request)
    if st.status == "ok" and st.engine is not None and st.engine.running:
        return JSONResponse({"status": "ok"})
    status = st.status if st.status != "ok" else "failed"
    detail = st.detail or ("the model is loading" if status == "loading" else "the engine stopped")
    return JSONResponse({"status": status, "detail": detail}, status_code=503)


async def metrics(request: Request) -> Response:
    st = _state(request)
    return Response(st.metrics.render(), media_type="text/plain; version=0.0.4; charset=utf-8")


async def version(request: Request) -> Response:
    st = _state(request)
    return JSONResponse(P.VersionInfo(version=__version__, model=st.served_model_name,
                                      engine=st.engine_info).model_dump(mode="json"))


async def openapi(request: Request) -> Response:
    from g906.server.openapi import openapi_document

    return JSONResponse(openapi_document())


async def _api_error(request: Request, exc: APIError) -> Response:
    if exc.status >= 500 or exc.status in (401, 413):
        _state(request).metrics.http_errors.labels(str(exc.status)).inc()
    return exc.response()


async def _http_error(request: Request, exc: HTTPException) -> Response:
    return APIError(exc.status_code, exc.detail or "error", code=None).response(dict(exc.headers or {}))


async def _internal_error(request: Request, exc: Exception) -> Response:
    from g906.engine.async_engine import EngineDead

    if isinstance(exc, EngineDead):   # the engine stopped under a running request: unavailable, not a bug here
        log.error("engine unavailable on %s %s: %s", request.method, request.url.path, exc)
        _state(request).metrics.http_errors.labels("503").inc()
        return APIError(503, str(exc), code="engine_unavailable").response()
    log.error("internal error on %s %s", request.method, request.url.path, exc_info=exc)
    _state(request).metrics.http_errors.labels("500").inc()
    return APIError(500, f"internal error: {type(exc).__name__}", code="internal_error").response()


def create_app(state: ServerState) -> Starlette:
    routes = [
        Route("/v1/chat/completions", chat_completions, methods=["POST"]),
        Route("/v1/completions", completions, methods=["POST"]),
        Route("/v1/models", list_models, methods=["GET"]),
        Route("/v1/models/{model_id:path}", get_model, methods=["GET"]),
        Route("/health", health, methods=["GET"]),
        Route("/metrics", metrics, methods=["GET"]),
        Route("/version", version, methods=["GET"]),
        Route("/openapi.json", openapi, methods=["GET"]),
    ]
    app = Starlette(routes=routes, exception_handlers={
        APIError: _api_error, HTTPException: _http_error, Exception: _internal_error,
    })
    app.state.g906 = state
    return app
