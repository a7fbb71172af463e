"""POST /v1/chat/completions/batch (vLLM's): a chat completion request whose `messages` is a
list of conversations; one answer, chat.completion-shaped, with the choices of conversation k at
indices k*n .. k*n+n-1 and the usage of all of them. Every conversation is rendered and checked
before any starts (admitted whole or not at all); not streamed, as in vLLM."""

from __future__ import annotations

from pydantic import Field
from starlette.requests import Request
from starlette.responses import Response

from g906.server import kv_transfer
from g906.server import protocol as P
from g906.server import vllm_extras as X
from g906.server.assembler import ResponseAssembler
from g906.server.chat_completions import generation_request
from g906.server.errors import bad_request
from g906.server.generation import GenerationRequest, start
from g906.server.intake import parse_request, report_ignored
from g906.server.openai_answers import chat_full, send_answer
from g906.server.state import state_of

MAX_CONVERSATIONS = 256


class BatchChatCompletionRequest(P.ChatCompletionRequest):
    messages: list[list[P.ChatMessage]] = Field(min_length=1, max_length=MAX_CONVERSATIONS,  # type: ignore[assignment]
                                                description="The conversations, each a list of messages.")


async def chat_completions_batch(request: Request) -> Response:
    st = state_of(request)
    req, ignored = await parse_request(request, st, BatchChatCompletionRequest)
    assert isinstance(req, BatchChatCompletionRequest)
    if req.stream:
        raise bad_request("the batch endpoint does not stream: send stream=false", param="stream")
    X.check_stream_fields(req)
    kv = req.kv_transfer_params
    if isinstance(kv, dict) and kv.get("prompt_token_ids") is not None:
        raise bad_request("kv_transfer_params.prompt_token_ids is one prompt: a batch of conversations cannot take "
                          "it (as in vLLM)", param=kv_transfer.PARAM)
    ignored = ignored + report_ignored(st, kv_transfer.ignored_keys(kv))
    parts: list[GenerationRequest] = []
    for k, conv in enumerate(req.messages):
        if not conv:
            raise bad_request(f"messages[{k}] is an empty conversation", param=f"messages.{k}")
        one = req.model_copy(update={"messages": conv})
        parts.append(await generation_request(st, one))
    first = parts[0]
    greq = GenerationRequest(request_id=P.new_id("chatcmpl"), model=first.model,
                             prompts=[p for g in parts for p in g.prompts], params=[p for g in parts for p in g.params],
                             n=req.n, options=first.options)
    asm = ResponseAssembler(greq, reasoning_parser=st.reasoning_parser, architecture=st.architecture)
    streams = start(st, greq)
    return await send_answer(request, asm, streams, ignored,
                             full=chat_full(asm, streams, st.engine.engine, logprobs=req.logprobs))
