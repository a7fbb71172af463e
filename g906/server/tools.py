"""The tools a request offers and how it lets the model use them, whichever API they came
through (OpenAI's `tools` / `tool_choice` / `parallel_tool_calls` here; other dialects build the
same objects): checked once, with a 400 naming the field for anything unusable."""

from __future__ import annotations

import re
from dataclasses import dataclass
from typing import Any

from g906.server.errors import bad_request
from g906.server.parsers.base import ToolSpec

_NAME = re.compile(r"[A-Za-z0-9_.:/-]{1,128}")     # what the XML call format can carry as a name


@dataclass(frozen=True)
class ToolChoice:
    """auto: the model may call tools; none: it may not (its output is not parsed for calls);
    required: it must call one or more; function: it must call `name`."""

    mode: str = "auto"
    name: str | None = None

    @property
    def forced(self) -> bool:
        return self.mode in ("required", "function")


def check_parameters(schema: Any, where: str) -> dict:
    """A tool's arguments schema: a JSON object schema (an absent one takes no arguments)."""
    if schema is None:
        return {"type": "object", "properties": {}}
    if not isinstance(schema, dict):
        raise bad_request(f"{where} must be a JSON schema object, not {type(schema).__name__}", param=where)
    t = schema.get("type", "object")
    if t != "object":
        raise bad_request(f"{where}: a tool's parameters must be an object schema (\"type\": \"object\"), "
                          f"not {t!r}", param=where)
    props = schema.get("properties", {})
    if not isinstance(props, dict) or not all(isinstance(v, (dict, bool)) for v in props.values()):
        raise bad_request(f"{where}.properties must map each parameter name to a schema", param=f"{where}.properties")
    required = schema.get("required", [])
    if not isinstance(required, list) or not all(isinstance(r, str) for r in required):
        raise bad_request(f"{where}.required must be a list of parameter names", param=f"{where}.required")
    return schema


def openai_tools(raw: list[dict[str, Any]] | None) -> list[ToolSpec]:
    """OpenAI's `tools`: [{"type": "function", "function": {"name", "description", "parameters", "strict"}}]."""
    out: list[ToolSpec] = []
    seen: set[str] = set()
    for i, t in enumerate(raw or []):
        where = f"tools.{i}"
        if t.get("type", "function") != "function":
            raise bad_request(f"{where}.type: only \"function\" tools are supported, not {t.get('type')!r}",
                              param=f"{where}.type")
        fn = t.get("function")
        if not isinstance(fn, dict):
            raise bad_request(f"{where}.function is missing (an object with name and parameters)",
                              param=f"{where}.function")
        name = fn.get("name")
        if not isinstance(name, str) or not _NAME.fullmatch(name):
            raise bad_request(f"{where}.function.name must be 1-128 letters, digits, '_', '-', '.', ':' or '/', "
                              f"got {name!r}", param=f"{where}.function.name")
        if name in seen:
            raise bad_request(f"{where}.function.name: the tool {name!r} is defined twice",
                              param=f"{where}.function.name")
        seen.add(name)
        desc = fn.get("description")
        if desc is not None and not isinstance(desc, str):
            raise bad_request(f"{where}.function.description must be a string", param=f"{where}.function.description")
        params = check_parameters(fn.get("parameters"), f"{where}.function.parameters")
        out.append(ToolSpec(name=name, parameters=params, description=desc, strict=bool(fn.get("strict"))))
    return out


def openai_tool_choice(raw: Any, tools: list[ToolSpec]) -> ToolChoice:
    """OpenAI's `tool_choice`: "auto" (the default with tools), "none" (the default without),
    "required", or {"type": "function", "function": {"name": ...}}."""
    if raw is None:
        return ToolChoice("auto" if tools else "none")
    if isinstance(raw, str):
        if raw not in ("auto", "none", "required"):
            raise bad_request(f"tool_choice must be \"auto\", \"none\", \"required\" or a named function, not {raw!r}",
                              param="tool_choice")
        if raw == "required" and not tools:
            raise bad_request("tool_choice \"required\" needs tools", param="tool_choice")
        return ToolChoice(raw)
    if isinstance(raw, dict):
        fn = raw.get("function")
        name = fn.get("name") if isinstance(fn, dict) else None
        if raw.get("type", "function") != "function" or not isinstance(name, str):
            raise bad_request("tool_choice: a named choice is {\"type\": \"function\", \"function\": {\"name\": ...}}",
                              param="tool_choice")
        if name not in {t.name for t in tools}:
            known = ", ".join(t.name for t in tools) or "none"
            raise bad_request(f"tool_choice names the function {name!r}, which is not among the request's tools "
                              f"({known})", param="tool_choice")
        return ToolChoice("function", name)
    raise bad_request(f"tool_choice must be a string or an object, not {type(raw).__name__}", param="tool_choice")
