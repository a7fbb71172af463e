"""What an output parser is: an object made per choice that turns the engine's text deltas into
the parts of an answer, as they come (streaming) and in the end (the full answer).

A parser is fed text in whatever pieces the engine produced; it must give the same answer for
any split of the same text, because the streamed and the full answers are both assembled from
it (g906/server/assembler.py) and must agree."""

from __future__ import annotations

from typing import Protocol


class ReasoningParser(Protocol):
    """Splits a model's thinking out of its answer."""

    name: str

    def __init__(self, prompt_text: str | None = None) -> None:
        """prompt_text: the rendered prompt, since a chat template may open the reasoning itself."""

    def feed(self, delta: str) -> tuple[str, str]:
        """(reasoning delta, content delta) for the next piece of text; may hold text back."""

    def finish(self) -> tuple[str, str]:
        """(reasoning, content) held back, once the output has ended."""

    def answer(self, reasoning: str, content: str) -> tuple[str | None, str | None]:
        """The full answer's (reasoning, content) from everything feed() and finish() returned:
        None for a part the output did not have."""


class ToolParser(Protocol):
    """Extracts tool calls from the content (after the reasoning parser), e.g. Qwen3.5's XML
    `<tool_call>` blocks. Registered under the "tool" kind in g906/server/parsers/__init__.py."""

    name: str

    def __init__(self, prompt_text: str | None = None) -> None: ...

    def feed(self, content: str) -> tuple[str, list]:
        """(content delta left for the client, tool-call deltas) for the next piece of content."""

    def finish(self) -> tuple[str, list]:
        """What was held back, once the output has ended."""
