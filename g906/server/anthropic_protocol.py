"""Anthropic's Messages API requests, and their translation into the chat request the OpenAI
route builds its internal GenerationRequest from (chat_completions.generation_request): the
Anthropic dialect is only this translation and its answer shapes (anthropic_answers.py); the
prompt, the tools, the constraints and the sampling are the chat route's own.

Every block is checked here, so that a 400 names the Anthropic field (messages.2.content.1)
rather than the translated one."""

from __future__ import annotations

from typing import Any

from pydantic import Field, ValidationError

from g906.server import protocol as P
from g906.server.errors import bad_request, pydantic_message

MAX_STOP_SEQUENCES = P.MAX_STOP


class CountTokensRequest(P._Req):
    model: str | None = None
    messages: list[dict[str, Any]] = Field(min_length=1)
    system: str | list[dict[str, Any]] | None = None
    tools: list[dict[str, Any]] | None = None
    tool_choice: dict[str, Any] | None = None
    thinking: dict[str, Any] | None = None


class MessagesRequest(CountTokensRequest):
    max_tokens: int = Field(ge=1, description="Required: the most tokens to generate.")
    stop_sequences: list[str] | None = Field(None, max_length=MAX_STOP_SEQUENCES)
    temperature: float | None = Field(None, ge=0.0, le=2.0)
    top_p: float | None = Field(None, gt=0.0, le=1.0)
    top_k: int | None = Field(None, ge=0)
    stream: bool = False
    metadata: dict[str, Any] | None = Field(None, description="Accepted (user_id); not used.")


def _text_blocks(blocks: Any, where: str) -> str:
    """The system prompt's text blocks as one text."""
    if isinstance(blocks, str):
        return blocks
    if not isinstance(blocks, list):
        raise bad_request(f"{where} must be a string or a list of text blocks", param=where)
    out = []
    for j, b in enumerate(blocks):
        if not isinstance(b, dict) or b.get("type") != "text" or not isinstance(b.get("text"), str):
            kind = b.get("type") if isinstance(b, dict) else type(b).__name__
            raise bad_request(f"{where}.{j}: only text blocks ({{\"type\": \"text\", \"text\": ...}}) are supported "
                              f"here, not {kind!r}", param=f"{where}.{j}")
        out.append(b["text"])
    return "\n".join(out)


def _image_part(b: dict, where: str) -> dict:
    src = b.get("source")
    if not isinstance(src, dict):
        raise bad_request(f"{where}.source is missing (base64 or url)", param=f"{where}.source")
    if src.get("type") == "base64":
        media, data = src.get("media_type"), src.get("data")
        if not isinstance(media, str) or not isinstance(data, str):
            raise bad_request(f"{where}.source: a base64 image needs media_type and data (strings)",
                              param=f"{where}.source")
        url = f"data:{media};base64,{data}"
    elif src.get("type") == "url" and isinstance(src.get("url"), str):
        url = src["url"]
    else:
        raise bad_request(f"{where}.source.type must be \"base64\" or \"url\" (with its url), "
                          f"not {src.get('type')!r}", param=f"{where}.source.type")
    return {"type": "image_url", "image_url": {"url": url}}


def _tool_result(content: Any, is_error: bool, where: str) -> str | list[dict]:
    """A tool result's content (a string, or text and image blocks) as a tool message's content;
    an error is marked in the text, the template having no error flag."""
    mark = "Error: " if is_error else ""
    if isinstance(content, str):
        return mark + content
    if not isinstance(content, list):
        raise bad_request(f"{where} must be a string or a list of text and image blocks", param=where)
    parts: list[dict] = [{"type": "text", "text": mark}] if mark else []
    for j, b in enumerate(content):
        kind = b.get("type") if isinstance(b, dict) else None
        if kind == "text" and isinstance(b.get("text"), str):
            parts.append({"type": "text", "text": b["text"]})
        elif kind == "image":
            parts.append(_image_part(b, f"{where}.{j}"))
        else:
            raise bad_request(f"{where}.{j}: a tool result's blocks are text or image, not "
                              f"{kind if kind is not None else type(b).__name__!r}", param=f"{where}.{j}")
    if all(p["type"] == "text" for p in parts):
        return "".join(p["text"] for p in parts)
    return parts


