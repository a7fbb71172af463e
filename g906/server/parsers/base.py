"""What an output parser is: an object made per choice that turns the engine's text deltas into
the parts of an answer, as they come (streaming) and in the end (the full answer).

A parser is fed text in whatever pieces the engine produced; it must give the same answer for
any split of the same text, because the streamed and the full answers are both assembled from
it (g906/server/assembler.py) and must agree."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Protocol


@dataclass
class ToolCallDelta:
    """A piece of one tool call, as a stream sends it: the call's first piece has its id and
    name, the following ones pieces of its arguments (JSON text). `index` counts the calls of
    one choice from 0."""

    index: int
    id: str | None = None
    name: str | None = None
    arguments: str = ""


@dataclass
class ToolCall:
    """A whole tool call: `arguments` is JSON text (an object)."""

    id: str
    name: str
    arguments: str


def merge_tool_calls(deltas: list[ToolCallDelta]) -> list[ToolCall]:
    """The calls that a run of deltas (every delta of one choice, in order) describes."""
    calls: dict[int, ToolCall] = {}
    for d in deltas:
        c = calls.get(d.index)
        if c is None:
            c = calls[d.index] = ToolCall(id=d.id or "", name=d.name or "", arguments="")
        c.arguments += d.arguments
    return [calls[i] for i in sorted(calls)]


@dataclass(frozen=True)
class ToolSpec:
    """A tool the request offers, whichever API it came through: its name and the JSON schema
    of its arguments (an object schema)."""

    name: str
    parameters: dict[str, Any]
    description: str | None = None
    strict: bool = False


class ReasoningParser(Protocol):
    """Splits a model's thinking out of its answer."""

    name: str
    end_tag: str              # the text that ends the reasoning

    def __init__(self, prompt_text: str | None = None) -> None:
        """prompt_text: the rendered prompt, since a chat template may open the reasoning itself."""

    @property
    def opened(self) -> bool:
        """Whether the output starts inside the reasoning (before anything was fed)."""

    def feed(self, delta: str) -> tuple[str, str]:
        """(reasoning delta, content delta) for the next piece of text; may hold text back."""

    def finish(self) -> tuple[str, str]:
        """(reasoning, content) held back, once the output has ended."""

    def answer(self, reasoning: str, content: str) -> tuple[str | None, str | None]:
        """The full answer's (reasoning, content) from everything feed() and finish() returned:
        None for a part the output did not have."""


class ToolParser(Protocol):
    """Extracts tool calls from the content (after the reasoning parser), e.g. Qwen3.5's XML
    `<tool_call>` blocks. Registered under the "tool" kind in g906/server/parsers/__init__.py.

    tools: the request's tools (their schemas convert argument values); max_calls: None for any
    number of calls, 1 when the request forbids parallel calls (later calls are dropped)."""

    name: str

    def __init__(self, prompt_text: str | None = None, *, tools: list[ToolSpec] | None = None,
                 max_calls: int | None = None) -> None: ...

    def feed(self, content: str) -> tuple[str, list[ToolCallDelta]]:
        """(content delta left for the client, tool-call deltas) for the next piece of content."""

    def finish(self, cut: bool = False) -> tuple[str, list[ToolCallDelta]]:
        """What was held back, once the output has ended. cut: it ended at the token limit, so a
        call still being written is incomplete: its arguments are left unterminated (JSON that
        does not parse, as OpenAI sends a call cut off by max_tokens), never closed into an
        object a client could run as if it were whole."""

    def grammar(self, tools: list[ToolSpec], *, parallel: bool) -> str:
        """A Lark grammar (llguidance's dialect) of an answer that is nothing but one call (or,
        with `parallel`, one or more calls) of `tools`, each call's arguments valid against its
        tool's schema: what tool_choice "required" or a named function constrains decoding to."""
