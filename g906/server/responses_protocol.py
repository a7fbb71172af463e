"""OpenAI's Responses API requests, and their translation into the chat request the OpenAI chat
route builds its internal GenerationRequest from (chat_completions.generation_request): the
Responses dialect is this translation, its answer shapes (responses_answers.py) and its store
(responses_store.py); the prompt, the tools, the constraints and the sampling are the chat
route's own.

Every input item, tool and format is checked here, so that a 400 names the Responses field
(input.3.content.0.type, tools.1.type, text.format.type) rather than the translated one."""

from __future__ import annotations

import json
import uuid
from dataclasses import dataclass, field
from typing import Any, Literal

from pydantic import Field, ValidationError, field_validator

from g906.engine.sampling_params import MAX_LOGPROBS
from g906.server import protocol as P
from g906.server.errors import bad_request, pydantic_message
from g906.server.tools import _NAME, check_parameters

NAMESPACE_SEPARATOR = "__"      # a namespace's function reaches the model as <namespace>__<name> (as vLLM)
LOGPROBS_INCLUDE = "message.output_text.logprobs"
# OpenAI's includable values: the logprobs are served, the others name outputs this server never makes
KNOWN_INCLUDES = {LOGPROBS_INCLUDE, "reasoning.encrypted_content", "file_search_call.results",
                  "web_search_call.results", "web_search_call.action.sources", "message.input_image.image_url",
                  "computer_call_output.output.image_url", "code_interpreter_call.outputs"}
EFFORTS = ("none", "minimal", "low", "medium", "high", "xhigh")
MAX_METADATA = 16


def new_item_id(prefix: str) -> str:
    """OpenAI's id shape: a prefix, an underscore, hex."""
    return f"{prefix}_{uuid.uuid4().hex}"


class ResponsesRequest(P._Req):
    model: str | None = None
    input: str | list[Any] = Field(description="A text (one user message) or a list of input items.")
    instructions: str | None = Field(None, description="A system message put first (not carried over by "
                                     "previous_response_id).")
    tools: list[Any] | None = Field(None, description="Function tools, and namespaces of function tools.")
    tool_choice: str | dict[str, Any] | None = None
    parallel_tool_calls: bool | None = None
    text: dict[str, Any] | None = Field(None, description="{\"format\": text | json_object | json_schema}.")
    reasoning: dict[str, Any] | None = Field(None, description="{\"effort\": \"none\"} turns thinking off.")
    max_output_tokens: int | None = Field(None, ge=1)
    temperature: float | None = Field(None, ge=0.0, le=2.0)
    top_p: float | None = Field(None, gt=0.0, le=1.0)
    top_logprobs: int | None = Field(None, ge=0, le=min(20, MAX_LOGPROBS))
    include: list[str] | None = None
    stream: bool = False
    store: bool = True
    background: bool = False
    previous_response_id: str | None = None
    metadata: dict[str, str] | None = None
    user: str | None = None
    truncation: Literal["auto", "disabled"] | None = None
    service_tier: str | None = None
    prompt_cache_key: str | None = None
    safety_identifier: str | None = None
    # vLLM's extra sampling fields (extra_body), passed on to the chat request
    top_k: int | None = Field(None, ge=-1)
    min_p: float | None = Field(None, ge=0.0, le=1.0)
    repetition_penalty: float | None = Field(None, gt=0.0, le=2.0)
    presence_penalty: float | None = Field(None, ge=-2.0, le=2.0)
    frequency_penalty: float | None = Field(None, ge=-2.0, le=2.0)
    seed: int | None = Field(None, ge=-(2**63), lt=2**63)
    stop: str | list[str] | None = None
    ignore_eos: bool = False
    min_tokens: int = Field(0, ge=0)
    chat_template_kwargs: dict[str, Any] | None = None
    enable_response_messages: bool = Field(False, description="vLLM: the prompt and the output as raw text "
                                           "and token ids (input_messages, output_messages).")

    @field_validator("metadata")
    @classmethod
    def _metadata(cls, v):
        if v is None:
            return v
        if len(v) > MAX_METADATA:
            raise ValueError(f"at most {MAX_METADATA} metadata pairs")
        for k, val in v.items():
            if len(k) > 64 or len(val) > 512:
                raise ValueError("metadata keys are at most 64 characters, values at most 512")
        return v


