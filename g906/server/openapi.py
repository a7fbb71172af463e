"""/openapi.json: the OpenAPI 3.1 document of the routes, generated from the pydantic models
that validate the requests and build the responses."""

from __future__ import annotations

from functools import lru_cache

from pydantic.json_schema import models_json_schema

from g906.version import __version__
from g906.server import protocol as P

_REF = "#/components/schemas/{model}"


def _ref(name: str) -> dict:
    return {"$ref": _REF.format(model=name)}


def _errors(*statuses: int) -> dict:
    text = {400: "Bad parameters (unknown model, prompt too long, wrong types or ranges).",
            401: "Missing or wrong API key.", 408: "The request body did not arrive in time.",
            413: "Request body too large.",
            503: "Not ready, or the request queue is full."}
    return {str(s): {"description": text[s], "content": {"application/json": {"schema": _ref("ErrorResponse")}}}
            for s in statuses}


@lru_cache(maxsize=2)
def openapi_document(auth: bool = True) -> dict:
    """auth: whether the server asks for an API key (the document declares bearer auth only then)."""
    from g906.server import decisions, tokenize_routes
    from g906.server.anthropic_protocol import CountTokensRequest, MessagesRequest
    from g906.server.responses_protocol import ResponsesRequest

    models = [(P.ChatCompletionRequest, "validation"), (P.CompletionRequest, "validation"),
              *tokenize_routes.OPENAPI_MODELS, *decisions.OPENAPI_MODELS,
              (MessagesRequest, "validation"), (CountTokensRequest, "validation"), (ResponsesRequest, "validation")]
    models += [(m, "serialization") for m in (
        P.ChatCompletionResponse, P.ChatCompletionChunk, P.CompletionResponse, P.ModelList, P.ModelCard,
        P.ErrorResponse, P.VersionInfo, P.HealthInfo)]
    _, top = models_json_schema(models, ref_template=_REF)
    schemas = top.get("$defs", {})
    security = [{"bearer": []}] if auth else []

    def post(op, summary, req, resp, chunk):
        return {"post": {
            "operationId": op, "summary": summary, **({"security": security} if auth else {}),
            "requestBody": {"required": True, "content": {"application/json": {"schema": _ref(req)}}},
            "responses": {
                "200": {"description": f"A {resp} object, or (stream=true) server-sent events of {chunk} "
                        "objects ending with `data: [DONE]`.",
                        "content": {"application/json": {"schema": _ref(resp)},
                                    "text/event-stream": {"schema": {"type": "string"}}},
                        "headers": {"x-g906-ignored-fields": {
                            "description": "Request fields that were accepted but are not implemented.",
                            "schema": {"type": "string"}}}},
                **_errors(400, *((401,) if auth else ()), 408, 413, 503),
            }}}

    def get(op, summary, resp, *, auth=False, media="application/json", errors=()):
        content = {media: {"schema": _ref(resp) if resp else {"type": "string"}}}
        op_ = {"operationId": op, "summary": summary,
               "responses": {"200": {"description": summary, "content": content}, **_errors(*errors)}}
        if auth and security:
            op_["security"] = security
        return {"get": op_}

    def anthropic(op, summary, req, answer):
        # Anthropic's shapes are written by anthropic_answers.py, not by pydantic models
        err = {"description": "Anthropic's error shape: {\"type\": \"error\", \"error\": {\"type\", \"message\"}}",
               "content": {"application/json": {"schema": {"type": "object"}}}}
        return {"post": {
            "operationId": op, "summary": summary, **({"security": security} if auth else {}),
            "requestBody": {"required": True, "content": {"application/json": {"schema": _ref(req)}}},
            "responses": {"200": {"description": answer,
                                  "content": {"application/json": {"schema": {"type": "object"}},
                                              "text/event-stream": {"schema": {"type": "string"}}}},
                          **{str(st): err for st in (400, *((401,) if auth else ()), 408, 413, 503)}}}}

    def responses_op(method, op, summary, answer, *, body=None, query=()):
        # the response object and its events are written by responses_answers.py (OpenAI's shapes)
        obj = {"description": answer, "content": {"application/json": {"schema": {"type": "object"}},
                                                  **({"text/event-stream": {"schema": {"type": "string"}}}
                                                     if body else {})}}
        params = [{"name": "response_id", "in": "path", "required": True, "schema": {"type": "string"}}
                  ] if body is None else []
        params += [{"name": q, "in": "query", "required": False, "schema": {"type": "string"}} for q in query]
        o = {"operationId": op, "summary": summary, **({"security": security} if auth else {}),
             **({"parameters": params} if params else {}),
             "responses": {"200": obj, **_errors(400, *((401,) if auth else ())),
                           "404": {"description": "No stored response with this id",
                                   "content": {"application/json": {"schema": _ref("ErrorResponse")}}},
                           **(_errors(408, 413, 503) if body else {})}}
        if body:
            o["requestBody"] = {"required": True, "content": {"application/json": {"schema": _ref(body)}}}
        return {method: o}

    paths = {
        "/v1/chat/completions": post("createChatCompletion", "Chat completion", "ChatCompletionRequest",
                                     "ChatCompletionResponse", "ChatCompletionChunk"),
        "/v1/completions": post("createCompletion", "Text completion", "CompletionRequest",
                                "CompletionResponse", "CompletionResponse"),
        "/v1/models": get("listModels", "The served model", "ModelList", auth=True,
                          errors=(401,) if auth else ()),
        "/v1/models/{model_id}": {"get": {
            "operationId": "retrieveModel", "summary": "One model", **({"security": security} if auth else {}),
            "parameters": [{"name": "model_id", "in": "path", "required": True, "schema": {"type": "string"}}],
            "responses": {"200": {"description": "The model", "content": {"application/json": {"schema": _ref("ModelCard")}}},
                          "404": {"description": "No such model",
                                  "content": {"application/json": {"schema": _ref("ErrorResponse")}}},
                          **_errors(*((401,) if auth else ()))}}},
        "/health": get("health", "200 when the model is loaded and warmed up, 503 before", "HealthInfo", errors=(503,)),
        "/metrics": get("metrics", "Prometheus metrics", None, media="text/plain"),
        "/version": get("version", "Server version", "VersionInfo"),
        "/ping": get("ping", "The same answer as /health", "HealthInfo", errors=(503,)),
        "/v1/chat/completions/batch": post("createChatCompletionBatch", "vLLM's batch of conversations: "
                                           "messages is a list of conversations; one chat.completion, not streamed",
                                           "ChatCompletionRequest", "ChatCompletionResponse", "ChatCompletionChunk"),
        "/load": get("serverLoad", "vLLM's server load: {\"server_load\": requests in flight}", None, auth=True,
                     errors=(401,)),
        "/tokenizer_info": get("tokenizerInfo", "vLLM's tokenizer information", None, auth=True, errors=(401, 503)),
        "/invocations": post("invocations", "SageMaker entry point: a chat completion (messages) or a text "
                             "completion (prompt)", "ChatCompletionRequest", "ChatCompletionResponse",
                             "ChatCompletionChunk"),
        **tokenize_routes.openapi_paths(_ref, _errors),
        **decisions.openapi_paths(_ref, _errors),
        "/v1/messages": anthropic("createMessage", "Anthropic Messages API: a message", "MessagesRequest",
                                  "A message object, or (stream=true) Anthropic's server-sent events "
                                  "(message_start ... message_stop)."),
        "/v1/messages/count_tokens": anthropic("countMessageTokens", "Anthropic Messages API: the prompt's tokens",
                                               "CountTokensRequest", "{\"input_tokens\": N}"),
        "/v1/responses": responses_op(
            "post", "createResponse", "OpenAI Responses API: a response",
            "A response object; (stream=true) its server-sent events, response.created ... response.completed "
            "(or response.incomplete); (background=true) the response, queued.", body="ResponsesRequest"),
        "/v1/responses/{response_id}": {
            **responses_op("get", "getResponse", "A stored response",
                           "The response object; (stream=true) a background stream's events after "
                           "starting_after, as server-sent events.", query=("stream", "starting_after")),
            **responses_op("delete", "deleteResponse", "Delete a stored response",
                           "{\"id\", \"object\": \"response\", \"deleted\": true}")},
        "/v1/responses/{response_id}/cancel": responses_op(
            "post", "cancelResponse", "Cancel a background response", "The response object (status cancelled)."),
        "/v1/responses/{response_id}/input_items": responses_op(
            "get", "listInputItems", "A stored response's input items",
            "{\"object\": \"list\", \"data\": [items], \"first_id\", \"last_id\", \"has_more\"}",
            query=("order", "limit", "after")),
    }
    if not auth:  # routes described elsewhere (tokenize_routes) state their auth unconditionally
        for ops in paths.values():
            for op in ops.values():
                op.pop("security", None)
                op.get("responses", {}).pop("401", None)
    return {
        "openapi": "3.1.0",
        "info": {"title": "g906 OpenAI-compatible API", "version": __version__},
        "paths": paths,
        "components": {"schemas": schemas,
                       **({"securitySchemes": {"bearer": {"type": "http", "scheme": "bearer"}}} if auth else {})},
    }
