"""POST /tokenize and /detokenize, in vLLM's shapes, with the served model's own tokenizer and
chat template (so that clients count and truncate prompts exactly as the server will).

    /tokenize    {"prompt": TEXT, "add_special_tokens": true, "return_token_strs": false}
                 {"messages": [...], "add_generation_prompt": true, "chat_template_kwargs": {...}}
              -> {"count": N, "max_model_len": L, "tokens": [...], "token_strs": [...] | null}
    /detokenize  {"tokens": [...]}  ->  {"prompt": TEXT}

Both go through the same intake as generation requests (API key, readiness, body limit, strict
JSON types, the model name)."""

from __future__ import annotations

from typing import Any

from pydantic import Field, model_validator
from starlette.requests import Request
from starlette.responses import JSONResponse, Response
from starlette.routing import Route

from g906.errors import G906Error
from g906.server import protocol as P
from g906.server.errors import bad_request
from g906.server.intake import ignored_fields_header, parse_request
from g906.server.state import state_of

MAX_DETOKENIZE_TOKENS = 1 << 20


class TokenizeRequest(P._Req):
    """vLLM's two tokenize requests in one model: `prompt` (text) or `messages` (chat)."""
    model: str | None = Field(None, description="The served model name (optional: there is one).")
    prompt: str | None = Field(None, description="Text to tokenize (or give messages).")
    messages: list[P.ChatMessage] | None = Field(None, min_length=1,
                                                 description="Chat messages, rendered by the chat template.")
    add_special_tokens: bool | None = Field(None, description="Add the tokenizer's BOS/EOS tokens where it has "
                                            "them (default: true for prompt, false for messages).")
    return_token_strs: bool = Field(False, description="Also return each token as the tokenizer's string.")
    add_generation_prompt: bool = Field(True, description="messages: end with the assistant turn's opening.")
    continue_final_message: bool = Field(False, description="messages: end inside the last message, to continue it.")
    chat_template_kwargs: dict[str, Any] | None = None
    tools: list[dict[str, Any]] | None = None

    @model_validator(mode="after")
    def _one_input(self):
        if (self.prompt is None) == (self.messages is None):
            raise ValueError("give either prompt (text) or messages (chat), not both and not neither")
        return self


class TokenizeResponse(P._Resp):
    count: int
    max_model_len: int | None
    tokens: list[int]
    token_strs: list[str] | None = None


class DetokenizeRequest(P._Req):
    model: str | None = Field(None, description="The served model name (optional: there is one).")
    tokens: list[int] = Field(max_length=MAX_DETOKENIZE_TOKENS)


class DetokenizeResponse(P._Resp):
    prompt: str


async def tokenize(request: Request) -> Response:
    st = state_of(request)
    req, ignored = await parse_request(request, st, TokenizeRequest)
    assert isinstance(req, TokenizeRequest)
    tok = st.prompts.tokenizer
    if req.messages is not None:
        if req.continue_final_message and req.add_generation_prompt:
            raise bad_request("continue_final_message and add_generation_prompt cannot both be true",
                              param="continue_final_message")
        from g906.server.chat_completions import template_messages

        try:
            text = st.prompts.render_chat(template_messages(req), add_generation_prompt=req.add_generation_prompt,
                                          tools=req.tools, **(req.chat_template_kwargs or {}))
        except G906Error as exc:
            raise bad_request(exc.message, param="messages") from None
        except TypeError as exc:
            raise bad_request(f"chat_template_kwargs: {exc}", param="chat_template_kwargs") from None
        if req.continue_final_message:
            text = _cut_after_final_message(text, req.messages[-1])
    else:
        text = req.prompt or ""
    special = req.add_special_tokens if req.add_special_tokens is not None else req.messages is None
    ids = tok.encode(text, add_special_tokens=special)
    strs = [tok.id_to_token(i) or "" for i in ids] if req.return_token_strs else None
    body = TokenizeResponse(count=len(ids), max_model_len=st.max_model_len, tokens=ids, token_strs=strs)
    return JSONResponse(body.model_dump(mode="json"), headers=ignored_fields_header(ignored))


def _cut_after_final_message(text: str, last: P.ChatMessage) -> str:
    """continue_final_message: the prompt ends where the last message's text ends (the template's
    end-of-turn after it is cut), so that generation continues that message."""
    content = last.content if isinstance(last.content, str) else "".join(
        getattr(p, "text", "") for p in (last.content or []))
    at = text.rfind(content) if content else -1
    if at < 0:
        raise bad_request("continue_final_message: the last message's text is not in the rendered prompt",
                          param="continue_final_message")
    return text[:at + len(content)]


async def detokenize(request: Request) -> Response:
    st = state_of(request)
    req, ignored = await parse_request(request, st, DetokenizeRequest)
    assert isinstance(req, DetokenizeRequest)
    tok = st.prompts.tokenizer
    vocab = tok.vocab_size
    for i, t in enumerate(req.tokens):
        if not 0 <= t < vocab:
            raise bad_request(f"tokens[{i}] = {t} is not a token id of this model (0 to {vocab - 1})",
                              param="tokens")
    text = tok.decode(req.tokens, skip_special_tokens=False)
    return JSONResponse(DetokenizeResponse(prompt=text).model_dump(mode="json"),
                        headers=ignored_fields_header(ignored))


ROUTES = [
    Route("/tokenize", tokenize, methods=["POST"]),
    Route("/detokenize", detokenize, methods=["POST"]),
]

OPENAPI_MODELS = [(TokenizeRequest, "validation"), (DetokenizeRequest, "validation"), (TokenizeResponse, "serialization"),
                  (DetokenizeResponse, "serialization")]


def openapi_paths(ref, errors) -> dict:
    """The two routes' OpenAPI operations (ref: schema name -> $ref; errors: the shared error responses)."""
    def op(op_id, summary, req, resp):
        return {"post": {"operationId": op_id, "summary": summary, "security": [{"bearer": []}],
                         "requestBody": {"required": True, "content": {"application/json": {"schema": req}}},
                         "responses": {"200": {"description": summary,
                                               "content": {"application/json": {"schema": ref(resp)}}},
                                       **errors(400, 401, 413, 503)}}}

    return {
        "/tokenize": op("tokenize", "Token ids of a prompt or of chat messages (rendered by the chat template)",
                        ref("TokenizeRequest"),
                        "TokenizeResponse"),
        "/detokenize": op("detokenize", "Text of token ids", ref("DetokenizeRequest"), "DetokenizeResponse"),
    }
