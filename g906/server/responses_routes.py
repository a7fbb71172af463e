"""The Responses API routes: POST /v1/responses, GET and DELETE /v1/responses/{id},
POST /v1/responses/{id}/cancel, GET /v1/responses/{id}/input_items.

A request is translated into a chat request (responses_protocol.py), which the chat route turns
into the internal GenerationRequest as it does its own; the one ResponseAssembler parses the
output and responses_answers.py writes the response object or its events. Errors leave in
OpenAI's shape through the app's handlers (errors.py), as on the other OpenAI routes."""

from __future__ import annotations

import asyncio
import uuid

from starlette.requests import Request
from starlette.responses import JSONResponse, Response
from starlette.routing import Route

from g906.server.assembler import ResponseAssembler
from g906.server.auth import check_auth
from g906.server.chat_completions import generation_request
from g906.server.disconnect import race_disconnect
from g906.server.errors import APIError, bad_request
from g906.server.generation import start
from g906.server.intake import ignored_fields_header, parse_request, report_ignored
from g906.server.responses_answers import (ResponseContext, failure, history_of, response_full, response_object,
                                           response_stream)
from g906.server.responses_protocol import ResponsesRequest, drop_oldest_turn, ignored_fields, translate
from g906.server.responses_store import EventLog, StoredResponse, cancel_task, settle
from g906.server.sse import SSEResponse
from g906.server.state import ServerState, state_of


def _not_found(response_id: str, param: str | None = None) -> APIError:
    return APIError(404, f"Response with id '{response_id}' not found.", param=param, code="response_not_found")


# the chat request's fields as the Responses request names them (a chat message's index is not an
# input item's: turns merge, instructions come first)
_PARAMS = {"messages": "input", "max_tokens": "max_output_tokens", "max_completion_tokens": "max_output_tokens",
           "response_format": "text.format"}


def _responses_param(param: str | None) -> str | None:
    if param is None:
        return None
    return _PARAMS.get(param.split(".")[0], param)


async def _generation_request(st: ServerState, chat, *, auto_truncate: bool):
    """The chat route's GenerationRequest; with truncation "auto", a conversation too long for the
    context loses its oldest exchanges until it fits (OpenAI's rule)."""
    while True:
        try:
            return await generation_request(st, chat, id_prefix="resp", fit_max_tokens=True)
        except APIError as exc:
            shorter = drop_oldest_turn(chat) if auto_truncate and exc.code == "context_length_exceeded" else None
            if shorter is None:
                exc.param = _responses_param(exc.param)
                raise
            chat = shorter


def _stored(st: ServerState, response_id: str) -> StoredResponse:
    entry = st.responses.get(response_id)
    if entry is None:
        raise _not_found(response_id)
    return entry


async def create_response(request: Request) -> Response:
    st = state_of(request)
    req, _ = await parse_request(request, st, ResponsesRequest)
    assert isinstance(req, ResponsesRequest)
    if req.background and not req.store:
        raise bad_request("background can only be used when `store` is true", param="background")
    prev: StoredResponse | None = None
    if req.previous_response_id is not None:
        prev = st.responses.get(req.previous_response_id)
        if prev is None:
            raise _not_found(req.previous_response_id, "previous_response_id")
        if prev.running:
            raise bad_request(f"the previous response '{req.previous_response_id}' has not finished "
                              f"(status {prev.response['status']})", param="previous_response_id")
    tr = translate(req, prev.history if prev is not None else [])
    names = report_ignored(st, sorted(set(ignored_fields(req) + tr.ignored)))
    greq = await _generation_request(st, tr.chat, auto_truncate=req.truncation == "auto")
    greq.request_id = f"resp_{uuid.uuid4().hex}"
    ctx = ResponseContext(id=greq.request_id, req=req, tr=tr, eng=st.engine.engine, model=greq.model)
    asm = ResponseAssembler(greq, reasoning_parser=st.reasoning_parser, tool_parser=st.tool_parser,
                            architecture=st.architecture)
    streams = start(st, greq)
    headers = ignored_fields_header(names)

    def keep(resp: dict) -> StoredResponse | None:
        if not req.store:
            return None
        entry = StoredResponse(response=resp, input_items=tr.input_items,
                               history=tr.history + history_of(resp["output"], tr.namespaces))
        st.responses.put(ctx.id, entry)
        return entry

    if req.background:
        entry = keep(response_object(ctx, status="queued"))
        entry.streams = streams
        entry.log = EventLog() if req.stream else None
        entry.task = asyncio.ensure_future(_run_background(st, ctx, asm, streams, entry))
        if entry.log is not None:     # its reader may go away: the generation goes on (no requests=)
            return SSEResponse(entry.log.read(), headers=headers, request_id=ctx.id)
        return JSONResponse(entry.response, headers=headers)
    if req.stream:
        return SSEResponse(response_stream(ctx, asm, streams, keep), headers=headers, request_id=ctx.id,
                           requests=streams)
    resp = await race_disconnect(request, response_full(ctx, asm, streams))
    if isinstance(resp, Response):
        return resp
    keep(resp)
    return JSONResponse(resp, headers=headers)


