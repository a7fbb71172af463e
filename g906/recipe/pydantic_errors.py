"""Turn one pydantic error into a RecipeIssue a person can act on: the dotted key, what was
expected in TOML words, what was found, a did-you-mean, and the line it is on."""

from __future__ import annotations

import datetime as _dt
import difflib
import inspect
import typing
from typing import Any

from pydantic import BaseModel
from pydantic.fields import FieldInfo

from g906.recipe.errors import RecipeIssue, dotted, located_issue
from g906.recipe.positions import PositionIndex
from g906.recipe.schema import Recipe

# Friendly names people type for a literal value.
ALIASES = {
    "fp16": "float16", "f16": "float16", "half": "float16",
    "bf16": "bfloat16",
    "fp32": "float32", "f32": "float32", "float": "float32",
    "vllm-serve": "vllm", "builtin": "embedded", "native": "embedded",
    "qwen": "qwen3", "qwen3.5": "qwen3", "qwen35": "qwen3",
    "off": "none", "no": "none", "false": "none",
}

_EXPECTED = {
    "int_type": "an integer", "int_parsing": "an integer", "int_from_float": "an integer",
    "float_type": "a number", "float_parsing": "a number", "string_type": "a string",
    "bool_type": "true or false", "bool_parsing": "true or false", "list_type": "an array",
    "dict_type": "a table", "model_type": "a table", "model_attributes_type": "a table",
}


def describe(value: Any) -> str:
    """A TOML-flavoured description of a parsed value."""
    if isinstance(value, bool):
        return "true" if value else "false"
    if isinstance(value, int):
        return f"the integer {value}"
    if isinstance(value, float):
        return f"the number {value}"
    if isinstance(value, str):
        shown = value if len(value) <= 40 else value[:37] + "..."
        return f'the string "{shown}"'
    if isinstance(value, list):
        return "an array"
    if isinstance(value, dict):
        return "a table"
    if isinstance(value, (_dt.datetime, _dt.date, _dt.time)):
        return "a date/time"
    return type(value).__name__


def _unwrap_model(tp: Any) -> type[BaseModel] | None:
    if inspect.isclass(tp) and issubclass(tp, BaseModel):
        return tp
    for arg in typing.get_args(tp):
        found = _unwrap_model(arg)
        if found is not None:
            return found
    return None


def model_at(path: tuple) -> type[BaseModel] | None:
    cls: type[BaseModel] | None = Recipe
    for el in path:
        if cls is None or not isinstance(el, str) or el not in cls.model_fields:
            return None
        cls = _unwrap_model(cls.model_fields[el].annotation)
    return cls


def field_at(path: tuple) -> FieldInfo | None:
    if not path:
        return None
    parent = model_at(path[:-1])
    if parent is None or not isinstance(path[-1], str):
        return None
    return parent.model_fields.get(path[-1])


def _all_sections() -> dict[str, type[BaseModel]]:
    out: dict[str, type[BaseModel]] = {}

    def walk(prefix: tuple, cls: type[BaseModel]) -> None:
        for name, f in cls.model_fields.items():
            sub = _unwrap_model(f.annotation)
            if sub is not None and name not in ("image", "video"):
                out[".".join(prefix + (name,))] = sub
                walk(prefix + (name,), sub)

    walk((), Recipe)
    return out


def table_name(path: tuple) -> str:
    return "the top level" if not path else "[" + ".".join(str(p) for p in path) + "]"


def unknown_key_help(key: str, parent: tuple) -> str | None:
    cls = model_at(parent)
    allowed = list(cls.model_fields) if cls is not None else []
    close = difflib.get_close_matches(key, allowed, n=1, cutoff=0.6)
    if close:
        return f'did you mean "{close[0]}"?'
    if parent and key in Recipe.model_fields:
        return f"[{key}] is a top-level table; write it outside {table_name(parent)}"
    here = ".".join(str(p) for p in parent)
    for section, sec_cls in _all_sections().items():
        if section != here and key in sec_cls.model_fields:
            return f'"{key}" belongs in [{section}]'
    if not parent and key in _all_sections():
        return None
    if allowed:
        return "expected one of: " + ", ".join(allowed)
    return None


def _literal_help(found: Any, expected: list[str]) -> str | None:
    if not isinstance(found, str):
        return None
    alias = ALIASES.get(found.lower())
    if alias in expected:
        return f'did you mean "{alias}"?'
    close = difflib.get_close_matches(found.lower(), expected, n=1, cutoff=0.5)
    if close:
        return f'did you mean "{close[0]}"?'
    return None


def _range_text(kind: str, ctx: dict) -> str:
    if kind == "greater_than_equal":
        return f"at least {ctx.get('ge')}"
    if kind == "greater_than":
        return f"greater than {ctx.get('gt')}"
    if kind == "less_than_equal":
        return f"at most {ctx.get('le')}"
    return f"less than {ctx.get('lt')}"


def issue_from_pydantic(err: dict, file: str, index: PositionIndex) -> RecipeIssue:
    raw_loc = tuple(err.get("loc", ()))
    media_count = any(isinstance(p, str) and p == "<count>" for p in raw_loc)
    path = tuple(p for p in raw_loc if not (isinstance(p, str) and p.startswith("<") and p.endswith(">")))
    kind = err.get("type", "")
    found = err.get("input")
    ctx = err.get("ctx") or {}
    key = dotted(path)
    f = field_at(path)
    desc = f.description if f is not None else None

    if kind == "extra_forbidden":
        name = str(path[-1]) if path else "?"
        parent = path[:-1]
        what = "table" if isinstance(found, dict) else "key"
        return located_issue(file, index, path, f'unknown {what} "{name}" in {table_name(parent)}',
                             unknown_key_help(name, parent), at="key")
    if kind == "missing":
        name = str(path[-1]) if path else "?"
        if len(path) == 1:
            help = 'every recipe starts with:  [model]  source = "path/to/model.gguf"' if name == "model" else desc
            return located_issue(file, index, (), f"missing the [{name}] table", help, at="key")
        help = f"{name}: {desc}" if desc else None
        return located_issue(file, index, path[:-1], f'{table_name(path[:-1])} is missing the key "{name}"',
                             help, at="key")
    if kind == "literal_error":
        expected = [e.strip().strip("'\"") for e in str(ctx.get("expected", "")).replace(" or ", ", ").split(",")]
        expected = [e for e in expected if e]
        shown = ", ".join(f'"{e}"' for e in expected)
        return located_issue(file, index, path, f"{key} must be one of {shown}; got {describe(found)}",
                             _literal_help(found, expected))
    if kind in ("greater_than_equal", "greater_than", "less_than_equal", "less_than"):
        return located_issue(file, index, path, f"{key} must be {_range_text(kind, ctx)}; got {describe(found)}", desc)
    if kind == "string_too_short":
        return located_issue(file, index, path, f"{key} must not be empty", desc)
    if kind in _EXPECTED:
        expected = _EXPECTED[kind]
        if media_count:
            expected = "a count or a table such as { count = 1, width = 512, height = 512 }"
        return located_issue(file, index, path, f"{key}: expected {expected}, got {describe(found)}", desc)
    if kind == "value_error":
        msg = str(err.get("msg", "")).removeprefix("Value error, ")
        return located_issue(file, index, path, f"{key}: {msg}" if key else msg, desc)
    msg = str(err.get("msg", "invalid value"))
    return located_issue(file, index, path, f"{key}: {msg}" if key else msg, desc)
