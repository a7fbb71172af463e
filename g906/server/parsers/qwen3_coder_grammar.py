"""The grammar of Qwen3.5 tool calls (the format qwen3_coder.py parses), for tool_choice
"required" and a named function: an answer that is one call (or several, one per line) of the
given tools, each parameter's text written so that the parser's conversion (values.py) yields a
value valid against the tool's schema.

A parameter's text, by its declared type (as values.py reads it):
- string: raw text that cannot end its value early (no "</", no newline before "<", no blank
  line), or one line within its minLength / maxLength, or one of its enum values (a "pattern"
  is not enforced);
- integer / number: a JSON number under the schema's own bounds (llguidance's %json);
- boolean: true or false; null: null;
- object / array: JSON valid against the parameter's schema (%json);
- "anyOf" with a null option, or a nullable type list: null or the other option's text;
- anything else: JSON valid against its schema.
Required parameters come in the schema's order, each optional one may be left out."""

from __future__ import annotations

import json
import re
from typing import Any

from g906.server.parsers.base import ToolSpec

# raw text that cannot end its value early: no "</" (closing tags) and no newline before "<"
# (a "\n<parameter=" ends a value whose closing tag is missing), nor a blank line
_RAW_TEXT = r"/([^<\n]|<[^\/<\n]|\n[^<\n])*/"


def _lit(text: str) -> str:
    return json.dumps(text, ensure_ascii=False)


def _json(schema: Any) -> str:
    # compact JSON: free whitespace would only let a model wander (and newlines are the format's)
    schema = dict(schema) if isinstance(schema, dict) else {}
    schema["x-guidance"] = {**schema.get("x-guidance", {}), "whitespace_flexible": False}
    return "%json " + json.dumps(schema, ensure_ascii=False)


def _raw_text(schema: dict) -> str:
    """A string parameter's raw text; with length bounds, one line of that many characters."""
    lo, hi = schema.get("minLength"), schema.get("maxLength")
    if isinstance(lo, int) or isinstance(hi, int):
        lo = max(0, lo if isinstance(lo, int) else 0)
        hi_s = str(max(lo, hi)) if isinstance(hi, int) else ""
        return f"/[^<\\n]{{{lo},{hi_s}}}/"
    return _RAW_TEXT


def _rule_name(prefix: str, name: str, used: set[str]) -> str:
    base = prefix + re.sub(r"[^a-z0-9_]", "_", name.lower())
    out, k = base, 1
    while out in used:
        k += 1
        out = f"{base}_{k}"
    used.add(out)
    return out


def value_expr(schema: Any) -> str:
    """The grammar expression of one parameter's text."""
    if not isinstance(schema, dict):
        return _RAW_TEXT
    if "type" in schema:
        t = schema["type"]
        if isinstance(t, list):
            others = [x for x in t if x != "null"]
            if len(others) == 1 and len(t) == 2 and others[0] in ("integer", "number"):
                return f'("null" | {_json({**schema, "type": others[0]})})'
            if len(others) == 1 and len(t) == 2 and others[0] == "boolean":
                return '("null" | "True" | "False")'       # read as Python literals (values.py)
            return _json({**schema, "type": others}) if others else '"null"'
        t = str(t).lower()
        if t == "string":
            if isinstance(schema.get("enum"), list) and schema["enum"]:
                return "(" + " | ".join(_lit(str(e)) for e in schema["enum"]) + ")"
            if "const" in schema:
                return _lit(str(schema["const"]))
            return _raw_text(schema)
        if t == "boolean":
            return '("true" | "false")'
        if t == "null":
            return '"null"'
        return _json(schema)
    if isinstance(schema.get("anyOf"), list):
        options = [o for o in schema["anyOf"] if isinstance(o, dict)]
        non_null = [o for o in options if o.get("type") != "null"]
        nullable = len(non_null) < len(options)
        if non_null:
            first = non_null[0]
            t = str(first.get("type", "")).lower()
            inner = value_expr(first)
            return f'("null" | {inner})' if nullable else inner
        return '"null"'
    return _RAW_TEXT


def call_rules(tool: ToolSpec, used: set[str]) -> tuple[str, list[str]]:
    """(the rule name of one call of `tool`, the rules it needs)."""
    props = (tool.parameters or {}).get("properties") or {}
    required = set((tool.parameters or {}).get("required") or [])
    rules: list[str] = []
    parts: list[str] = []
    for key, schema in props.items():
        rname = _rule_name("p_", f"{tool.name}_{key}", used)
        rules.append(f"{rname}: {_lit(f'<parameter={key}>' + chr(10))} {value_expr(schema)} "
                     f"{_lit(chr(10) + '</parameter>' + chr(10))}")
        parts.append(rname if key in required else f"{rname}?")
    cname = _rule_name("call_", tool.name, used)
    head = _lit(f"<tool_call>\n<function={tool.name}>\n")
    tail = _lit("</function>\n</tool_call>")
    rules.insert(0, f"{cname}: {head} {' '.join(parts)} {tail}".replace("  ", " "))
    return cname, rules


def calls_grammar(tools: list[ToolSpec], *, parallel: bool) -> str:
    """A Lark grammar (llguidance) of one call of any of `tools`, or with `parallel` one or more
    calls separated by a newline."""
    if not tools:
        raise ValueError("a tool-call grammar needs at least one tool")
    used: set[str] = {"start", "call"}
    names, rules = [], []
    for tool in tools:
        cname, crules = call_rules(tool, used)
        names.append(cname)
        rules.extend(crules)
    top = ['start: call ("\\n" call)*' if parallel else "start: call", "call: " + " | ".join(names)]
    return "\n".join(top + rules) + "\n"