@dataclass
class Translation:
    """A Responses request as the chat route takes it, and what the answer and the store need."""

    chat: P.ChatCompletionRequest
    history: list[dict]                  # the conversation's chat messages, without the instructions
    input_items: list[dict]              # this request's input, as items with ids (input_items listing)
    namespaces: dict[str, tuple[str, str]] = field(default_factory=dict)   # flat name -> (namespace, name)
    tools: list[dict] = field(default_factory=list)                          # the tools as the response echoes them
    ignored: list[str] = field(default_factory=list)

    @property
    def logprobs(self) -> bool:
        return bool(self.chat.logprobs)


# -- input items ------------------------------------------------------------------------------------

def _text_part(part: dict, where: str) -> str:
    text = part.get("refusal") if part.get("type") == "refusal" else part.get("text")
    if not isinstance(text, str):
        key = "refusal" if part.get("type") == "refusal" else "text"
        raise bad_request(f"{where}.{key} must be a string", param=f"{where}.{key}")
    return text


def _image_part(part: dict, where: str) -> dict:
    url = part.get("image_url")
    if isinstance(url, dict):
        url = url.get("url")
    if not isinstance(url, str):
        what = "a file_id" if part.get("file_id") is not None else "no image_url"
        raise bad_request(f"{where}: an input_image needs image_url (an http(s) or data: URL); {what} given "
                          "(this server has no file store)", param=f"{where}.image_url")
    return {"type": "image_url", "image_url": {"url": url}}


def _parts(content: Any, where: str, *, images: bool) -> list[dict]:
    """Content parts as chat parts (text and image_url)."""
    if isinstance(content, str):
        return [{"type": "text", "text": content}]
    if not isinstance(content, list):
        raise bad_request(f"{where} must be a string or a list of content parts", param=where)
    out = []
    for j, part in enumerate(content):
        w = f"{where}.{j}"
        kind = part.get("type") if isinstance(part, dict) else None
        if kind in ("input_text", "output_text", "text", "refusal", "summary_text", "reasoning_text"):
            out.append({"type": "text", "text": _text_part(part, w)})
        elif kind == "input_image" and images:
            out.append(_image_part(part, w))
        else:
            allowed = "input_text, output_text, refusal" + (", input_image" if images else "")
            shown = kind if kind is not None else type(part).__name__
            raise bad_request(f"{w}.type: content parts here are {allowed}, not {shown!r}", param=f"{w}.type")
    return out


def _chat_content(parts: list[dict]) -> str | list[dict]:
    if all(p["type"] == "text" for p in parts):
        return "".join(p["text"] for p in parts)
    return parts


def _listed_content(content: Any, role: str) -> list[dict]:
    """A message's content as the input_items listing shows it (typed parts)."""
    kind = "output_text" if role == "assistant" else "input_text"
    if isinstance(content, str):
        part = {"type": kind, "text": content}
        return [part | {"annotations": []} if role == "assistant" else part]
    out = []
    for p in content:
        q = dict(p)
        if q.get("type") == "output_text":
            q.setdefault("annotations", [])
        out.append(q)
    return out


