"""server.root_path (vLLM's --root-path): the API behind a reverse proxy that serves it under a
path prefix, e.g. https://host/llm/v1/... forwarded to this server.

Proxies differ: some strip the prefix before forwarding (the server sees /v1/...), some keep it
(the server sees /llm/v1/...). Both must work, as they do with `vllm serve`, so the prefix is set
as the ASGI scope's root_path on every request and Starlette's router matches the path with the
prefix removed when it has it, and as it is when it has not. Passing the prefix to uvicorn instead
would not do: uvicorn prepends it to every path, so a request that already carries it would be
looked up as /llm/llm/v1/... and miss. Links the server writes (the /docs page's spec URL) carry
the prefix, as a client behind the proxy needs."""

from __future__ import annotations


class RootPath:
    """ASGI middleware: scope["root_path"] = prefix for HTTP requests."""

    def __init__(self, app, prefix: str):
        self.app = app
        self.prefix = prefix

    async def __call__(self, scope, receive, send) -> None:
        if scope["type"] in ("http", "websocket"):
            scope = dict(scope, root_path=self.prefix)
        await self.app(scope, receive, send)
