"""Tool-call parameter values written as raw text (Qwen3.5's `<parameter=KEY>value</parameter>`)
converted to JSON values by the tool's schema, with the conversions vLLM's qwen3_coder parser
applies, so that clients get the same arguments from either server:

- a parameter the schema does not declare (or an unknown tool) stays text;
- the declared type is the schema's "type" (its text, lower-cased), or for "anyOf" the first
  non-null option's; "null"/"None" is null when the schema admits null (a "null" type or option),
  and for every non-string type;
- string-like types keep the text; integer-like: int(); number-like: a float, an int when whole;
  boolean: "true" (any case) is true, anything else false;
- object/array-like: JSON, then a Python literal (models trained on repr()), else the text;
- any other type: a Python literal, else the text.

A value JSON cannot hold (a Python set, bytes...) stays text: the arguments are always JSON."""

from __future__ import annotations

import ast
import json
import math
from typing import Any

_STRING_TYPES = ("string", "str", "text", "varchar", "char", "enum")
_INT_PREFIXES = ("int", "uint", "long", "short", "unsigned")


def _declared_type(schema: Any) -> tuple[str, bool]:
    """(the type name to convert to, whether null is allowed)."""
    if isinstance(schema, dict) and "type" in schema:
        t = str(schema["type"]).strip().lower()
        return t, t == "null"
    if isinstance(schema, dict) and "anyOf" in schema:
        t, nullable, picked = "string", False, False
        for option in schema["anyOf"] if isinstance(schema["anyOf"], list) else []:
            if isinstance(option, dict) and "type" in option:
                ot = str(option["type"]).strip().lower()
                if ot == "null":
                    nullable = True
                elif not picked:
                    t, picked = ot, True
        return t, nullable
    return "string", False


def _literal(text: str) -> Any:
    try:
        return ast.literal_eval(text)
    except (ValueError, SyntaxError, TypeError, MemoryError, RecursionError):
        return text


def _json_safe(value: Any, text: str) -> Any:
    try:
        json.dumps(value, allow_nan=True)
    except (TypeError, ValueError, RecursionError):
        return text
    return value


def convert_value(text: str, name: str, properties: dict[str, Any]) -> Any:
    """The JSON value of parameter `name` written as `text`, given its tool's `properties`."""
    if name not in properties:
        return text
    t, nullable = _declared_type(properties[name])
    low = text.lower()
    if nullable and low in ("null", "none"):
        return None
    if t in _STRING_TYPES:
        return text
    if low in ("null", "none"):
        return None
    if t.startswith(_INT_PREFIXES):
        try:
            return int(text)
        except (ValueError, TypeError):
            return text
    if t.startswith(("num", "float")):
        try:
            f = float(text)
            if math.isinf(f) or math.isnan(f):
                return text
            return f if f - int(f) != 0 else int(f)
        except (ValueError, TypeError, OverflowError):
            return text
    if t in ("boolean", "bool", "binary"):
        return low == "true"
    container = t in ("object", "array", "arr") or t.startswith(("dict", "list"))
    if container:
        try:
            value = json.loads(text)
        except (json.JSONDecodeError, ValueError, RecursionError):
            pass
        else:
            if isinstance(value, str):        # JSON text of a Python repr: one more decoding
                value = _literal(value)
            return _json_safe(value, text)
    value = _literal(text)
    if container and isinstance(value, str) and value != text:
        value = _literal(value)
    return _json_safe(value, text)
