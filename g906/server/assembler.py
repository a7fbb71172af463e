"""The one place an answer is assembled from the engine's output deltas, for the full answer and
for the stream alike, so that the two cannot disagree: every delta goes through feed(), which
runs the output parsers and returns what the delta adds to its choice (a stream sends that at
once); the full answer is what the choice accumulated.

Dialect-neutral: an API's renderer (openai_answers.py) turns ParsedDelta and the finished
choices into its own objects. A tool-call parser, when one is configured, runs on the content
the reasoning parser leaves (g906/server/parsers)."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

from g906.server.generation import GenerationRequest
from g906.server.parsers import REASONING, TOOL, ToolCall, ToolCallDelta, make_parser
from g906.server.parsers.base import merge_tool_calls
from g906.server.request_metrics import Timeline


@dataclass
class ParsedDelta:
    """What one engine step added to one choice, after the output parsers."""

    index: int
    text: str                        # the engine's text, before any parser
    reasoning: str
    content: str
    tool_calls: list[ToolCallDelta]  # pieces of tool calls this step completed (tool parser)
    logprobs: list                   # the engine's TokenLogprobs of this step's tokens
    text_offset: int                 # where `text` starts in the choice's text (after any echoed prompt)
    finished: bool
    finish_reason: str | None
    stop_reason: str | int | None


@dataclass
class ChoiceAssembler:
    index: int
    prefix: str = ""                 # text shown before the output: the prompt, when it is echoed
    reasoning_parser: Any = None
    tool_parser: Any = None
    text: str = ""
    num_tokens: int = 0
    token_ids: list[int] = field(default_factory=list)
    reasoning_tokens: int = 0        # tokens generated while the reasoning was open
    prompt_logprobs: list | None = None   # [None, TokenLogprobs...] when the request asked
    # (text offset, TokenLogprobs) per step: a step's offset is exact even where one token's own
    # text differs from what it added (a partial UTF-8 character, a stop string cut off)
    logprob_runs: list[tuple[int, list]] = field(default_factory=list)
    finish_reason: str | None = None
    stop_reason: str | int | None = None
    cached_tokens: int = 0          # prompt tokens the engine's prefix cache supplied
    timeline: Timeline = field(default_factory=Timeline)   # the engine's times (request_metrics.py)
    _reasoning: list[str] = field(default_factory=list)
    _content: list[str] = field(default_factory=list)
    _calls: list[ToolCallDelta] = field(default_factory=list)
    _flushed: bool = False

    def feed(self, out) -> ParsedDelta:
        offset = len(self.prefix) + len(self.text)
        self.text += out.new_text
        self.num_tokens += len(out.new_token_ids)
        self.token_ids.extend(out.new_token_ids)
        self.timeline.record(out)
        self.cached_tokens = max(self.cached_tokens, int(getattr(out, "num_cached_tokens", 0) or 0))
        if getattr(out, "prompt_logprobs", None) is not None:
            self.prompt_logprobs = out.prompt_logprobs
        in_reasoning = getattr(self.reasoning_parser, "state", None) == "reasoning"
        if out.new_logprobs:
            self.logprob_runs.append((offset, list(out.new_logprobs)))
        reasoning, content, calls = self._parse(out.new_text, out.finished, out.finish_reason == "length")
        if self.reasoning_parser is not None and (in_reasoning or reasoning):
            self.reasoning_tokens += len(out.new_token_ids)
        if out.finished:
            self.finish_reason, self.stop_reason = out.finish_reason, out.stop_reason
        return ParsedDelta(index=self.index, text=out.new_text, reasoning=reasoning, content=content,
                           tool_calls=calls, logprobs=out.new_logprobs, text_offset=offset, finished=out.finished,
                           finish_reason=self._finish_reason(out.finish_reason), stop_reason=out.stop_reason)

    def _parse(self, text: str, finished: bool, cut: bool = False) -> tuple[str, str, list[ToolCallDelta]]:
        """The output parsers over one delta (and, once it ended, what they held back): the
        reasoning parser first, the tool parser on the content it leaves."""
        reasoning, content, calls = "", text, []
        p, t = self.reasoning_parser, self.tool_parser
        if p is not None:
            reasoning, content = p.feed(text)
            if finished:
                r2, c2 = p.finish()
                reasoning, content = reasoning + r2, content + c2
        if t is not None:
            content, calls = t.feed(content)
            if finished:
                c2, k2 = t.finish(cut=cut)
                content, calls = content + c2, calls + k2
        if finished:
            self._flushed = True
        self._reasoning.append(reasoning)
        self._content.append(content)
        self._calls.extend(calls)
        return reasoning, content, calls

    def _finish_reason(self, reason: str | None) -> str | None:
        """A choice that stopped after calling tools finished for "tool_calls" (OpenAI's reason)."""
        return "tool_calls" if reason == "stop" and self._calls else reason

    def answer(self) -> tuple[str | None, str | None]:
        """The full answer's (reasoning, content); None for a part the output did not have (no
        content when the answer is only tool calls)."""
        if not self._flushed:        # the output ended without a finished delta
            self._parse("", True)
        reasoning, content = None, "".join(self._content)
        p = self.reasoning_parser
        if p is not None:
            reasoning, content = p.answer("".join(self._reasoning), content)
        if self._calls and not content:
            content = None
        return reasoning, content

    @property
    def tool_calls(self) -> list[ToolCall]:
        return merge_tool_calls(self._calls)

    @property
    def final_finish_reason(self) -> str | None:
        return self._finish_reason(self.finish_reason)

    @property
    def logprobs(self) -> list:
        return [lp for _, run in self.logprob_runs for lp in run]


class ResponseAssembler:
    """The choices of one request: n per prompt, prompt-major (choice k * n + i is sample i of
    prompt k)."""

    def __init__(self, request: GenerationRequest, *, reasoning_parser: str | None = None,
                 tool_parser: str | None = None, architecture: str | None = None, prefixes: list[str] | None = None):
        self.request = request
        n = request.n
        if not request.parses_tool_calls:
            tool_parser = None
        max_calls = None if request.parallel_tool_calls else 1
        self.choices = [
            ChoiceAssembler(
                index=k * n + i, prefix=prefixes[k] if prefixes else "",
                reasoning_parser=make_parser(REASONING, reasoning_parser, p.text, architecture),
                tool_parser=make_parser(TOOL, tool_parser, p.text, architecture, tools=request.tools,
                                        max_calls=max_calls),
            )
            for k, p in enumerate(request.prompts) for i in range(n)
        ]

    def feed(self, stream_index: int, sample_index: int, out) -> ParsedDelta:
        """One delta of sample `sample_index` from engine stream `stream_index` (the prompt's)."""
        return self.choices[stream_index * self.request.n + sample_index].feed(out)

    @property
    def completion_tokens(self) -> int:
        return sum(c.num_tokens for c in self.choices)

    @property
    def cached_tokens(self) -> int:
        """Prompt tokens served from the prefix cache: per prompt (counted once, as in
        prompt_tokens) the most any of its samples had."""
        n = self.request.n
        return sum(max(c.cached_tokens for c in self.choices[k * n:(k + 1) * n])
                   for k in range(len(self.request.prompts)))

    @property
    def reasoning_tokens(self) -> int | None:
        """Tokens generated inside the reasoning (None without a reasoning parser)."""
        if all(c.reasoning_parser is None for c in self.choices):
            return None
        return sum(c.reasoning_tokens for c in self.choices)
