"""Recipe problems with a position, rendered the way compilers and uv do:

    recipe.toml:3:1: unknown key "tensor_paralel_size" in [parallel]
      3 | tensor_paralel_size = 2
        | ^^^^^^^^^^^^^^^^^^^
        = help: did you mean "tensor_parallel_size"?
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from g906.errors import UsageError

if TYPE_CHECKING:
    from g906.recipe.positions import PositionIndex

_WINDOW = 100  # characters of a long source line shown around the caret


@dataclass
class RecipeIssue:
    file: str
    message: str
    line: int | None = None        # 1-based
    column: int | None = None      # 1-based
    length: int = 1                # caret width
    key: str | None = None         # dotted key path, e.g. "parallel.devices[1]"
    help: str | None = None
    source_line: str | None = None
    severity: str = "error"        # "error" | "warning"

    def location(self) -> str:
        if self.line is None:
            return self.file
        if self.column is None:
            return f"{self.file}:{self.line}"
        return f"{self.file}:{self.line}:{self.column}"

    def render(self) -> list[str]:
        """The issue as plain text lines (no markup)."""
        prefix = "warning: " if self.severity == "warning" else ""
        out = [f"{self.location()}: {prefix}{self.message}"]
        gutter = len(str(self.line)) if self.line is not None else 1
        if self.line is not None and self.source_line is not None:
            shown, caret_at = _display(self.source_line, (self.column or 1) - 1)
            out.append(f"  {self.line} | {shown}")
            if self.column is not None:
                width = max(1, min(self.length, len(shown) - caret_at))
                out.append(f"  {' ' * gutter} | {' ' * caret_at}{'^' * width}")
        if self.help:
            out.append(f"  {' ' * gutter} = help: {self.help}")
        return out

    def to_json(self) -> dict[str, Any]:
        return {
            "file": self.file,
            "line": self.line,
            "column": self.column,
            "key": self.key,
            "message": self.message,
            "help": self.help,
            "severity": self.severity,
        }


def _display(line: str, col0: int) -> tuple[str, int]:
    """A printable version of a source line and the caret offset in it."""
    line = line.rstrip("\r\n")
    col0 = max(0, min(col0, len(line)))
    clean = "".join(ch if (ch >= " " and ch != "\x7f") or ch == "\t" else "\ufffd" for ch in line)
    head = clean[:col0].expandtabs(4)
    tail = clean[col0:].expandtabs(4)
    shown, caret = head + tail, len(head)
    if len(shown) > 2 * _WINDOW:
        start = max(0, caret - _WINDOW)
        end = caret + _WINDOW
        shown = ("..." if start else "") + shown[start:end] + ("..." if end < len(shown) else "")
        caret = caret - start + (3 if start else 0)
    return shown, caret


class RecipeError(UsageError):
    """An invalid recipe: one or more RecipeIssues (exit status 2)."""

    def __init__(self, file: str, issues: list[RecipeIssue], *, hint: str | None = None):
        self.file = file
        self.issues = issues
        n = len(issues)
        message = f"{file} is not a valid recipe ({n} error{'s' if n != 1 else ''})"
        if hint is None:
            hint = "the recipe reference is docs/recipes.md; `g906 recipe schema` prints the JSON Schema"
        details: list[str] = []
        for issue in issues:
            details.extend(issue.render())
        super().__init__(message, hint, details=details)

    def to_json(self) -> dict[str, Any]:
        return {
            "ok": False,
            "error": self.message,
            "hint": self.hint,
            "errors": [i.to_json() for i in self.issues],
        }


def located_issue(file: str, index: "PositionIndex | None", path: tuple, message: str,
                  help: str | None = None, *, at: str = "value", severity: str = "error") -> RecipeIssue:
    """An issue pointing at the key path's value (at="value") or key (at="key")."""
    issue = RecipeIssue(file=file, message=message, key=dotted(path) or None, help=help, severity=severity)
    found = index.nearest(path) if index is not None else None
    if found is not None:
        _, entry = found
        span = entry.value if (at == "value" and entry.value is not None) else entry.key
        issue.line, issue.column, issue.length = span.line, span.column, span.length
        issue.source_line = index.source_line(span.line)
    return issue


def dotted(path: tuple) -> str:
    out = ""
    for el in path:
        if isinstance(el, int):
            out += f"[{el}]"
        else:
            s = str(el)
            if not re.fullmatch(r"[A-Za-z0-9_-]+", s):
                s = '"' + s.replace("\\", "\\\\").replace('"', '\\"') + '"'
            out += ("." if out else "") + s
    return out
