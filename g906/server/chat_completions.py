"""POST /v1/chat/completions: the messages rendered by the model's chat template (images become
its placeholders), one generation request, and the answer in full or streamed."""

from __future__ import annotations

from starlette.requests import Request
from starlette.responses import Response

from g906.errors import G906Error
from g906.server import protocol as P
from g906.server.assembler import ResponseAssembler
from g906.server.cpu_work import check_prompt_bytes, offload
from g906.server.errors import bad_request
from g906.server.generation import GenerationRequest, Prompt, openai_sampling_params, start
from g906.server.intake import parse_request
from g906.server.openai_answers import chat_full, chat_stream, send_answer
from g906.server.state import ServerState, state_of


async def chat_completions(request: Request) -> Response:
    st = state_of(request)
    req, ignored = await parse_request(request, st, P.ChatCompletionRequest)
    assert isinstance(req, P.ChatCompletionRequest)
    greq = await generation_request(st, req)
    asm = ResponseAssembler(greq, reasoning_parser=st.reasoning_parser, architecture=st.architecture)
    streams = start(st, greq)
    eng = st.engine.engine
    if req.stream:
        opts = req.stream_options or P.StreamOptions()
        return await send_answer(request, asm, streams, ignored, events=chat_stream(asm, streams, eng, opts))
    return await send_answer(request, asm, streams, ignored,
                             full=chat_full(asm, streams, eng, logprobs=req.logprobs))


async def generation_request(st: ServerState, req: P.ChatCompletionRequest) -> GenerationRequest:
    if req.response_format is not None and req.response_format.type != "text":
        raise bad_request(f"response_format {req.response_format.type!r} is not supported (only \"text\")",
                          param="response_format")
    images: list[str] = []
    messages = template_messages(req, images)
    check_prompt_bytes(st, _text_bytes(messages), param="messages")
    try:
        prompt_text = await offload(
            st.prompts.render_chat, messages, add_generation_prompt=req.add_generation_prompt, tools=req.tools,
            **(req.chat_template_kwargs or {}),
        )
        check_prompt_bytes(st, len(prompt_text.encode("utf-8", "surrogatepass")), param="messages")
        ids = await offload(st.prompts.encode, prompt_text)
    except G906Error as exc:
        raise bad_request(exc.message, param="messages") from None
    except TypeError as exc:
        raise bad_request(f"chat_template_kwargs: {exc}", param="chat_template_kwargs") from None
    if not ids:
        raise bad_request("the rendered prompt is empty", param="messages")
    mm = None
    if images:  # fetched, checked against the limits, resized; placeholders expanded (400 on failure)
        from g906.engine.vision.glue import prepare_chat_images

        try:
            ids, mm = await prepare_chat_images(getattr(st.engine.engine, "vision", None), ids, images, run=offload)
        except G906Error as exc:
            raise bad_request(exc.message, param="messages", code="invalid_image") from None
    logprobs = (req.top_logprobs or 0) if req.logprobs else None
    params = openai_sampling_params(req, max_tokens=req.max_completion_tokens or req.max_tokens,
                                    prompt_len=len(ids), max_model_len=st.max_model_len, logprobs=logprobs,
                                    prompt_param="messages")
    return GenerationRequest(request_id=P.new_id("chatcmpl"), model=st.served_model_name,
                             prompts=[Prompt(ids=ids, text=prompt_text, mm=mm)], params=[params], n=req.n)


def _text_bytes(messages: list[dict]) -> int:
    """The UTF-8 size of the messages' text contents (what the template will at least hold)."""
    return sum(len(m["content"].encode("utf-8", "surrogatepass")) for m in messages
               if isinstance(m.get("content"), str))


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
