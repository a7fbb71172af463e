"""The API key: `Authorization: Bearer <key>` (or Anthropic's `x-api-key: <key>`) on /v1/*, when
the server was started with one."""

from __future__ import annotations

import hmac

from starlette.requests import Request

from g906.server.errors import APIError
from g906.server.state import ServerState


def check_auth(request: Request, st: ServerState) -> None:
    if not st.api_key:
        return
    x_key = request.headers.get("x-api-key")
    if x_key is not None:
        scheme, token = "bearer", x_key
    else:
        scheme, _, token = request.headers.get("authorization", "").partition(" ")
    # constant-time: the comparison must not tell a client how much of a guessed key was right
    if scheme.lower() != "bearer" or not hmac.compare_digest(token.strip().encode(), st.api_key.encode()):
        raise APIError(401, "missing or incorrect API key: send it as 'Authorization: Bearer <key>' or 'x-api-key: <key>'",
                       code="invalid_api_key", headers={"WWW-Authenticate": "Bearer"})