class _Conversation:
    """Chat messages built item by item: an assistant turn gathers its reasoning, its text and its
    calls (as the Responses API splits one turn into several items) until another role speaks."""

    def __init__(self):
        self.messages: list[dict] = []
        self.turn: dict | None = None

    def flush(self) -> None:
        if self.turn is not None:
            self.turn.setdefault("content", "")
            self.messages.append(self.turn)
            self.turn = None

    def assistant(self, *, reasoning: str | None = None, content: str | None = None, call: dict | None = None):
        t = self.turn
        # reasoning starts a turn; text after text or after calls, a new one
        if t is not None and ((reasoning is not None and ("content" in t or "tool_calls" in t))
                              or (content is not None and ("content" in t or "tool_calls" in t))):
            self.flush()
        if self.turn is None:
            self.turn = {"role": "assistant"}
        if reasoning is not None:
            self.turn["reasoning_content"] = reasoning
        if content is not None:
            self.turn["content"] = content
        if call is not None:
            self.turn.setdefault("tool_calls", []).append(call)

    def add(self, message: dict) -> None:
        self.flush()
        self.messages.append(message)


def _message_item(item: dict, where: str, conv: _Conversation) -> dict:
    role, content = item.get("role"), item.get("content")
    if role not in ("user", "system", "developer", "assistant"):
        raise bad_request(f"{where}.role must be user, system, developer or assistant, not {role!r}",
                          param=f"{where}.role")
    parts = _parts(content, f"{where}.content", images=role == "user")
    listed = {"id": item.get("id") if isinstance(item.get("id"), str) else new_item_id("msg"), "type": "message",
              "role": role, "content": _listed_content(content, role), "status": "completed"}
    if role == "assistant":
        conv.assistant(content="".join(p["text"] for p in parts))
    else:
        # chat templates know one instruction role: a developer message is a system message
        conv.add({"role": "system" if role == "developer" else role, "content": _chat_content(parts)})
    return listed


def _function_call_item(item: dict, where: str, conv: _Conversation) -> dict:
    for key in ("call_id", "name", "arguments"):
        if not isinstance(item.get(key), str):
            raise bad_request(f"{where}.{key} must be a string", param=f"{where}.{key}")
    ns = item.get("namespace")
    if ns is not None and not isinstance(ns, str):
        raise bad_request(f"{where}.namespace must be a string", param=f"{where}.namespace")
    try:
        args = json.loads(item["arguments"]) if item["arguments"].strip() else {}
    except json.JSONDecodeError as exc:
        raise bad_request(f"{where}.arguments is not valid JSON: {exc}", param=f"{where}.arguments") from None
    if not isinstance(args, dict):
        raise bad_request(f"{where}.arguments must be a JSON object", param=f"{where}.arguments")
    name = f"{ns}{NAMESPACE_SEPARATOR}{item['name']}" if ns else item["name"]
    conv.assistant(call={"id": item["call_id"], "type": "function",
                         "function": {"name": name, "arguments": item["arguments"] or "{}"}})
    listed = {k: item[k] for k in ("call_id", "name", "arguments")} | {
        "type": "function_call", "id": item.get("id") if isinstance(item.get("id"), str) else new_item_id("fc"),
        "status": "completed"}
    if ns:
        listed["namespace"] = ns
    return listed


def _function_output_item(item: dict, where: str, conv: _Conversation) -> dict:
    if not isinstance(item.get("call_id"), str):
        raise bad_request(f"{where}.call_id must be a string (the call this output answers)",
                          param=f"{where}.call_id")
    output = item.get("output")
    parts = _parts(output, f"{where}.output", images=True)
    conv.add({"role": "tool", "tool_call_id": item["call_id"], "content": _chat_content(parts)})
    return {"id": item.get("id") if isinstance(item.get("id"), str) else new_item_id("fco"),
            "type": "function_call_output", "call_id": item["call_id"], "output": output, "status": "completed"}


def _reasoning_item(item: dict, where: str, conv: _Conversation) -> dict | None:
    texts = []
    for key, kind in (("content", "reasoning_text"), ("summary", "summary_text")):
        value = item.get(key)
        if value is None:
            continue
        if not isinstance(value, list):
            raise bad_request(f"{where}.{key} must be a list of {kind} parts", param=f"{where}.{key}")
        for j, part in enumerate(value):
            if not isinstance(part, dict) or part.get("type") != kind or not isinstance(part.get("text"), str):
                raise bad_request(f"{where}.{key}.{j}: a {key} part is {{\"type\": \"{kind}\", \"text\": ...}}",
                                  param=f"{where}.{key}.{j}")
        if value and not texts:      # the reasoning text itself; else its summary
            texts = [p["text"] for p in value]
    if not texts:
        return None                  # nothing the model could read (e.g. encrypted_content only)
    conv.assistant(reasoning="\n".join(texts))
    return {"id": item.get("id") if isinstance(item.get("id"), str) else new_item_id("rs"), "type": "reasoning",
            "summary": item.get("summary") or [], "content": item.get("content") or [], "status": "completed"}


