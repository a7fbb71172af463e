"""What every generation request goes through before its route sees it, in this order: the API
key, readiness, the body-size limit, JSON, validation against the protocol model, the fields
g906 accepts but does not implement (named once in the log and in every response's
x-g906-ignored-fields header), and the model name."""

from __future__ import annotations

import json
import logging

from pydantic import BaseModel, ValidationError
from starlette.requests import Request

from g906.server import protocol as P
from g906.server.auth import check_auth
from g906.server.errors import APIError, bad_request, pydantic_message
from g906.server.state import ServerState

log = logging.getLogger("g906.server")


def check_ready(st: ServerState) -> None:
    if st.status != "ok" or st.engine is None:
        detail = "the model is still loading" if st.status == "loading" else f"the engine failed: {st.detail}"
        raise APIError(503, detail, code="not_ready", headers={"Retry-After": "5"})


async def read_body(request: Request, limit: int) -> bytes:
    cl = request.headers.get("content-length")
    if cl is not None:
        try:
            if int(cl) > limit:
                raise APIError(413, f"the request body ({cl} bytes) is larger than the limit of {limit} bytes",
                               code="request_too_large")
        except ValueError:
            raise bad_request("invalid Content-Length header") from None
    # a client may send no Content-Length (chunked) or a wrong one: count what actually arrives
    chunks, size = [], 0
    async for chunk in request.stream():
        size += len(chunk)
        if size > limit:
            raise APIError(413, f"the request body is larger than the limit of {limit} bytes", code="request_too_large")
        chunks.append(chunk)
    return b"".join(chunks)


async def parse_request(request: Request, st: ServerState, model_cls: type[BaseModel]) -> tuple[BaseModel, list[str]]:
    """(the validated request, the names of its ignored fields)."""
    check_auth(request, st)
    check_ready(st)
    body = await read_body(request, st.max_body_bytes)
    if not body.strip():
        raise bad_request("the request body is empty: send a JSON object")
    try:
        data = json.loads(body)
    except (json.JSONDecodeError, UnicodeDecodeError) as exc:
        raise bad_request(f"the request body is not valid JSON: {exc}", code="invalid_json") from None
    if not isinstance(data, dict):
        raise bad_request(f"the request body must be a JSON object, not {type(data).__name__}")
    try:
        req = model_cls.model_validate_json(body)
    except ValidationError as exc:
        msg, param = pydantic_message(exc)
        raise bad_request(msg, param=param) from None
    except (ValueError, RecursionError) as exc:
        raise bad_request(f"invalid request body: {exc}") from None
    ignored = P.ignored_fields(req)
    new = [f for f in ignored if f not in st._logged_ignored]
    if new:
        st._logged_ignored.update(new)
        log.warning("ignoring request fields that g906 does not implement: %s "
                    "(each is named once here; responses list them in x-g906-ignored-fields)", ", ".join(new))
    if req.model is not None and req.model != st.served_model_name:
        raise APIError(400, f"the model {req.model!r} does not exist; this server serves {st.served_model_name!r}",
                       param="model", code="model_not_found")
    return req, ignored


def ignored_fields_header(ignored: list[str]) -> dict[str, str]:
    return {"x-g906-ignored-fields": ", ".join(ignored)} if ignored else {}
