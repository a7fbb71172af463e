"""Errors in OpenAI's JSON shape: {"error": {"message", "type", "param", "code"}}."""

from __future__ import annotations

import logging

from starlette.exceptions import HTTPException
from starlette.requests import Request
from starlette.responses import JSONResponse, Response

from g906.server.state import state_of

log = logging.getLogger("g906.server")

_TYPES = {
    400: "invalid_request_error",
    401: "invalid_request_error",
    404: "invalid_request_error",
    405: "invalid_request_error",
    408: "invalid_request_error",
    413: "invalid_request_error",
    415: "invalid_request_error",
    500: "server_error",
    503: "server_error",
}


class APIError(Exception):
    def __init__(self, status: int, message: str, *, param: str | None = None, code: str | None = None,
                 type: str | None = None, headers: dict[str, str] | None = None):
        super().__init__(message)
        self.status = status
        self.message = message
        self.param = param
        self.code = code
        self.type = type or _TYPES.get(status, "invalid_request_error")
        self.headers = headers or {}

    def body(self) -> dict:
        return {"error": {"message": self.message, "type": self.type, "param": self.param, "code": self.code}}

    def response(self, extra_headers: dict[str, str] | None = None) -> JSONResponse:
        return JSONResponse(self.body(), status_code=self.status, headers={**self.headers, **(extra_headers or {})})


class ClientGone(Exception):
    """The client went away before its request was read: nobody to answer, nothing to log
    beyond a line at debug level."""


def bad_request(message: str, param: str | None = None, code: str | None = None) -> APIError:
    return APIError(400, message, param=param, code=code)


def pydantic_message(exc) -> tuple[str, str | None]:
    """(message, param) for the first problem in a pydantic ValidationError."""
    errs = exc.errors(include_url=False)
    if not errs:
        return "invalid request body", None
    e = errs[0]
    loc = [str(p) for p in e.get("loc", ())]
    # drop union branch names pydantic puts in the location (e.g. "str", "list[int]")
    loc = [p for p in loc if not any(ch in p for ch in "[]") and p not in ("str", "int", "float", "bool")]
    param = ".".join(loc) or None
    msg = e.get("msg", "invalid value")
    more = f" (and {len(errs) - 1} more problems)" if len(errs) > 1 else ""
    return (f"{param}: {msg}{more}" if param else f"{msg}{more}"), param


# -- the app's exception handlers: whatever goes wrong leaves in the shape above -------------------

async def api_error_response(request: Request, exc: APIError) -> Response:
    if exc.status >= 500 or exc.status in (401, 413):
        state_of(request).metrics.http_errors.labels(str(exc.status)).inc()
    return exc.response()


async def http_error_response(request: Request, exc: HTTPException) -> Response:
    return APIError(exc.status_code, exc.detail or "error", code=None).response(dict(exc.headers or {}))


async def client_gone_response(request: Request, exc: ClientGone) -> Response:
    log.debug("%s %s: %s", request.method, request.url.path, exc)
    return Response(status_code=499)     # nginx's "client closed request"; nobody receives it


def internal_error(request: Request, exc: Exception) -> APIError:
    """The API error an unexpected exception answers with (logged and counted here)."""
    from g906.engine.async_engine import EngineDead

    metrics = state_of(request).metrics
    if isinstance(exc, EngineDead):   # the engine stopped under a running request: unavailable, not a bug here
        log.error("engine unavailable on %s %s: %s", request.method, request.url.path, exc)
        metrics.http_errors.labels("503").inc()
        return APIError(503, str(exc), code="engine_unavailable")
    log.error("internal error on %s %s", request.method, request.url.path, exc_info=exc)
    metrics.http_errors.labels("500").inc()
    return APIError(500, f"internal error: {type(exc).__name__}", code="internal_error")


async def internal_error_response(request: Request, exc: Exception) -> Response:
    return internal_error(request, exc).response()


EXCEPTION_HANDLERS = {
    APIError: api_error_response, HTTPException: http_error_response, ClientGone: client_gone_response,
    Exception: internal_error_response,
}
