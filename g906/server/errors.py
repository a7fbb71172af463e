"""Errors in OpenAI's JSON shape: {"error": {"message", "type", "param", "code"}}."""

from __future__ import annotations

from starlette.responses import JSONResponse

_TYPES = {
    400: "invalid_request_error",
    401: "invalid_request_error",
    404: "invalid_request_error",
    405: "invalid_request_error",
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
