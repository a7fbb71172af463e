"""What every generation request goes through before its route sees it, in this order: the API
key, readiness, the body-size limit, JSON (with depth and number limits), validation against the
protocol model, the fields g906 accepts but does not implement (named, bounded and escaped, once
in the log and in every response's x-g906-ignored-fields header), and the model name. Parsing and
validation run in the worker pool (cpu_work.py), never on the event loop."""

from __future__ import annotations

import asyncio
import json
import logging

from pydantic import BaseModel, ValidationError
from starlette.requests import ClientDisconnect, Request

from g906.server import protocol as P
from g906.server.auth import check_auth
from g906.server.cpu_work import offload
from g906.server.errors import APIError, ClientGone, bad_request, pydantic_message
from g906.server.json_limits import JSONLimitError, loads_limited
from g906.server.state import ServerState

log = logging.getLogger("g906.server")


def check_ready(st: ServerState) -> None:
    if st.status != "ok" or st.engine is None:
        detail = "the model is still loading" if st.status == "loading" else f"the engine failed: {st.detail}"
        raise APIError(503, detail, code="not_ready", headers={"Retry-After": "5"})


async def read_body(request: Request, limit: int, timeout_s: float | None = None) -> bytes:
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
    try:
        # one deadline for the whole body: a client trickling it a byte at a time cannot hold a slot
        async with asyncio.timeout(timeout_s):
            async for chunk in request.stream():
                size += len(chunk)
                if size > limit:
                    raise APIError(413, f"the request body is larger than the limit of {limit} bytes",
                                   code="request_too_large")
                chunks.append(chunk)
    except TimeoutError:
        raise APIError(408, f"the request body did not arrive within {timeout_s:g} s ({size} bytes came)",
                       code="request_timeout", headers={"Connection": "close"}) from None
    except ClientDisconnect:
        raise ClientGone(f"the client disconnected after sending {size} bytes of the request body") from None
    return b"".join(chunks)


def _parse(body: bytes, model_cls: type[BaseModel]) -> BaseModel:
    """JSON (limited), then the protocol model: API errors for anything wrong. In the worker pool."""
    try:
        data = loads_limited(body)
    except JSONLimitError as exc:
        raise bad_request(f"the request body is not acceptable JSON: {exc}", code="invalid_json") from None
    except (json.JSONDecodeError, UnicodeDecodeError) as exc:
        raise bad_request(f"the request body is not valid JSON: {exc}", code="invalid_json") from None
    if not isinstance(data, dict):
        raise bad_request(f"the request body must be a JSON object, not {type(data).__name__}")
    try:
        return model_cls.model_validate_json(body)
    except ValidationError as exc:
        msg, param = pydantic_message(exc)
        raise bad_request(msg, param=param) from None
    except (ValueError, RecursionError) as exc:
        raise bad_request(f"invalid request body: {exc}") from None


async def parse_request(request: Request, st: ServerState, model_cls: type[BaseModel]) -> tuple[BaseModel, list[str]]:
    """(the validated request, the names of its ignored fields)."""
    check_auth(request, st)
    check_ready(st)
    body = await read_body(request, st.max_body_bytes, st.body_timeout_s)
    if not body.strip():
        raise bad_request("the request body is empty: send a JSON object")
    req = await offload(_parse, body, model_cls)
    ignored = report_ignored(st, P.ignored_fields(req))
    if req.model is not None and req.model != st.served_model_name:
        raise APIError(400, f"the model {req.model!r} does not exist; this server serves {st.served_model_name!r}",
                       param="model", code="model_not_found")
    return req, ignored


# The names come from the client: bounded (how many, how long), escaped (no CR/LF to split a log
# line or a header, ASCII only: a header must be latin-1) and remembered in a bounded set
MAX_IGNORED_NAMES = 16
MAX_NAME_CHARS = 64
MAX_REMEMBERED_NAMES = 512


def escape_name(name: str) -> str:
    """A client's field name, safe for a header and a log line: printable ASCII kept, the rest
    as \\xNN / \\uNNNN escapes (backslash and comma too, so the list stays unambiguous), at
    most MAX_NAME_CHARS characters."""
    short = name[:MAX_NAME_CHARS]
    out = "".join(c if " " <= c <= "~" and c not in "\\," else
                  (f"\\x{ord(c):02x}" if ord(c) < 0x100 else f"\\u{ord(c):04x}" if ord(c) < 0x10000
                   else f"\\U{ord(c):08x}") for c in short)
    return out + ("..." if len(name) > MAX_NAME_CHARS else "")


def report_ignored(st: ServerState, names: list[str]) -> list[str]:
    """The ignored names as responses list them: escaped, at most MAX_IGNORED_NAMES of them (then
    "(+N more)"); the new ones are logged once, while the set of names seen stays bounded."""
    shown = [escape_name(n) for n in names[:MAX_IGNORED_NAMES]]
    if len(names) > MAX_IGNORED_NAMES:
        shown.append(f"(+{len(names) - MAX_IGNORED_NAMES} more)")
    seen = st._logged_ignored
    new = [n for n in shown if n not in seen]
    if new and len(seen) < MAX_REMEMBERED_NAMES:
        seen.update(new[:MAX_REMEMBERED_NAMES - len(seen)])
        log.warning("ignoring request fields that g906 does not implement: %s "
                    "(each is named once here; responses list them in x-g906-ignored-fields)", ", ".join(new))
    return shown


def ignored_fields_header(ignored: list[str]) -> dict[str, str]:
    return {"x-g906-ignored-fields": ", ".join(ignored)} if ignored else {}
