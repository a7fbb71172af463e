"""vLLM's extra routes, with vLLM's shapes: GET /load (the server's load: generation requests
in flight), GET /tokenizer_info (the tokenizer's configuration), and POST /invocations
(SageMaker's single entry point: a body with `messages` is a chat completion, one with `prompt`
a text completion)."""

from __future__ import annotations

import json

from starlette.requests import Request
from starlette.responses import JSONResponse, Response

from g906.server.auth import check_auth
from g906.server.errors import APIError, bad_request
from g906.server.intake import check_ready
from g906.server.state import state_of


async def load(request: Request) -> Response:
    st = state_of(request)
    check_auth(request, st)
    eng = getattr(st.engine, "engine", None)
    return JSONResponse({"server_load": int(getattr(eng, "num_requests", 0) or 0)})


async def tokenizer_info(request: Request) -> Response:
    st = state_of(request)
    check_auth(request, st)
    check_ready(st)
    tok = st.engine.engine.tokenizer
    specials = dict(getattr(tok, "special_tokens_map", {}) or {})
    info = {
        "tokenizer_class": type(tok).__name__,
        "model_max_length": st.max_model_len,
        "vocab_size": getattr(tok, "vocab_size", None),
        "eos_token_id": getattr(tok, "eos_token_id", None),
        "eos_token_ids": list(getattr(tok, "eos_token_ids", []) or []),
        "bos_token_id": getattr(tok, "bos_token_id", None),
        "pad_token_id": getattr(tok, "pad_token_id", None),
        "add_bos_token": bool(getattr(tok, "add_bos_token", False)),
        "chat_template": getattr(st.prompts, "template_source", None) or getattr(tok, "chat_template", None),
        **specials,
    }
    return JSONResponse(info)


async def invocations(request: Request) -> Response:
    """Routes by the body's shape, as vLLM's SageMaker entry point does; the chosen route reads
    the body itself (Starlette caches it), so every check and error is that route's."""
    from g906.server.chat_completions import chat_completions
    from g906.server.completions import completions

    st = state_of(request)
    check_auth(request, st)
    body = await request.body()
    try:
        data = json.loads(body) if body.strip() else None
    except (json.JSONDecodeError, UnicodeDecodeError) as exc:
        raise bad_request(f"the request body is not valid JSON: {exc}", code="invalid_json") from None
    if not isinstance(data, dict):
        raise bad_request("the request body must be a JSON object with \"messages\" (chat) or \"prompt\" (completion)")
    if "messages" in data:
        return await chat_completions(_replay(request, body))
    if "prompt" in data:
        return await completions(_replay(request, body))
    raise APIError(400, "cannot route this request: /invocations takes a chat completion (with \"messages\") "
                        "or a text completion (with \"prompt\")", code="invalid_request_error")


def _replay(request: Request, body: bytes) -> Request:
    """The request again, its body readable once more by the route."""
    sent = False

    async def receive():
        nonlocal sent
        if not sent:
            sent = True
            return {"type": "http.request", "body": body, "more_body": False}
        return await request.receive()

    return Request(request.scope, receive)
