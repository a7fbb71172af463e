"""Chat templates: the model's own Jinja template, rendered in a sandbox the way transformers'
apply_chat_template renders it (same environment options and helpers), so prompts are identical.

    tmpl = ChatTemplate(source, special_tokens={"eos_token": "<|im_end|>"})
    prompt = tmpl.render(messages, add_generation_prompt=True, tools=tools, enable_thinking=False)

Where templates come from (load_chat_template): an explicit override file, the GGUF metadata key
tokenizer.chat_template, an HF directory's chat_template.jinja, chat_template.json or the
chat_template entry of tokenizer_config.json.
"""

from __future__ import annotations

import dataclasses
import json
import os
from collections.abc import Callable, Mapping, Sequence
from datetime import datetime
from pathlib import Path
from typing import Any

from g906.errors import G906Error


def _tojson(x: Any, ensure_ascii: bool = False, indent: int | None = None, separators: Any = None,
            sort_keys: bool = False) -> str:
    # HF semantics: plain json.dumps, no HTML escaping (unlike Jinja's built-in tojson)
    return json.dumps(x, ensure_ascii=ensure_ascii, indent=indent, separators=separators, sort_keys=sort_keys)


def _strftime_now(fmt: str) -> str:
    return datetime.now().strftime(fmt)


def _plain(value: Any) -> Any:
    """Rebuild template inputs from plain JSON types (rich objects never reach the sandbox)."""
    if value is None or type(value) in (str, int, float, bool):
        return value
    if isinstance(value, bool):
        return bool(value)
    if isinstance(value, str):
        return str.__str__(value)
    if isinstance(value, int):
        return int.__int__(value)
    if isinstance(value, float):
        return float.__float__(value)
    if isinstance(value, Mapping):
        return {_plain(k): _plain(v) for k, v in value.items()}
    if isinstance(value, list):
        return [_plain(v) for v in value]
    if isinstance(value, tuple):
        return tuple(_plain(v) for v in value)
    if dataclasses.is_dataclass(value) and not isinstance(value, type):
        return {f.name: _plain(getattr(value, f.name)) for f in dataclasses.fields(value)}
    dump = getattr(value, "model_dump", None)
    if callable(dump):
        return _plain(dump())
    item = getattr(value, "item", None)
    if callable(item) and type(value).__module__ == "numpy":
        return _plain(item())
    return f"<{type(value).__name__}>"


_REASONING_FIELDS = ("reasoning_content", "thinking", "reasoning")


def _arguments_as_objects(messages: list[dict]) -> list[dict]:
    """Tool calls' `function.arguments` sent as JSON text (OpenAI's shape) parsed to the object
    templates iterate (Qwen3.5: `arguments|items`); text that is no JSON object stays as it is."""
    out = []
    for m in messages:
        calls = m.get("tool_calls")
        if isinstance(calls, list) and any(isinstance(c, dict) and isinstance((c.get("function") or {}).get(
                "arguments"), str) for c in calls):
            fixed = []
            for c in calls:
                fn = c.get("function") if isinstance(c, dict) else None
                if isinstance(fn, dict) and isinstance(fn.get("arguments"), str):
                    try:
                        args = json.loads(fn["arguments"])
                    except ValueError:
                        args = None
                    if isinstance(args, dict):
                        c = {**c, "function": {**fn, "arguments": args}}
                fixed.append(c)
            m = {**m, "tool_calls": fixed}
        out.append(m)
    return out


def _alias_reasoning(messages: list[dict]) -> list[dict]:
    out = []
    for m in messages:
        r = next((m[k] for k in _REASONING_FIELDS if m.get(k) is not None), None)
        if r is not None:
            m = {"thinking": r, **m, "reasoning_content": r}
        out.append(m)
    return out


def _build_environment():
    import jinja2
    import jinja2.ext
    from jinja2.sandbox import ImmutableSandboxedEnvironment

    class _Generation(jinja2.ext.Extension):
        """Accepts HF's {% generation %}...{% endgeneration %} blocks (rendered as their body)."""

        tags = {"generation"}

        def parse(self, parser):
            lineno = next(parser.stream).lineno
            body = parser.parse_statements(["name:endgeneration"], drop_needle=True)
            return jinja2.nodes.CallBlock(self.call_method("_body"), [], [], body).set_lineno(lineno)

        def _body(self, caller):
            return caller()

    class _Namespace(jinja2.utils.Namespace):
        def __init__(*args, **kwargs):  # noqa: N805 - same signature trick as jinja's Namespace
            self, args = args[0], args[1:]
            attrs = dict(*args, **kwargs)
            for name in attrs:
                _Namespace._check(name)
            jinja2.utils.Namespace.__init__(self, attrs)

        def __setitem__(self, name, value):
            _Namespace._check(name)
            jinja2.utils.Namespace.__setitem__(self, name, value)

        @staticmethod
        def _check(name):
            if isinstance(name, str) and name.startswith("_"):
                raise jinja2.exceptions.SecurityError(f"templates cannot set the namespace attribute {name!r}")

    class _Dict:
        def __call__(self, *args, **kwargs):
            return dict(*args, **kwargs)

        def fromkeys(self, *args, **kwargs):
            return dict.fromkeys(*args, **kwargs)

    def raise_exception(message):
        raise jinja2.exceptions.TemplateError(message)

    env = ImmutableSandboxedEnvironment(trim_blocks=True, lstrip_blocks=True,
                                        extensions=[_Generation, jinja2.ext.loopcontrols])
    env.filters["tojson"] = _tojson
    env.globals["raise_exception"] = raise_exception
    env.globals["strftime_now"] = _strftime_now
    env.globals["dict"] = _Dict()
    env.globals["namespace"] = _Namespace
    return env


