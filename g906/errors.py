"""Errors that g906 reports to users: a message, a hint, and an exit status.

Anything raised as a G906Error is rendered by the CLI as "Error: ... / Hint: ..."
without a traceback (set G906_DEBUG=1 to see one).
"""

from __future__ import annotations


class G906Error(Exception):
    """A failure with a clear, user-facing message."""

    exit_code = 1

    def __init__(self, message: str, hint: str | None = None, *, details: list[str] | None = None):
        super().__init__(message)
        self.message = message
        self.hint = hint
        self.details = details or []

    def to_json(self) -> dict:
        return {"error": self.message, "hint": self.hint, "details": self.details}


class UsageError(G906Error):
    """Bad command-line usage or an invalid input file (exit status 2)."""

    exit_code = 2
