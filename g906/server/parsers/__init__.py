"""The output parsers, by kind and name.

A kind is one job on the model's output: "reasoning" splits the thinking out of the answer,
"tool" extracts tool calls from what is left (the interfaces are in base.py). A parser is chosen
by the name the engine config gives (`engine.reasoning_parser` in a recipe), "none" for no
parser, or "auto" for the one registered as the default of the model's architecture.

To add a parser, write its class (one module per parser, next to qwen3_reasoning.py) and add it
to the kind's table below; an architecture whose models always use it gets a DEFAULTS entry."""

from __future__ import annotations

from g906.server.parsers.base import ReasoningParser, ToolParser
from g906.server.parsers.qwen3_reasoning import Qwen3ReasoningParser

REASONING = "reasoning"
TOOL = "tool"

REASONING_PARSERS: dict[str, type[ReasoningParser]] = {
    "qwen3": Qwen3ReasoningParser,
}
TOOL_PARSERS: dict[str, type[ToolParser]] = {}

PARSERS: dict[str, dict[str, type]] = {REASONING: REASONING_PARSERS, TOOL: TOOL_PARSERS}

# architecture name (g906/arch registry keys) -> {kind: parser name}, for "auto"
DEFAULTS: dict[str, dict[str, str]] = {
    "qwen35": {REASONING: "qwen3"},
    "qwen35moe": {REASONING: "qwen3"},
}


def parser_name(kind: str, name: str | None, architecture: str | None = None) -> str | None:
    """The registered name `name` stands for (None: no parser). ValueError for an unknown one."""
    table = PARSERS[kind]
    if not name or name == "none":
        return None
    if name == "auto":
        return DEFAULTS.get(architecture or "", {}).get(kind)
    if name not in table:
        known = ", ".join(["none", "auto", *table])
        raise ValueError(f"unknown {kind} parser {name!r} (known: {known})")
    return name


def make_parser(kind: str, name: str | None, prompt_text: str | None, architecture: str | None = None):
    """A fresh parser for one choice, or None when the name selects none."""
    chosen = parser_name(kind, name, architecture)
    return None if chosen is None else PARSERS[kind][chosen](prompt_text)


__all__ = ["DEFAULTS", "PARSERS", "REASONING", "REASONING_PARSERS", "TOOL", "TOOL_PARSERS",
           "ReasoningParser", "ToolParser", "make_parser", "parser_name"]
