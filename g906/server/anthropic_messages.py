"""POST /v1/messages and /v1/messages/count_tokens: Anthropic's Messages API as a dialect of the
chat route. The request is translated into a chat request (anthropic_protocol.py), which the chat
route turns into the internal GenerationRequest as it does its own (same template, tools,
constraints, sampling); the one ResponseAssembler parses the output; anthropic_answers.py writes
it in Anthropic's shapes. Every error leaves in Anthropic's error shape."""

from __future__ import annotations

from starlette.requests import Request
from starlette.responses import JSONResponse, Response

from g906.server.anthropic_answers import error_response, message_full, message_stream
from g906.server.parsers import REASONING, parser_name
from g906.server.anthropic_protocol import CountTokensRequest, MessagesRequest, ignored, to_chat_request
from g906.server.assembler import ResponseAssembler
from g906.server.chat_completions import chat_prompt, generation_request
from g906.server.disconnect import race_disconnect
from g906.server.errors import APIError, ClientGone, internal_error
from g906.server.generation import start
from g906.server.intake import ignored_fields_header, parse_request, report_ignored
from g906.server.sse import SSEResponse
from g906.server.state import state_of


def _anthropic_errors(handler):
    """The handler, with its API errors in Anthropic's shape (counted as the app's handler does)."""
    async def route(request: Request) -> Response:
        try:
            return await handler(request)
        except APIError as exc:
            if exc.status >= 500 or exc.status in (401, 413):
                state_of(request).metrics.http_errors.labels(str(exc.status)).inc()
            return error_response(exc)
        except ClientGone:
            raise
        except Exception as exc:  # noqa: BLE001 - logged and counted by internal_error; the shape is Anthropic's
            return error_response(internal_error(request, exc))
    route.__name__ = handler.__name__
    route.__doc__ = handler.__doc__
    return route


@_anthropic_errors
async def messages(request: Request) -> Response:
    st = state_of(request)
    req, _ = await parse_request(request, st, MessagesRequest)
    assert isinstance(req, MessagesRequest)
    budget_on = parser_name(REASONING, st.reasoning_parser, st.architecture) is not None
    names = report_ignored(st, ignored(req, budget_enforced=budget_on))
    greq = await generation_request(st, to_chat_request(req, thinking_budget_on=budget_on), id_prefix="msg",
                                    fit_max_tokens=True)
    asm = ResponseAssembler(greq, reasoning_parser=st.reasoning_parser, tool_parser=st.tool_parser,
                            architecture=st.architecture)
    stops = req.stop_sequences or []
    streams = start(st, greq)
    headers = ignored_fields_header(names)
    if req.stream:
        return SSEResponse(message_stream(asm, streams, stops), headers=headers, request_id=greq.request_id,
                           requests=streams)
    resp = await race_disconnect(request, message_full(asm, streams, stops))
    if isinstance(resp, Response):
        return resp
    return JSONResponse(resp, headers=headers)


@_anthropic_errors
async def count_tokens(request: Request) -> Response:
    """The exact prompt tokens of the request: the ids the generation would start from."""
    st = state_of(request)
    req, _ = await parse_request(request, st, CountTokensRequest)
    assert isinstance(req, CountTokensRequest)
    _, ids, _ = await chat_prompt(st, to_chat_request(req))
    return JSONResponse({"input_tokens": len(ids)})