async def _run_background(st: ServerState, ctx: ResponseContext, asm: ResponseAssembler, streams: list,
                          entry: StoredResponse) -> None:
    """A background response's generation: queued -> in_progress -> completed / incomplete /
    failed; a cancel (or the server's end) leaves it cancelled. With an event log, its events are
    kept there for the readers."""
    entry.response = {**entry.response, "status": "in_progress"}

    def done(resp: dict) -> None:
        if entry.response.get("status") != "cancelled":
            entry.response = resp
            entry.history = entry.history + history_of(resp["output"], ctx.tr.namespaces)

    def failed(err: APIError) -> None:
        # the response's error codes are OpenAI's few: a server-side failure is server_error
        entry.response = {**entry.response, "status": "failed", "error": {"code": "server_error",
                                                                          "message": err.message}}

    try:
        if entry.log is not None:
            async for event in response_stream(ctx, asm, streams, done, failed):
                entry.log.add(event)
        else:
            done(await response_full(ctx, asm, streams))
    except asyncio.CancelledError:
        entry.response = {**entry.response, "status": "cancelled"}
        raise
    except Exception as exc:  # noqa: BLE001 - the client polls: the failure is the response's status
        failed(failure(ctx.id, exc))
    finally:
        if entry.log is not None:
            entry.log.end()
        settle(entry, st.responses)


async def retrieve_response(request: Request) -> Response:
    st = state_of(request)
    check_auth(request, st)
    entry = _stored(st, request.path_params["response_id"])
    q = request.query_params
    if q.get("stream", "false").lower() != "true":
        return JSONResponse(entry.response)
    if entry.log is None:
        raise bad_request("stream: only a background response created with stream=true has events to replay",
                          param="stream")
    try:
        after = int(q.get("starting_after", "-1"))
    except ValueError:
        raise bad_request("starting_after must be an event's sequence number (an integer)",
                          param="starting_after") from None
    return SSEResponse(entry.log.read(after), request_id=entry.response["id"])


async def delete_response(request: Request) -> Response:
    st = state_of(request)
    check_auth(request, st)
    rid = request.path_params["response_id"]
    if st.responses.delete(rid) is None:
        raise _not_found(rid)
    return JSONResponse({"id": rid, "object": "response", "deleted": True})


async def cancel_response(request: Request) -> Response:
    st = state_of(request)
    check_auth(request, st)
    entry = _stored(st, request.path_params["response_id"])
    if not entry.response.get("background"):
        raise bad_request("Cannot cancel a synchronous response.")
    if entry.running:
        entry.response = {**entry.response, "status": "cancelled"}
        cancel_task(entry)
    return JSONResponse(entry.response)


async def list_input_items(request: Request) -> Response:
    st = state_of(request)
    check_auth(request, st)
    entry = _stored(st, request.path_params["response_id"])
    q = request.query_params
    order = q.get("order", "desc")
    if order not in ("asc", "desc"):
        raise bad_request(f"order must be \"asc\" or \"desc\", not {order!r}", param="order")
    try:
        limit = int(q.get("limit", "20"))
    except ValueError:
        raise bad_request("limit must be an integer from 1 to 100", param="limit") from None
    if not 1 <= limit <= 100:
        raise bad_request("limit must be an integer from 1 to 100", param="limit")
    items = list(entry.input_items if order == "asc" else reversed(entry.input_items))
    after = q.get("after")
    if after is not None:
        ids = [i["id"] for i in items]
        if after not in ids:
            raise bad_request(f"after: no input item {after!r} in this response", param="after")
        items = items[ids.index(after) + 1:]
    page = items[:limit]
    return JSONResponse({"object": "list", "data": page, "first_id": page[0]["id"] if page else None,
                         "last_id": page[-1]["id"] if page else None, "has_more": len(items) > limit})


ROUTES = [
    Route("/v1/responses", create_response, methods=["POST"]),
    Route("/v1/responses/{response_id}", retrieve_response, methods=["GET"]),
    Route("/v1/responses/{response_id}", delete_response, methods=["DELETE"]),
    Route("/v1/responses/{response_id}/cancel", cancel_response, methods=["POST"]),
    Route("/v1/responses/{response_id}/input_items", list_input_items, methods=["GET"]),
]
