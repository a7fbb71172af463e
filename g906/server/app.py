"""The Starlette app: OpenAI-compatible routes (and Anthropic's Messages API, OpenAI's Responses API) over the async engine.

    state = ServerState(served_model_name="tiny", ...)
    app = create_app(state)          # /health answers 503 until state.set_ready(engine, ...)

Every error leaves in OpenAI's JSON shape (errors.py), Anthropic's on /v1/messages. Streams are server-sent events ending in
`data: [DONE]` (sse.py); a client that disconnects (from a stream or while waiting for a
non-stream answer) aborts its request at once (disconnect.py)."""

from __future__ import annotations

from starlette.applications import Starlette
from starlette.middleware import Middleware
from starlette.routing import Route

from g906.server import anthropic_messages, docs_routes, info_routes, responses_routes, tokenize_routes, vllm_routes
from g906.server.chat_batch import chat_completions_batch
from g906.server.chat_completions import chat_completions
from g906.server.completions import completions
from g906.server.decisions import decisions
from g906.server.errors import EXCEPTION_HANDLERS
from g906.server.root_path import RootPath
from g906.server.shutdown_guard import ShutdownGuard
from g906.server.state import DEFAULT_MAX_BODY_BYTES, ServerState

__all__ = ["DEFAULT_MAX_BODY_BYTES", "ServerState", "create_app"]


def create_app(state: ServerState) -> Starlette:
    routes = [
        Route("/v1/chat/completions", chat_completions, methods=["POST"]),
        Route("/v1/chat/completions/batch", chat_completions_batch, methods=["POST"]),
        Route("/v1/completions", completions, methods=["POST"]),
        Route("/v1/decisions", decisions, methods=["POST"]),
        Route("/v1/messages", anthropic_messages.messages, methods=["POST"]),
        Route("/v1/messages/count_tokens", anthropic_messages.count_tokens, methods=["POST"]),
        *responses_routes.ROUTES,
        Route("/v1/models", info_routes.list_models, methods=["GET"]),
        Route("/v1/models/{model_id:path}", info_routes.get_model, methods=["GET"]),
        Route("/health", info_routes.health, methods=["GET"]),
        Route("/metrics", info_routes.metrics, methods=["GET"]),
        Route("/version", info_routes.version, methods=["GET"]),
        Route("/openapi.json", info_routes.openapi, methods=["GET"]),
        *tokenize_routes.ROUTES,
        *docs_routes.ROUTES,
        Route("/load", vllm_routes.load, methods=["GET"]),
        Route("/tokenizer_info", vllm_routes.tokenizer_info, methods=["GET"]),
        Route("/invocations", vllm_routes.invocations, methods=["POST"]),
    ]
    prefix = [Middleware(RootPath, prefix=state.root_path)] if state.root_path else []
    app = Starlette(routes=routes, exception_handlers=dict(EXCEPTION_HANDLERS),
                    middleware=[*prefix, Middleware(ShutdownGuard)])
    app.state.g906 = state
    return app
