"""CORS for browser clients (web UIs on another origin): Starlette's middleware, on only when
the recipe names allowed origins (server.allowed_origins / `g906 up --allowed-origins`).

Preflight requests (OPTIONS with Access-Control-Request-Method) from an allowed origin are
answered by the middleware itself, before authentication: browsers never send credentials on a
preflight. Credentials (cookies) are not allowed: clients authenticate with a bearer key."""

from __future__ import annotations

from starlette.middleware.cors import CORSMiddleware


def add_cors(app, allowed_origins: list[str]) -> None:
    if not allowed_origins:
        return
    app.add_middleware(
        CORSMiddleware,
        allow_origins=list(allowed_origins),
        allow_methods=["GET", "POST", "OPTIONS"],
        allow_headers=["*"],
        expose_headers=["x-g906-ignored-fields"],
        max_age=600,
    )