class ChatTemplate:
    """A compiled chat template.

    special_tokens: the tokenizer's special-token strings (bos_token, eos_token, pad_token...)
    that transformers exposes to templates; keyword arguments of render() override them."""

    def __init__(self, source: str, *, special_tokens: Mapping[str, str] | None = None, origin: str = "chat template"):
        import jinja2

        if not isinstance(source, str) or not source.strip():
            raise G906Error(f"{origin}: the chat template is empty")
        self.source = source
        self.origin = origin
        self.special_tokens = dict(special_tokens or {})
        try:
            self._template = _build_environment().from_string(source)
        except jinja2.exceptions.TemplateSyntaxError as exc:
            raise G906Error(f"{origin}:{exc.lineno}: chat template syntax error: {exc.message}") from None

    def render(
        self,
        messages: Sequence[Mapping[str, Any]],
        *,
        add_generation_prompt: bool = True,
        tools: Sequence[Mapping[str, Any] | Callable] | None = None,
        documents: Sequence[Mapping[str, Any]] | None = None,
        **template_kwargs: Any,
    ) -> str:
        import jinja2

        tool_schemas = None
        if tools is not None:
            tool_schemas = []
            for t in tools:
                if isinstance(t, Mapping):
                    tool_schemas.append(t)
                elif callable(t):
                    try:
                        from transformers.utils import get_json_schema
                    except ImportError:
                        raise G906Error("tools given as Python functions need transformers installed; "
                                        "pass JSON schemas instead") from None
                    tool_schemas.append(get_json_schema(t))
                else:
                    raise G906Error(f"a tool must be a JSON schema object, got {type(t).__name__}")
        msgs = _plain(list(messages))
        for m in msgs:
            if not isinstance(m, dict):
                raise G906Error(f"chat messages must be objects, got {m!r}")
        msgs = _alias_reasoning(_arguments_as_objects(msgs))
        kwargs = _plain({**self.special_tokens, **template_kwargs})
        try:
            return self._template.render(
                messages=msgs,
                tools=_plain(tool_schemas),
                documents=_plain(list(documents) if documents is not None else None),
                add_generation_prompt=add_generation_prompt,
                **kwargs,
            )
        except jinja2.exceptions.TemplateError as exc:
            raise G906Error(f"{self.origin}: the chat template refused the request: {exc}") from None
        except Exception as exc:  # noqa: BLE001 - template bugs must not crash the server
            raise G906Error(f"{self.origin}: rendering the chat template failed: {type(exc).__name__}: {exc}") from None


def read_template_file(path: str | os.PathLike[str]) -> str:
    """A template from a .jinja file, a chat_template.json / tokenizer_config.json, or raw text file."""
    p = Path(path)
    try:
        text = p.read_text(encoding="utf-8")
    except FileNotFoundError:
        raise G906Error(f"{p}: chat template file not found") from None
    except (OSError, UnicodeDecodeError) as exc:
        raise G906Error(f"{p}: cannot read the chat template: {exc}") from None
    if p.suffix == ".json":
        try:
            data = json.loads(text)
        except json.JSONDecodeError as exc:
            raise G906Error(f"{p}:{exc.lineno}:{exc.colno}: invalid JSON: {exc.msg}") from None
        t = _template_from_config(data)
        if t is None:
            raise G906Error(f"{p}: no chat_template entry in this JSON file")
        return t
    return text


def _template_from_config(data: Any) -> str | None:
    if not isinstance(data, Mapping):
        return None
    ct = data.get("chat_template")
    if isinstance(ct, str):
        return ct
    if isinstance(ct, list):
        named = {e.get("name"): e.get("template") for e in ct if isinstance(e, Mapping)}
        return named.get("default") or next(iter(named.values()), None)
    return None


def load_chat_template(
    *,
    override: str | os.PathLike[str] | None = None,
    gguf_metadata: Mapping[str, Any] | None = None,
    hf_dir: str | os.PathLike[str] | None = None,
) -> str | None:
    """The template source, by precedence: override file, GGUF metadata, HF directory files."""
    if override is not None:
        return read_template_file(override)
    if gguf_metadata is not None:
        t = gguf_metadata.get("tokenizer.chat_template")
        if isinstance(t, str) and t:
            return t
    if hf_dir is not None:
        d = Path(hf_dir)
        if (d / "chat_template.jinja").is_file():
            return (d / "chat_template.jinja").read_text(encoding="utf-8")
        for name in ("chat_template.json", "tokenizer_config.json"):
            if (d / name).is_file():
                try:
                    t = _template_from_config(json.loads((d / name).read_text(encoding="utf-8")))
                except (OSError, UnicodeDecodeError, json.JSONDecodeError) as exc:
                    raise G906Error(f"{d / name}: cannot read: {exc}") from None
                if t:
                    return t
    return None


__all__ = ["ChatTemplate", "load_chat_template", "read_template_file"]
