"""The `qwen3` reasoning parser: text before `</think>` is reasoning, the rest is content.

The chat template may open `<think>` itself (Qwen3.5 does when thinking is on), in which case
the output starts inside the reasoning; otherwise a leading `<think>` in the output opens it.
Output that never closes the tag is all reasoning (when it was opened). Streaming: feed() takes
text deltas and returns (reasoning delta, content delta); a tag split across deltas is held back
until it is decided, so no fragment of a tag ever reaches a client."""

from __future__ import annotations

START = "<think>"
END = "</think>"


def prompt_opens_reasoning(prompt_text: str | None) -> bool:
    """Whether the prompt leaves a <think> open (the template started the reasoning)."""
    if not prompt_text:
        return False
    i = prompt_text.rfind(START)
    return i != -1 and prompt_text.find(END, i) == -1


def _partial_suffix(text: str, tag: str) -> int:
    """Length of the longest suffix of text that is a proper prefix of tag."""
    for k in range(min(len(tag) - 1, len(text)), 0, -1):
        if text.endswith(tag[:k]):
            return k
    return 0


class Qwen3ReasoningParser:
    name = "qwen3"
    start_tag, end_tag = START, END   # what opens / ends the reasoning (a constrained answer starts after it)

    def __init__(self, prompt_text: str | None = None, *, opened: bool | None = None):
        self.state = "reasoning" if (opened if opened is not None else prompt_opens_reasoning(prompt_text)) else "start"
        self.buf = ""
        self.content_started = False
        self.saw_reasoning = self.state == "reasoning"

    @property
    def opened(self) -> bool:
        """Whether the output starts inside the reasoning (the prompt opened it)."""
        return self.state == "reasoning" and not self.buf

    def _content(self, text: str) -> str:
        if not self.content_started:
            text = text.lstrip("\n")
            if text:
                self.content_started = True
        return text

    def feed(self, delta: str) -> tuple[str, str]:
        self.buf += delta
        reasoning, content = "", ""
        while self.buf:
            if self.state == "start":
                stripped = self.buf.lstrip()
                if stripped.startswith(START):
                    self.buf = stripped[len(START):]
                    self.state = "reasoning"
                    self.saw_reasoning = True
                    continue
                if START.startswith(stripped):
                    break  # may still become <think>
                self.state = "content"
                continue
            if self.state == "reasoning":
                i = self.buf.find(END)
                if i != -1:
                    reasoning += self.buf[:i]
                    self.buf = self.buf[i + len(END):]
                    self.state = "content"
                    continue
                keep = _partial_suffix(self.buf, END)
                cut = len(self.buf) - keep
                reasoning += self.buf[:cut]
                self.buf = self.buf[cut:]
                break
            content += self._content(self.buf)
            self.buf = ""
        return reasoning, content

    def finish(self) -> tuple[str, str]:
        """Flush what was held back when the output ends."""
        rest, self.buf = self.buf, ""
        if self.state == "reasoning":
            return rest, ""
        return "", self._content(rest)

    def answer(self, reasoning: str, content: str) -> tuple[str | None, str | None]:
        """The full answer from everything feed() and finish() returned: no reasoning part when the
        output never opened one, no content part when the reasoning never closed."""
        if not self.saw_reasoning:
            return None, content
        return reasoning, (content if content or self.state == "content" else None)

    def parse(self, text: str) -> tuple[str | None, str | None]:
        """Non-streaming: (reasoning or None, content or None)."""
        r1, c1 = self.feed(text)
        r2, c2 = self.finish()
        return self.answer(r1 + r2, c1 + c2)
