"""A client that disconnects, from a stream or while it waits for a full answer, aborts its
request at once: nobody is left to read the tokens, so the engine must not keep making them."""

from __future__ import annotations

import asyncio

from starlette.requests import Request
from starlette.responses import Response


async def until_disconnect(receive) -> None:
    while True:
        msg = await receive()
        if msg["type"] == "http.disconnect":
            return


async def race_disconnect(request: Request, coro):
    """Run coro; if the client disconnects first, cancel it (which aborts its engine requests)."""
    task = asyncio.ensure_future(coro)
    watcher = asyncio.ensure_future(until_disconnect(request.receive))
    try:
        done, _ = await asyncio.wait({task, watcher}, return_when=asyncio.FIRST_COMPLETED)
        if task in done:
            return task.result()
        task.cancel()
        await asyncio.gather(task, return_exceptions=True)
        return Response(status_code=499)
    except asyncio.CancelledError:
        task.cancel()     # the server cut this request off (shutdown): its engine requests stop too
        raise
    finally:
        watcher.cancel()
        await asyncio.gather(watcher, return_exceptions=True)
