"""Server-sent events: the framing of a stream's events, and the response that sends them.

A stream is `data: <json>` events ending with `data: [DONE]`; an error after the status line
went out can only be reported in the stream, as one event in OpenAI's error shape."""

from __future__ import annotations

import asyncio
import json
import logging
from typing import AsyncIterator

from pydantic import BaseModel
from starlette.responses import Response

from g906.server.disconnect import until_disconnect
from g906.server.errors import APIError

log = logging.getLogger("g906.server")

SSE_DONE = "data: [DONE]\n\n"     # a stream's last event


def sse_event(obj: BaseModel | dict) -> str:
    if isinstance(obj, BaseModel):
        text = obj.model_dump_json(exclude_none=False)
    else:
        text = json.dumps(obj)
    return f"data: {text}\n\n"


def stream_error(exc: Exception) -> str:
    if isinstance(exc, APIError):
        return sse_event(exc.body())
    return sse_event(APIError(500, f"the engine failed while streaming: {exc}").body())


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
        watcher = asyncio.ensure_future(until_disconnect(receive))
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
                await send({"type": "http.response.body", "body": (stream_error(err) + SSE_DONE).encode(),
                            "more_body": True})
                await send({"type": "http.response.body", "body": b"", "more_body": False})
            sent = True
        except (OSError, TimeoutError, asyncio.CancelledError):
            pass   # the connection is gone or stuck; uvicorn closes it
        log.warning("stream %s cut off: the server is shutting down and it outlasted the drain period; "
                    "the request was aborted%s", self.request_id,
                    ", the client was sent a server_shutting_down error" if sent else
                    " (the client could not be told)")
