"""POST /v1/chat/completions: the messages rendered by the model's chat template (images become
its placeholders), one generation request, and the answer in full or streamed."""

from __future__ import annotations

from starlette.requests import Request
from starlette.responses import Response

from g906.errors import G906Error
from g906.server import protocol as P
from g906.server.assembler import ResponseAssembler
from g906.server.errors import bad_request
from g906.server.generation import GenerationRequest, Prompt, openai_sampling_params, start
from g906.server.intake import parse_request
from g906.server.openai_answers import chat_full, chat_stream, send_answer
from g906.server.parsers import REASONING, make_parser
from g906.server.state import ServerState, state_of
from g906.server import vllm_extras as X


async def chat_completions(request: Request) -> Response:
    st = state_of(request)
    req, ignored = await parse_request(request, st, P.ChatCompletionRequest)
    assert isinstance(req, P.ChatCompletionRequest)
    X.check_stream_fields(req)
    greq = await generation_request(st, req)
    asm = ResponseAssembler(greq, reasoning_parser=st.reasoning_parser, architecture=st.architecture)
    streams = start(st, greq)
    eng = st.engine.engine
    if req.stream:
        return await send_answer(request, asm, streams, ignored,
                                 events=chat_stream(asm, streams, eng, X.stream_options(req)))
    return await send_answer(request, asm, streams, ignored,
                             full=chat_full(asm, streams, eng, logprobs=req.logprobs))


async def generation_request(st: ServerState, req: P.ChatCompletionRequest) -> GenerationRequest:
    if req.response_format is not None and req.response_format.type != "text":
        raise bad_request(f"response_format {req.response_format.type!r} is not supported (only \"text\")",
                          param="response_format")
    images: list[str] = []
    try:
        prompt_text = st.prompts.render_chat(
            template_messages(req, images), add_generation_prompt=req.add_generation_prompt, tools=req.tools,
            **(req.chat_template_kwargs or {}),
        )
        ids = st.prompts.encode(prompt_text)
    except G906Error as exc:
        raise bad_request(exc.message, param="messages") from None
    except TypeError as exc:
        raise bad_request(f"chat_template_kwargs: {exc}", param="chat_template_kwargs") from None
    if not ids:
        raise bad_request("the rendered prompt is empty", param="messages")
    ids = X.truncate_prompt(ids, req, st.max_model_len)
    mm = None
    if images:  # fetched, checked against the limits, resized; placeholders expanded (400 on failure)
        from g906.engine.vision.glue import prepare_chat_images

        try:
            ids, mm = await prepare_chat_images(getattr(st.engine.engine, "vision", None), ids, images)
        except G906Error as exc:
            raise bad_request(exc.message, param="messages", code="invalid_image") from None
    logprobs = (req.top_logprobs or 0) if req.logprobs else None
    params = openai_sampling_params(req, max_tokens=req.max_completion_tokens or req.max_tokens,
                                    prompt_len=len(ids), max_model_len=st.max_model_len, logprobs=logprobs,
                                    prompt_param="messages", default_max_tokens=st.default_max_tokens,
                                    logit_bias=X.logit_bias(req, st.engine.engine.model_config.vocab_size),
                                    extra=X.thinking_budget(req, make_parser(REASONING, st.reasoning_parser, prompt_text,
                                                                             st.architecture), st.prompts.encode)
                                    | X.engine_prompt_logprobs(req)
                                    | X.logprob_token_ids(req, st.engine.engine.model_config.vocab_size))
    return GenerationRequest(request_id=P.new_id("chatcmpl"), model=st.served_model_name,
                             prompts=[Prompt(ids=ids, text=prompt_text, mm=mm)], params=[params], n=req.n,
                             options=X.answer_options(req))


def template_messages(req: P.ChatCompletionRequest, images: list[str] | None = None) -> list[dict]:
    """The messages as template input; image parts (collected into `images`, when given) become
    the model's image placeholder in the text (g906/engine/vision/glue.py)."""
    from g906.engine.vision.glue import IMAGE_PART_TYPES, image_part_url, placeholder_text

    out = []
    for i, m in enumerate(req.messages):
        d = m.model_dump(exclude_none=True, exclude=set(m.model_extra or {}))
        if isinstance(m.content, list):
            texts = []
            for j, part in enumerate(m.content):
                if images is not None and not isinstance(part, P.TextPart) and part.type in IMAGE_PART_TYPES:
                    try:
                        images.append(image_part_url(part.model_dump(), f"messages[{i}].content[{j}]"))
                    except G906Error as exc:
                        raise bad_request(exc.message, param=f"messages.{i}.content.{j}") from None
                    texts.append(placeholder_text())
                    continue
                if not isinstance(part, P.TextPart):
                    raise bad_request(f"messages[{i}].content: content parts of type {part.type!r} are not supported "
                                      "by this server (text and image_url only)", param=f"messages.{i}.content")
                texts.append(part.text)
            d["content"] = "".join(texts)
        out.append(d)
    return out