def _user_turn(content: list, where: str) -> list[dict]:
    """A user turn's blocks: its tool results as tool messages (first, as the template expects
    them after the assistant's calls), then its text and images as one user message."""
    tools_out: list[dict] = []
    parts: list[dict] = []
    for j, b in enumerate(content):
        w = f"{where}.{j}"
        kind = b.get("type") if isinstance(b, dict) else None
        if kind == "text" and isinstance(b.get("text"), str):
            parts.append({"type": "text", "text": b["text"]})
        elif kind == "image":
            parts.append(_image_part(b, w))
        elif kind == "tool_result":
            if not isinstance(b.get("tool_use_id"), str):
                raise bad_request(f"{w}.tool_use_id is missing (the id of the tool_use it answers)",
                                  param=f"{w}.tool_use_id")
            tools_out.append({"role": "tool", "tool_call_id": b["tool_use_id"],
                              "content": _tool_result(b.get("content", ""), b.get("is_error") is True, f"{w}.content")})
        else:
            raise bad_request(f"{w}: a user turn's blocks are text, image or tool_result, not "
                              f"{kind if kind is not None else type(b).__name__!r}", param=f"{w}.type")
    out = list(tools_out)
    if parts:
        out.append({"role": "user", "content": parts})
    return out


def _assistant_turn(content: list, where: str) -> dict:
    texts: list[str] = []
    reasoning: list[str] = []
    calls: list[dict] = []
    for j, b in enumerate(content):
        w = f"{where}.{j}"
        kind = b.get("type") if isinstance(b, dict) else None
        if kind == "text" and isinstance(b.get("text"), str):
            texts.append(b["text"])
        elif kind == "thinking" and isinstance(b.get("thinking"), str):
            reasoning.append(b["thinking"])
        elif kind == "redacted_thinking":
            continue    # opaque to any model but the one that wrote it
        elif kind == "tool_use":
            name, args = b.get("name"), b.get("input", {})
            if not isinstance(b.get("id"), str) or not isinstance(name, str) or not isinstance(args, dict):
                raise bad_request(f"{w}: a tool_use block needs id, name (strings) and input (an object)", param=w)
            calls.append({"id": b["id"], "type": "function", "function": {"name": name, "arguments": args}})
        else:
            raise bad_request(f"{w}: an assistant turn's blocks are text, thinking, redacted_thinking or tool_use, "
                              f"not {kind if kind is not None else type(b).__name__!r}", param=f"{w}.type")
    msg: dict = {"role": "assistant", "content": "".join(texts)}
    if reasoning:
        msg["reasoning_content"] = "\n".join(reasoning)
    if calls:
        msg["tool_calls"] = calls
    return msg


def chat_messages(req: CountTokensRequest) -> list[dict]:
    """The conversation as OpenAI chat messages."""
    out: list[dict] = []
    if req.system is not None:
        system = _text_blocks(req.system, "system")
        if system:
            out.append({"role": "system", "content": system})
    for i, m in enumerate(req.messages):
        where = f"messages.{i}"
        role, content = m.get("role"), m.get("content")
        if role not in ("user", "assistant"):
            raise bad_request(f"{where}.role must be \"user\" or \"assistant\", not {role!r} "
                              "(the system prompt goes in the top-level system field)", param=f"{where}.role")
        if isinstance(content, str):
            out.append({"role": role, "content": content})
            continue
        if not isinstance(content, list):
            raise bad_request(f"{where}.content must be a string or a list of content blocks", param=f"{where}.content")
        if role == "user":
            out.extend(_user_turn(content, f"{where}.content"))
        else:
            out.append(_assistant_turn(content, f"{where}.content"))
    return out


def chat_tools(raw: list[dict] | None) -> list[dict] | None:
    """Anthropic's tools ({name, description, input_schema}) as OpenAI function tools."""
    if raw is None:
        return None
    out = []
    for i, t in enumerate(raw):
        where = f"tools.{i}"
        if not isinstance(t, dict) or t.get("type", "custom") != "custom" or "name" not in t:
            kind = t.get("type") if isinstance(t, dict) else type(t).__name__
            raise bad_request(f"{where}: only client tools ({{name, description, input_schema}}) are supported, "
                              f"not {kind!r}", param=where)
        fn = {"name": t["name"], "parameters": t.get("input_schema")}
        if t.get("description") is not None:
            fn["description"] = t["description"]
        out.append({"type": "function", "function": fn})
    return out