def input_messages(raw: str | list, conv: _Conversation) -> list[dict]:
    """The request's input into `conv`; returns the input items as the listing shows them."""
    if isinstance(raw, str):
        conv.add({"role": "user", "content": raw})
        return [{"id": new_item_id("msg"), "type": "message", "role": "user",
                 "content": [{"type": "input_text", "text": raw}], "status": "completed"}]
    listed = []
    for i, item in enumerate(raw):
        where = f"input.{i}"
        if not isinstance(item, dict):
            raise bad_request(f"{where} must be an object (a message or another input item)", param=where)
        kind = item.get("type", "message" if "role" in item else None)
        if kind == "message":
            listed.append(_message_item(item, where, conv))
        elif kind == "function_call":
            listed.append(_function_call_item(item, where, conv))
        elif kind == "function_call_output":
            listed.append(_function_output_item(item, where, conv))
        elif kind == "reasoning":
            r = _reasoning_item(item, where, conv)
            if r is not None:
                listed.append(r)
        else:
            raise bad_request(f"{where}.type: input items are message, function_call, function_call_output or "
                              f"reasoning, not {kind!r}", param=f"{where}.type")
    conv.flush()
    return listed


# -- tools, tool_choice, text.format, reasoning -------------------------------------------------------

def _function(t: dict, where: str, flat: str, seen: set[str]) -> dict:
    if not isinstance(t.get("name"), str) or not _NAME.fullmatch(flat):
        raise bad_request(f"{where}.name must be 1-128 letters, digits, '_', '-', '.', ':' or '/' "
                          f"(with its namespace), got {t.get('name')!r}", param=f"{where}.name")
    if flat in seen:
        raise bad_request(f"{where}.name: the tool {flat!r} is defined twice", param=f"{where}.name")
    seen.add(flat)
    desc = t.get("description")
    if desc is not None and not isinstance(desc, str):
        raise bad_request(f"{where}.description must be a string", param=f"{where}.description")
    params = check_parameters(t.get("parameters"), f"{where}.parameters")
    fn = {"name": flat, "parameters": params, "strict": t.get("strict") is True}
    if desc is not None:
        fn["description"] = desc
    return {"type": "function", "function": fn}


def chat_tools(raw: list | None) -> tuple[list[dict] | None, dict[str, tuple[str, str]], list[dict]]:
    """(OpenAI chat tools, flat name -> (namespace, name), the tools as the response echoes them)."""
    if raw is None:
        return None, {}, []
    out, namespaces, echo = [], {}, []
    seen: set[str] = set()
    for i, t in enumerate(raw):
        where = f"tools.{i}"
        kind = t.get("type") if isinstance(t, dict) else None
        if kind == "function":
            out.append(_function(t, where, t.get("name") if isinstance(t.get("name"), str) else "", seen))
            echo.append({"type": "function", "name": t["name"], "description": t.get("description"),
                         "parameters": t.get("parameters"), "strict": t.get("strict")})
        elif kind == "namespace":
            ns, fns = t.get("name"), t.get("tools")
            if not isinstance(ns, str) or not ns:
                raise bad_request(f"{where}.name must be a non-empty string", param=f"{where}.name")
            if not isinstance(fns, list):
                raise bad_request(f"{where}.tools must be a list of function tools", param=f"{where}.tools")
            for j, f in enumerate(fns):
                w = f"{where}.tools.{j}"
                if not isinstance(f, dict) or f.get("type", "function") != "function":
                    shown = f.get("type") if isinstance(f, dict) else type(f).__name__
                    raise bad_request(f"{w}.type: a namespace holds function tools, not {shown!r}", param=f"{w}.type")
                name = f.get("name") if isinstance(f.get("name"), str) else ""
                flat = f"{ns}{NAMESPACE_SEPARATOR}{name}"
                out.append(_function(f, w, flat, seen))
                namespaces[flat] = (ns, name)
            echo.append({"type": "namespace", "name": ns, "description": t.get("description") or "",
                         "tools": [{"type": "function", **{k: v for k, v in f.items() if k != "type"}} for f in fns]})
        else:
            shown = kind if kind is not None else type(t).__name__
            raise bad_request(f"{where}.type: this server runs function tools (and namespaces of them) only, not "
                              f"{shown!r} (hosted tools such as web_search, file_search, mcp or code_interpreter "
                              "are not available)", param=f"{where}.type")
    return out, namespaces, echo


