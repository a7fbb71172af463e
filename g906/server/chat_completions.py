"""POST /v1/chat/completions: the messages rendered by the model's chat template (images become
its placeholders), one generation request, and the answer in full or streamed."""

from __future__ import annotations

import json

from starlette.requests import Request
from starlette.responses import Response

from g906.errors import G906Error
from g906.server import protocol as P
from g906.server.assembler import ResponseAssembler
from g906.server.cpu_work import check_prompt_bytes, offload
from g906.server.errors import bad_request
from g906.server.generation import GenerationRequest, Prompt, openai_sampling_params, start
from g906.server.intake import parse_request, report_ignored
from g906.server.openai_answers import chat_full, chat_stream, send_answer
from g906.server.parsers import REASONING, make_parser
from g906.server.state import ServerState, state_of
from g906.server.structured import chat_constraint, openai_constraint
from g906.server.tools import openai_tool_choice, openai_tools
from g906.server import kv_transfer
from g906.server import vllm_extras as X


async def chat_completions(request: Request) -> Response:
    st = state_of(request)
    req, ignored = await parse_request(request, st, P.ChatCompletionRequest)
    assert isinstance(req, P.ChatCompletionRequest)
    ignored = ignored + report_ignored(st, kv_transfer.ignored_keys(req.kv_transfer_params))
    X.check_stream_fields(req)
    greq = await generation_request(st, req)
    asm = ResponseAssembler(greq, reasoning_parser=st.reasoning_parser, tool_parser=st.tool_parser,
                            architecture=st.architecture)
    streams = start(st, greq)
    eng = st.engine.engine
    if req.stream:
        return await send_answer(request, asm, streams, ignored,
                                 events=chat_stream(asm, streams, eng, X.stream_options(req, st.force_include_usage)))
    return await send_answer(request, asm, streams, ignored,
                             full=chat_full(asm, streams, eng, logprobs=req.logprobs))


async def generation_request(st: ServerState, req: P.ChatCompletionRequest, *,
                             id_prefix: str = "chatcmpl", fit_max_tokens: bool = False) -> GenerationRequest:
    """The internal request of a chat request (other dialects translate theirs into one first).
    fit_max_tokens: a max_tokens beyond the context's room is cut to it instead of a 400 (Anthropic
    clients send their own model's large limit, whatever the served context)."""
    tools = openai_tools(req.tools)
    tool_choice = openai_tool_choice(req.tool_choice, tools)
    parallel = req.parallel_tool_calls is not False
    constraint, source = openai_constraint(req)
    prompt_text, ids, mm = await chat_prompt(st, req)
    logprobs = (req.top_logprobs or 0) if req.logprobs else None
    constraint = chat_constraint(st, constraint, source, tools=tools, tool_choice=tool_choice, parallel=parallel,
                                 prompt_text=prompt_text)
    if req.use_beam_search and constraint is not None:
        X.check_beam_search(req, source or "tool_choice")
    max_tokens = req.max_completion_tokens or req.max_tokens
    if fit_max_tokens and max_tokens is not None and len(ids) < st.max_model_len:
        max_tokens = min(max_tokens, st.max_model_len - len(ids))
    params = openai_sampling_params(req, max_tokens=max_tokens,
                                    prompt_len=len(ids), max_model_len=st.max_model_len, logprobs=logprobs,
                                    prompt_param="messages", structured=constraint,
                                    default_max_tokens=st.default_max_tokens,
                                    logit_bias=X.logit_bias(req, st.engine.engine.model_config.vocab_size),
                                    extra=X.thinking_tags(req, make_parser(REASONING, st.reasoning_parser, prompt_text,
                                                                           st.architecture), st.prompts.encode,
                                                          constraint)
                                    | X.engine_prompt_logprobs(req)
                                    | X.logprob_token_ids(req, st.engine.engine.model_config.vocab_size))
    return GenerationRequest(request_id=P.new_id(id_prefix), model=st.served_model_name,
                             prompts=[Prompt(ids=ids, text=prompt_text, mm=mm)], params=[params], n=req.n,
                             tools=tools, tool_choice=tool_choice,
                             parallel_tool_calls=parallel,
                             options=X.answer_options(req, per_request_metrics=st.per_request_metrics))


async def chat_prompt(st: ServerState, req: P.ChatCompletionRequest) -> tuple[str, list[int], object]:
    """(the rendered prompt, its token ids with image placeholders expanded, its prepared images);
    the prompt token ids forwarded in kv_transfer_params, when sent, instead (kv_transfer.py)."""
    images: list[str] = []
    messages = template_messages(req, images)
    reused = kv_transfer.reused_prompt_ids(req.kv_transfer_params, st, rendered_anyway=bool(images))
    if reused is not None:
        # the parsers read the prompt's text (is the thinking left open?): the ids decoded
        text = await offload(st.engine.engine.tokenizer.decode, reused, skip_special_tokens=False)
        return text, reused, None
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
    ids = X.truncate_prompt(ids, req, st.max_model_len)
    mm = None
    if images:  # fetched, checked against the limits, resized; placeholders expanded (400 on failure)
        from g906.engine.vision.glue import prepare_chat_images

        try:
            ids, mm = await prepare_chat_images(getattr(st.engine.engine, "vision", None), ids, images, run=offload)
        except G906Error as exc:
            raise bad_request(exc.message, param="messages", code="invalid_image") from None
    return prompt_text, ids, mm


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
        if m.tool_calls is not None:
            d["tool_calls"] = template_tool_calls(m.tool_calls, f"messages.{i}.tool_calls")
        out.append(d)
    return out


def template_tool_calls(calls: list[dict], param: str) -> list[dict]:
    """An assistant turn's tool calls as the template takes them: `function.arguments` as an object.

    Clients send arguments back as the JSON string the server gave them (OpenAI's shape), while
    chat templates iterate them as a mapping (Qwen3.5: `arguments|items`); a string is parsed here,
    as vLLM does, and anything that is not a JSON object is refused, naming the call."""
    out = []
    for j, call in enumerate(calls):
        where = f"{param}.{j}"
        fn = call.get("function")
        if not isinstance(fn, dict) or not isinstance(fn.get("name"), str) or not fn["name"]:
            raise bad_request(f"{where}: a tool call needs function.name (a non-empty string)", param=where)
        args = fn.get("arguments", {})
        if args is None:
            args = {}
        if isinstance(args, str):
            try:
                args = json.loads(args) if args.strip() else {}
            except json.JSONDecodeError as exc:
                raise bad_request(f"{where}.function.arguments is not valid JSON: {exc}",
                                  param=f"{where}.function.arguments") from None
        if not isinstance(args, dict):
            raise bad_request(f"{where}.function.arguments must be a JSON object (or its JSON text), "
                              f"not {type(args).__name__}", param=f"{where}.function.arguments")
        out.append({**call, "function": {**fn, "arguments": args}})
    return out