def chat_tool_choice(raw: dict | None, tools: list[dict] | None) -> tuple[Any, bool | None]:
    """(OpenAI's tool_choice, parallel_tool_calls) of Anthropic's tool_choice."""
    if raw is None:
        return None, None
    kind = raw.get("type")
    parallel = False if raw.get("disable_parallel_tool_use") is True else None
    if kind in ("auto", "none"):
        return kind, parallel
    if kind == "any":
        if not tools:
            raise bad_request("tool_choice {\"type\": \"any\"} needs tools", param="tool_choice")
        return "required", parallel
    if kind == "tool":
        name = raw.get("name")
        known = [t["function"]["name"] for t in tools or []]
        if not isinstance(name, str) or name not in known:
            raise bad_request(f"tool_choice names the tool {name!r}, which is not among the request's tools "
                              f"({', '.join(map(str, known)) or 'none'})", param="tool_choice.name")
        return {"type": "function", "function": {"name": name}}, parallel
    raise bad_request(f"tool_choice.type must be \"auto\", \"any\", \"tool\" or \"none\", not {kind!r}",
                      param="tool_choice.type")


def thinking_switch(raw: dict | None) -> dict:
    """The chat template's thinking switch of Anthropic's `thinking` (absent: the template's default)."""
    if raw is None:
        return {}
    kind = raw.get("type")
    if kind == "enabled":
        budget = raw.get("budget_tokens")
        if budget is not None and (not isinstance(budget, int) or isinstance(budget, bool) or budget < 1):
            raise bad_request("thinking.budget_tokens must be a positive integer", param="thinking.budget_tokens")
        return {"enable_thinking": True}
    if kind == "disabled":
        return {"enable_thinking": False}
    raise bad_request(f"thinking.type must be \"enabled\" or \"disabled\", not {kind!r}", param="thinking.type")


def thinking_budget(req: CountTokensRequest) -> int | None:
    """thinking.budget_tokens of an enabled thinking (checked by thinking_switch)."""
    t = req.thinking
    if isinstance(t, dict) and t.get("type") == "enabled" and isinstance(t.get("budget_tokens"), int):
        return t["budget_tokens"]
    return None


def ignored(req: CountTokensRequest, *, budget_enforced: bool) -> list[str]:
    """Accepted fields that do not change the answer: a thinking budget when the server has no
    reasoning parser to find the end of the thinking (max_tokens then bounds the whole answer)."""
    names = sorted(P.ignored_fields(req))
    if not budget_enforced and isinstance(req.thinking, dict) and "budget_tokens" in req.thinking:
        names.append("thinking.budget_tokens")
    return names


def to_chat_request(req: CountTokensRequest, *, thinking_budget_on: bool = False) -> P.ChatCompletionRequest:
    """The chat request of an Anthropic one (max_tokens, stop and sampling fields when present);
    thinking_budget_on: thinking.budget_tokens becomes vLLM's thinking_token_budget (the server
    forces the end of the thinking after that many tokens)."""
    tools = chat_tools(req.tools)
    choice, parallel = chat_tool_choice(req.tool_choice, tools)
    body: dict[str, Any] = {"messages": chat_messages(req), "tools": tools, "tool_choice": choice,
                            "parallel_tool_calls": parallel, "chat_template_kwargs": thinking_switch(req.thinking)}
    if isinstance(req, MessagesRequest):
        body.update(max_completion_tokens=req.max_tokens, stop=req.stop_sequences, temperature=req.temperature,
                    top_p=req.top_p, top_k=req.top_k)
        if thinking_budget_on and thinking_budget(req) is not None:
            body["thinking_token_budget"] = thinking_budget(req)
    if not body["messages"]:
        raise bad_request("messages: the conversation has no content", param="messages")
    try:
        return P.ChatCompletionRequest.model_validate(body, strict=False)
    except ValidationError as exc:
        msg, param = pydantic_message(exc)
        raise bad_request(msg, param=param) from None