def chat_tool_choice(raw: Any, tools: list[dict] | None) -> Any:
    """OpenAI chat's tool_choice of the Responses one ({"type": "function", "name": ...} named)."""
    if raw is None or isinstance(raw, str):
        if raw not in (None, "auto", "none", "required"):
            raise bad_request(f"tool_choice must be \"auto\", \"none\", \"required\" or a function, not {raw!r}",
                              param="tool_choice")
        return raw
    kind = raw.get("type")
    if kind != "function":
        raise bad_request(f"tool_choice.type: only {{\"type\": \"function\", \"name\": ...}} names a tool here, "
                          f"not {kind!r}", param="tool_choice.type")
    name, ns = raw.get("name"), raw.get("namespace")
    flat = f"{ns}{NAMESPACE_SEPARATOR}{name}" if isinstance(ns, str) and ns else name
    known = [t["function"]["name"] for t in tools or []]
    if not isinstance(name, str) or flat not in known:
        raise bad_request(f"tool_choice names the function {flat!r}, which is not among the request's tools "
                          f"({', '.join(known) or 'none'})", param="tool_choice.name")
    return {"type": "function", "function": {"name": flat}}


def response_format(text: dict | None) -> tuple[dict | None, list[str]]:
    """(the chat route's response_format of text.format, the text fields ignored)."""
    if text is None:
        return None, []
    ignored = [f"text.{k}" for k in text if k != "format"]
    fmt = text.get("format")
    if fmt is None:
        return None, ignored
    if not isinstance(fmt, dict):
        raise bad_request("text.format must be an object", param="text.format")
    kind = fmt.get("type")
    if kind == "text":
        return None, ignored
    if kind == "json_object":
        return {"type": "json_object"}, ignored
    if kind == "json_schema":
        schema = fmt.get("schema")
        if not isinstance(schema, dict):
            raise bad_request("text.format.schema must be a JSON schema object", param="text.format.schema")
        name = fmt.get("name")
        if name is not None and not isinstance(name, str):
            raise bad_request("text.format.name must be a string", param="text.format.name")
        js = {"name": name, "schema": schema, "strict": fmt.get("strict"), "description": fmt.get("description")}
        return {"type": "json_schema", "json_schema": {k: v for k, v in js.items() if v is not None}}, ignored
    raise bad_request(f"text.format.type must be \"text\", \"json_object\" or \"json_schema\", not {kind!r}",
                      param="text.format.type")


def thinking(reasoning: dict | None) -> tuple[dict, list[str]]:
    """(the template's thinking switch, the reasoning fields ignored): effort "none" turns the
    thinking off; another effort leaves it on (its level is not applied)."""
    if reasoning is None:
        return {}, []
    effort = reasoning.get("effort")
    if effort is not None and effort not in EFFORTS:
        raise bad_request(f"reasoning.effort must be one of {', '.join(EFFORTS)}, not {effort!r}",
                          param="reasoning.effort")
    ignored = [f"reasoning.{k}" for k in reasoning if k not in ("effort",) and reasoning[k] is not None]
    if effort == "none":
        return {"enable_thinking": False}, ignored
    if effort is not None:
        ignored.append("reasoning.effort")
    return {}, ignored


