"""The `qwen3_coder` tool parser: Qwen3.5's (and Qwen3-Coder's) XML tool calls.

    <tool_call>
    <function=get_weather>
    <parameter=city>
    Paris
    </parameter>
    </function>
    </tool_call>

Several calls may follow one another; text before the first call is content, text after a call
is dropped (what vLLM's parser of the same name returns in full answers). Parameter values are
raw text, converted by the tool's JSON schema (values.py). Malformed output never fails: a
missing `</parameter>` ends at the next `<parameter=`, `</function>` or `</tool_call>`, a missing
`</function>` / `</tool_call>` at the end of the output, a value that does not convert stays
text, and output whose calls are all unusable (no `<function=NAME>`, a name that is no
identifier) is content as a whole.

Streaming: feed() is a state machine over the text so far that only moves on decided input (a
tag cut across pieces is held back), so any split of the same output yields the same content
and calls. A call's first delta is its id and name, once `<function=NAME>` is complete; then
its arguments stream as JSON text: "{", each parameter once its value has ended, "}". A call
that the token limit cuts off gets no "}" (finish(cut=True))."""

from __future__ import annotations

import json
import uuid

from g906.server.parsers.base import ToolCallDelta, ToolSpec
from g906.server.parsers.values import convert_value

TOOL_CALL = "<tool_call>"
TOOL_CALL_END = "</tool_call>"
FUNCTION = "<function="
FUNCTION_END = "</function>"
PARAMETER = "<parameter="
PARAMETER_END = "</parameter>"
_FORBIDDEN_IN_NAME = set("{}<>\"' \t\n\r")


def _holds_prefix(text: str, *tags: str) -> bool:
    """Whether `text` could still grow into one of `tags` (it is a proper prefix of one)."""
    return any(len(text) < len(t) and t.startswith(text) for t in tags)


def _partial_suffix(text: str, tags: tuple[str, ...]) -> int:
    """Length of the longest suffix of `text` that is a proper prefix of one of `tags`."""
    best = 0
    for tag in tags:
        for k in range(min(len(tag) - 1, len(text)), best, -1):
            if text.endswith(tag[:k]):
                best = k
                break
    return best


def valid_function_name(name: str) -> bool:
    return bool(name) and not any(c in _FORBIDDEN_IN_NAME for c in name)


def new_call_id() -> str:
    return f"call_{uuid.uuid4().hex[:24]}"


