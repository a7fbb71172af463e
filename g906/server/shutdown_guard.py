"""Requests cut by shutdown leave in OpenAI's error shape, like the streams (sse.py) do.

uvicorn cancels the requests that outlast its graceful-shutdown period. A request whose response
has not started (a non-streamed answer still being generated, a body still being read) would
then end in uvicorn's plain-text 500 and a logged traceback. This ASGI wrapper answers it with
503 server_shutting_down instead, logs one line, and returns normally; responses already started
(streams) handle their own cut-off."""

from __future__ import annotations

import asyncio
import logging

from g906.server.errors import APIError

log = logging.getLogger("g906.server")


class ShutdownGuard:
    def __init__(self, app):
        self.app = app

    async def __call__(self, scope, receive, send) -> None:
        if scope["type"] != "http":
            await self.app(scope, receive, send)
            return
        started = False

        async def tracked_send(message) -> None:
            nonlocal started
            if message["type"] == "http.response.start":
                started = True
            await send(message)

        try:
            await self.app(scope, receive, tracked_send)
        except asyncio.CancelledError:
            if started:
                raise
            await self._cut_off(scope, send)

    @staticmethod
    async def _cut_off(scope, send) -> None:
        asyncio.current_task().uncancel()     # handled here; lets asyncio.timeout below work
        err = APIError(503, "the server is shutting down: this request was still running when its drain "
                            "period ended, so it was stopped", code="server_shutting_down")
        sent = False
        try:
            # the loop is about to stop: never wait long on a client that does not read
            async with asyncio.timeout(1.0):
                resp = err.response({"Connection": "close"})
                await resp(scope, _no_receive, send)
            sent = True
        except (OSError, TimeoutError, asyncio.CancelledError):
            pass
        log.warning("%s %s cut off: the server is shutting down and the request outlasted the drain "
                    "period%s", scope.get("method"), scope.get("path"),
                    "; the client was sent a server_shutting_down error" if sent else " (the client could not be told)")


async def _no_receive():
    return {"type": "http.disconnect"}