def include_flags(include: list[str] | None, top_logprobs: int | None) -> tuple[bool, list[str]]:
    """(whether output_text logprobs are asked, the include values and fields ignored)."""
    ignored, logprobs = [], False
    for i, value in enumerate(include or []):
        if value not in KNOWN_INCLUDES:
            raise bad_request(f"include.{i}: unknown value {value!r} (one of {', '.join(sorted(KNOWN_INCLUDES))})",
                              param=f"include.{i}")
        if value == LOGPROBS_INCLUDE:
            logprobs = True
        else:
            ignored.append(f"include[{value}]")
    if top_logprobs is not None and not logprobs:
        ignored.append("top_logprobs")
    return logprobs, ignored


def ignored_fields(req: ResponsesRequest) -> list[str]:
    """Accepted fields that change nothing here (besides those no model declared)."""
    names = list(P.ignored_fields(req))
    for name in ("user", "service_tier", "prompt_cache_key", "safety_identifier"):
        if getattr(req, name) is not None:
            names.append(name)
    return names


def drop_oldest_turn(chat: P.ChatCompletionRequest) -> P.ChatCompletionRequest | None:
    """truncation "auto": the conversation without its oldest exchange (the first non-system
    message and what follows it up to the next user message); None when only the last user
    message is left to drop."""
    msgs = chat.messages
    first = next((i for i, m in enumerate(msgs) if m.role != "system"), None)
    if first is None:
        return None
    end = next((j for j in range(first + 1, len(msgs)) if msgs[j].role == "user"), None)
    if end is None:
        return None
    return chat.model_copy(update={"messages": msgs[:first] + msgs[end:]})


def translate(req: ResponsesRequest, history: list[dict]) -> Translation:
    """The chat request of a Responses request continuing `history` (the chat messages of its
    previous response, or none)."""
    conv = _Conversation()
    conv.messages = list(history)
    items = input_messages(req.input, conv)
    if not items and not history:
        raise bad_request("input: the conversation has no content", param="input")
    tools, namespaces, echo = chat_tools(req.tools)
    choice = chat_tool_choice(req.tool_choice, tools)
    fmt, ignored_text = response_format(req.text)
    switch, ignored_reasoning = thinking(req.reasoning)
    logprobs, ignored_include = include_flags(req.include, req.top_logprobs)
    messages = ([{"role": "system", "content": req.instructions}] if req.instructions else []) + conv.messages
    body: dict[str, Any] = {
        "messages": messages, "tools": tools or None, "tool_choice": choice if tools or choice else None,
        "parallel_tool_calls": req.parallel_tool_calls, "response_format": fmt,
        "chat_template_kwargs": switch | (req.chat_template_kwargs or {}),
        "max_completion_tokens": req.max_output_tokens, "temperature": req.temperature, "top_p": req.top_p,
        "logprobs": logprobs, "top_logprobs": (req.top_logprobs or 0) if logprobs else None,
        "top_k": req.top_k, "min_p": req.min_p, "seed": req.seed, "stop": req.stop,
        "ignore_eos": req.ignore_eos, "min_tokens": req.min_tokens,
    }
    for name in ("repetition_penalty", "presence_penalty", "frequency_penalty"):
        if getattr(req, name) is not None:
            body[name] = getattr(req, name)
    if choice == "required" and not tools:
        raise bad_request(f"tool_choice {choice!r} needs tools", param="tool_choice")
    try:
        chat = P.ChatCompletionRequest.model_validate(body, strict=False)
    except ValidationError as exc:
        msg, param = pydantic_message(exc)
        raise bad_request(msg, param=param) from None
    return Translation(chat=chat, history=conv.messages, input_items=items, namespaces=namespaces, tools=echo,
                       ignored=ignored_text + ignored_reasoning + ignored_include)
