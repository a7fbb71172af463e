"""Where each key of a TOML document is written: (dotted path) -> line and column.

tomllib parses TOML into plain dicts and forgets positions, so error messages could not
name a line. This module scans the same source (only after tomllib accepted it, so the
text is known to be valid TOML) and records, for every key path, the span of the key and
the span of its value. Table headers, dotted keys, quoted keys, inline tables, arrays and
arrays of tables are understood; array elements are indexed by position.

The scanner never raises: on anything it does not understand it stops and returns what it
has, and callers fall back to reporting errors without a position.
"""

from __future__ import annotations

from dataclasses import dataclass

Path = tuple  # tuple[str | int, ...]


@dataclass(frozen=True)
class Span:
    line: int      # 1-based
    column: int    # 1-based
    length: int    # characters on that line (at least 1)


@dataclass
class Entry:
    key: Span            # where the key (or the table header's name) is written
    value: Span | None   # the value (None for tables opened by a header)


class PositionIndex:
    def __init__(self, entries: dict[Path, Entry], lines: list[str]):
        self.entries = entries
        self.lines = lines

    def get(self, path: Path) -> Entry | None:
        return self.entries.get(tuple(path))

    def nearest(self, path: Path) -> tuple[Path, Entry] | None:
        """The entry of the path or of its closest written ancestor."""
        p = tuple(path)
        while p:
            e = self.entries.get(p)
            if e is not None:
                return p, e
            p = p[:-1]
        return None

    def source_line(self, line: int) -> str:
        if 1 <= line <= len(self.lines):
            return self.lines[line - 1]
        return ""


_BARE = set("ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz0123456789_-")


