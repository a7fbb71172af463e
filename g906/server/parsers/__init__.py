"""The output parsers, by kind and name.

A kind is one job on the model's output: "reasoning" splits the thinking out of the answer,
"tool" extracts tool calls from what is left (the interfaces are in base.py). A parser is chosen
by the name the engine config gives (`engine.reasoning_parser` in a recipe), "none" for no
parser, or "auto" for the one registered as the default of the model's architecture.

To add a parser, write its class (one module per parser, next to qwen3_reasoning.py) and add it
to the kind's table below; the architecture's own default ("auto") is a fact of its g906.arch
module (Architecture.reasoning_parser / tool_parser)."""

from __future__ import annotations

from g906.arch import lookup
from g906.server.parsers.base import ReasoningParser, ToolCall, ToolCallDelta, ToolParser, ToolSpec
from g906.server.parsers.qwen3_coder import Qwen3CoderToolParser
from g906.server.parsers.qwen3_reasoning import Qwen3ReasoningParser

REASONING = "reasoning"
TOOL = "tool"

REASONING_PARSERS: dict[str, type[ReasoningParser]] = {
    "qwen3": Qwen3ReasoningParser,
}
TOOL_PARSERS: dict[str, type[ToolParser]] = {
    "qwen3_coder": Qwen3CoderToolParser,
}

PARSERS: dict[str, dict[str, type]] = {REASONING: REASONING_PARSERS, TOOL: TOOL_PARSERS}



def default_parser(kind: str, architecture: str | None) -> str | None:
    """The parser of `kind` the architecture's models use (g906.arch), if it is registered here."""
    arch = lookup(architecture)
    if arch is None:
        return None
    name = arch.reasoning_parser if kind == REASONING else arch.tool_parser
    return name if name in PARSERS[kind] else None


def parser_name(kind: str, name: str | None, architecture: str | None = None) -> str | None:
    """The registered name `name` stands for (None: no parser). ValueError for an unknown one."""
    table = PARSERS[kind]
    if not name or name == "none":
        return None
    if name == "auto":
        return default_parser(kind, architecture)
    if name not in table:
        known = ", ".join(["none", "auto", *table])
        raise ValueError(f"unknown {kind} parser {name!r} (known: {known})")
    return name


def make_parser(kind: str, name: str | None, prompt_text: str | None, architecture: str | None = None, **options):
    """A fresh parser for one choice, or None when the name selects none. options: the kind's
    own (a tool parser's tools and max_calls)."""
    chosen = parser_name(kind, name, architecture)
    return None if chosen is None else PARSERS[kind][chosen](prompt_text, **options)


__all__ = ["PARSERS", "default_parser", "REASONING", "REASONING_PARSERS", "TOOL", "TOOL_PARSERS",
           "ReasoningParser", "ToolCall", "ToolCallDelta", "ToolParser", "ToolSpec", "make_parser", "parser_name"]