class Qwen3CoderToolParser:
    name = "qwen3_coder"

    def __init__(self, prompt_text: str | None = None, *, tools: list[ToolSpec] | None = None,
                 max_calls: int | None = None):
        self.properties = {t.name: dict((t.parameters or {}).get("properties") or {}) for t in (tools or [])}
        self.max_calls = max_calls
        self.state = "content"
        self.buf = ""
        self.held = ""            # raw text from the first call marker on: content if no call comes of it
        self.num_calls = 0
        self.function: str | None = None
        self.param: str | None = None
        self.num_params = 0
        self.final = False        # the output has ended: what follows a tag is known to be nothing

    # -- the state machine ------------------------------------------------------------------------
    def feed(self, content: str) -> tuple[str, list[ToolCallDelta]]:
        if self.num_calls == 0:
            self.held += content
        self.buf += content
        out: list[str] = []
        calls: list[ToolCallDelta] = []
        while self._step(out, calls):
            pass
        return "".join(out), calls

    def _step(self, out: list[str], calls: list[ToolCallDelta]) -> bool:
        """One move of the machine; False when it needs more text."""
        buf = self.buf
        st = self.state
        if st == "content":
            i, j = buf.find(TOOL_CALL), buf.find(FUNCTION)
            hits = [k for k in (i, j) if k != -1]
            if not hits:
                keep = _partial_suffix(buf, (TOOL_CALL, FUNCTION))
                out.append(buf[:len(buf) - keep])
                self.held = self.buf = buf[len(buf) - keep:]
                return False
            k = min(hits)
            out.append(buf[:k])
            self.held = buf[k:]
            if k == i:
                self.buf, self.state = buf[k + len(TOOL_CALL):], "opened"
            else:
                self.buf, self.state = buf[k + len(FUNCTION):], "name"
            return True
        if st == "opened":        # after <tool_call>: a call if <function= comes before </tool_call>
            i, j = buf.find(FUNCTION), buf.find(TOOL_CALL_END)
            if i != -1 and (j == -1 or i < j):
                self.buf, self.state = buf[i + len(FUNCTION):], "name"
                return True
            if j != -1:           # a <tool_call> block with no function in it: plain text
                if self.num_calls == 0:
                    cut = len(self.held) - len(buf) + j + len(TOOL_CALL_END)
                    out.append(self.held[:cut])
                    self.held = self.held[cut:]
                self.buf, self.state = buf[j + len(TOOL_CALL_END):], "content" if self.num_calls == 0 else "between"
                return True
            return False
        if st == "name":
            i = buf.find(">")
            if i == -1:
                return False
            name, self.buf = buf[:i], buf[i + 1:]
            if not valid_function_name(name) or self._full():
                self.state = "skip"
                return True
            self.function, self.num_params, self.state = name, 0, "params"
            calls.append(ToolCallDelta(index=self.num_calls, id=new_call_id(), name=name, arguments=""))
            calls.append(ToolCallDelta(index=self.num_calls, arguments="{"))
            self.num_calls += 1
            self.held = ""
            return True
        if st == "params":
            rest = buf.lstrip()
            if not rest:
                self.buf = ""
                return False
            for tag, nxt in ((PARAMETER, "key"), (FUNCTION_END, "after_function"), (TOOL_CALL_END, "between")):
                if rest.startswith(tag):
                    self.buf = rest[len(tag):]
                    if nxt != "key":
                        self._close_call(calls)
                    self.state = nxt
                    return True
            if _holds_prefix(rest, PARAMETER, FUNCTION_END, TOOL_CALL_END):
                self.buf = rest
                return False
            k = rest.find("<", 1)      # stray text inside a function: skipped up to the next tag
            self.buf = rest[k:] if k != -1 else ""
            return k != -1
        if st == "key":
            i = buf.find(">")
            if i == -1:
                return False
            self.param, self.buf, self.state = buf[:i], buf[i + 1:], "value"
            return True
        if st == "value":
            end = self._value_end(buf)
            if end is None:
                return False
            k, tag = end
            self._emit_param(buf[:k], calls)
            self.buf = buf[k + len(tag):] if tag == PARAMETER_END else buf[k:]
            self.state = "params"
            return True
        if st == "after_function":
            rest = buf.lstrip()
            if rest.startswith(TOOL_CALL_END):
                self.buf, self.state = rest[len(TOOL_CALL_END):], "between"
                return True
            if not rest or _holds_prefix(rest, TOOL_CALL_END):
                self.buf = rest
                return False
            self.buf, self.state = rest, "between"
            return True
        if st == "between":      # after a call: another call, or text the answer drops
            rest = buf.lstrip()
            for tag, nxt in ((TOOL_CALL, "opened"), (FUNCTION, "name")):
                if rest.startswith(tag):
                    self.buf, self.state = rest[len(tag):], nxt
                    return True
            if not rest or _holds_prefix(rest, TOOL_CALL, FUNCTION):
                self.buf = rest
                return False
            k = rest.find("<", 1)
            self.buf = rest[k:] if k != -1 else ""
            return k != -1
        if st == "skip":          # an unusable call: dropped up to its end
            i = buf.find(TOOL_CALL_END)
            if i == -1:
                keep = _partial_suffix(buf, (TOOL_CALL_END,))
                self.buf = buf[len(buf) - keep:]
                return False
            # what follows is no longer content: it starts after a call, even an unusable one
            self.buf, self.state = buf[i + len(TOOL_CALL_END):], "between"
            return True
        raise AssertionError(st)

    # what may follow each closing tag for it to be the real one rather than text of a value (a
    # JSON string or code holding "</parameter>"): whitespace, then one of these or the end
    _NEXT = {PARAMETER_END: (PARAMETER, FUNCTION_END, TOOL_CALL_END), FUNCTION_END: (TOOL_CALL_END,),
             TOOL_CALL_END: (TOOL_CALL,)}

    def _value_end(self, buf: str) -> tuple[int, str] | None:
        """Where the value at the start of `buf` ends (and the tag that ends it), or None while
        undecided. A value ends at a real closing tag, or where its close is missing: at the
        next parameter on a new line."""
        pos = 0
        while True:
            hits = [(buf.find(t, pos), t) for t in (PARAMETER_END, "\n" + PARAMETER, FUNCTION_END, TOOL_CALL_END)]
            hits = [(k, t) for k, t in hits if k != -1]
            if not hits:
                return None
            k, tag = min(hits)
            if tag == "\n" + PARAMETER:
                return k, tag
            after = buf[k + len(tag):].lstrip()
            if not after:
                return (k, tag) if self.final else None
            nxt = self._NEXT[tag]
            if any(after.startswith(t) for t in nxt):
                return k, tag
            if _holds_prefix(after, *nxt) and not self.final:
                return None
            pos = k + 1

    def _full(self) -> bool:
        return self.max_calls is not None and self.num_calls >= self.max_calls

    def _emit_param(self, raw: str, calls: list[ToolCallDelta]) -> None:
        if raw.startswith("\n"):
            raw = raw[1:]
        if raw.endswith("\n"):
            raw = raw[:-1]
        value = convert_value(raw, self.param or "", self.properties.get(self.function or "", {}))
        sep = ", " if self.num_params else ""
        self.num_params += 1
        piece = f"{sep}{json.dumps(self.param, ensure_ascii=False)}: {json.dumps(value, ensure_ascii=False)}"
        calls.append(ToolCallDelta(index=self.num_calls - 1, arguments=piece))

    def _close_call(self, calls: list[ToolCallDelta]) -> None:
        calls.append(ToolCallDelta(index=self.num_calls - 1, arguments="}"))
        self.function = None

    def finish(self, cut: bool = False) -> tuple[str, list[ToolCallDelta]]:
        """The output ended: close what is open (unless `cut`: see ToolParser.finish; the value
        being written is then left out too); with no call at all, the held text is content."""
        calls: list[ToolCallDelta] = []
        content = ""
        self.final = True
        out: list[str] = []
        while self._step(out, calls):
            pass
        content = "".join(out)
        st = self.state
        if st == "value" and not cut:
            self._emit_param(self.buf, calls)
            st = "params"
        if st in ("params", "key") and not cut:
            self._close_call(calls)
        if self.num_calls == 0:
            content += self.held if st != "content" else self.buf
        self.buf, self.held, self.state = "", "", "done"
        return content, calls

    def grammar(self, tools: list[ToolSpec], *, parallel: bool) -> str:
        from g906.server.parsers.qwen3_coder_grammar import calls_grammar

        return calls_grammar(tools, parallel=parallel)