class _Scanner:
    def __init__(self, text: str):
        self.s = text
        self.i = 0
        self.n = len(text)
        self.entries: dict[Path, Entry] = {}
        self.aot_counts: dict[Path, int] = {}

    # -- positions -------------------------------------------------------------
    def pos(self, i: int) -> tuple[int, int]:
        line = self.s.count("\n", 0, i) + 1
        start = self.s.rfind("\n", 0, i) + 1
        return line, i - start + 1

    def span(self, a: int, b: int) -> Span:
        line, col = self.pos(a)
        eol = self.s.find("\n", a)
        if eol == -1:
            eol = self.n
        end = min(b, eol)
        return Span(line, col, max(1, end - a))

    def record(self, path: Path, key: Span, value: Span | None) -> None:
        self.entries.setdefault(path, Entry(key, value))

    # -- lexing ----------------------------------------------------------------
    def peek(self, k: int = 0) -> str:
        j = self.i + k
        return self.s[j] if j < self.n else ""

    def skip_ws(self) -> None:
        while self.i < self.n and self.s[self.i] in " \t":
            self.i += 1

    def skip_ws_comments_newlines(self) -> None:
        while self.i < self.n:
            c = self.s[self.i]
            if c in " \t\r\n":
                self.i += 1
            elif c == "#":
                self.skip_comment()
            else:
                break

    def skip_comment(self) -> None:
        eol = self.s.find("\n", self.i)
        self.i = self.n if eol == -1 else eol

    def string(self) -> str:
        """Read a (possibly multi-line) basic or literal string; returns its raw content."""
        q = self.s[self.i]
        if self.s.startswith(q * 3, self.i):
            end = self.i + 3
            while True:
                end = self.s.index(q * 3, end)
                if q == '"' and _escaped(self.s, end):
                    end += 1
                    continue
                break
            # a closing delimiter may be followed by up to two more quotes
            while end + 3 < self.n and self.s[end + 3] == q:
                end += 1
            raw = self.s[self.i + 3:end]
            self.i = end + 3
            return raw
        end = self.i + 1
        while True:
            end = self.s.index(q, end)
            if q == '"' and _escaped(self.s, end):
                end += 1
                continue
            break
        raw = self.s[self.i + 1:end]
        self.i = end + 1
        return _unescape(raw) if q == '"' else raw

    def key_part(self) -> str:
        c = self.peek()
        if c in "\"'":
            return self.string()
        a = self.i
        while self.i < self.n and self.s[self.i] in _BARE:
            self.i += 1
        if self.i == a:
            raise ValueError("expected a key")
        return self.s[a:self.i]

    def dotted_key(self) -> tuple[list[str], int, int]:
        """Returns (parts, start, end) and leaves the cursor after the key."""
        a = self.i
        parts = [self.key_part()]
        end = self.i
        while True:
            self.skip_ws()
            if self.peek() != ".":
                break
            self.i += 1
            self.skip_ws()
            parts.append(self.key_part())
            end = self.i
        return parts, a, end

    # -- structure -------------------------------------------------------------
    def document(self) -> None:
        table: Path = ()
        while True:
            self.skip_ws_comments_newlines()
            if self.i >= self.n:
                return
            if self.peek() == "[":
                table = self.header()
            else:
                self.keyval(table)
                self.skip_ws()
                if self.peek() == "#":
                    self.skip_comment()

    def header(self) -> Path:
        aot = self.s.startswith("[[", self.i)
        self.i += 2 if aot else 1
        self.skip_ws()
        parts, a, b = self.dotted_key()
        self.skip_ws()
        self.i += 2 if aot else 1
        key_span = self.span(a, b)
        path: Path = ()
        for j, part in enumerate(parts):
            path = path + (part,)
            if path in self.aot_counts and not (aot and j == len(parts) - 1):
                path = path + (self.aot_counts[path] - 1,)
            self.record(path, key_span, None)
        if aot:
            idx = self.aot_counts.get(path, 0)
            self.aot_counts[path] = idx + 1
            path = path + (idx,)
            self.record(path, key_span, None)
        return path

    def keyval(self, prefix: Path) -> None:
        parts, a, b = self.dotted_key()
        key_span = self.span(a, b)
        path = prefix
        for part in parts[:-1]:
            path = path + (part,)
            self.record(path, key_span, None)
        path = path + (parts[-1],)
        self.skip_ws()
        self.i += 1  # "="
        self.skip_ws()
        start = self.i
        self.value(path, key_span)
        self.record(path, key_span, self.span(start, self.i))

    def value(self, path: Path, key_span: Span) -> None:
        c = self.peek()
        if c == "{":
            self.i += 1
            while True:
                self.skip_ws_comments_newlines()
                if self.peek() == "}":
                    self.i += 1
                    return
                if self.peek() == ",":
                    self.i += 1
                    continue
                self.keyval(path)
        elif c == "[":
            self.i += 1
            k = 0
            while True:
                self.skip_ws_comments_newlines()
                if self.peek() == "]":
                    self.i += 1
                    return
                if self.peek() == ",":
                    self.i += 1
                    continue
                start = self.i
                self.value(path + (k,), key_span)
                el = self.span(start, self.i)
                self.record(path + (k,), el, el)
                k += 1
        elif c in "\"'":
            self.string()
        else:
            while self.i < self.n and self.s[self.i] not in ",]}#\r\n":
                self.i += 1
            # trailing spaces belong to no value (a date-time may contain one inner space)
            while self.i > 0 and self.s[self.i - 1] in " \t":
                self.i -= 1


def _escaped(s: str, i: int) -> bool:
    """Is the character at i preceded by an odd number of backslashes?"""
    k = 0
    while i - k - 1 >= 0 and s[i - k - 1] == "\\":
        k += 1
    return k % 2 == 1


def _unescape(raw: str) -> str:
    if "\\" not in raw:
        return raw
    try:
        import tomllib  # noqa: PLC0415
    except ModuleNotFoundError:  # Python 3.10
        import tomli as tomllib  # type: ignore[no-redef]
    try:
        return tomllib.loads(f'k = "{raw}"')["k"]
    except Exception:  # noqa: BLE001 - positions are best effort
        return raw


def index_positions(text: str) -> PositionIndex:
    """Scan valid TOML text; never raises (a partial index is returned on surprise)."""
    sc = _Scanner(text)
    try:
        sc.document()
    except Exception:  # noqa: BLE001 - best effort: keep what was found so far
        pass
    return PositionIndex(sc.entries, text.split("\n"))
