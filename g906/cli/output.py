"""One output helper for every command: rich for people, stable JSON for scripts,
and the mapping of known errors to "Error: ... / Hint: ..." lines."""

from __future__ import annotations

import json
import os
import sys
import traceback
from typing import Any

from rich.console import Console

console = Console(highlight=False)
err_console = Console(stderr=True, highlight=False)


def debug_enabled() -> bool:
    return os.environ.get("G906_DEBUG", "") not in ("", "0")


def print_json(obj: Any) -> None:
    """Print JSON to stdout exactly (no rich markup or wrapping)."""
    sys.stdout.write(json.dumps(obj, indent=2, sort_keys=False, default=str) + "\n")
    sys.stdout.flush()


def report_error(exc: BaseException, *, as_json: bool = False) -> int:
    """Render an exception for a user; returns the exit status to use."""
    from g906.errors import G906Error

    if debug_enabled():
        traceback.print_exception(exc, file=sys.stderr)
    if isinstance(exc, G906Error):
        if as_json:
            print_json(exc.to_json())
        else:
            err_console.print(f"[bold red]Error:[/] {exc.message}", markup=True, soft_wrap=True)
            for line in exc.details:
                err_console.print(line, markup=False, soft_wrap=True)
            if exc.hint:
                err_console.print(f"[bold]Hint:[/] {exc.hint}", markup=True, soft_wrap=True)
        return exc.exit_code
    message = f"internal error: {type(exc).__name__}: {exc}"
    if as_json:
        print_json({"error": message, "hint": "set G906_DEBUG=1 to see the traceback"})
    else:
        err_console.print(f"[bold red]Error:[/] {message}", markup=True, soft_wrap=True)
        if not debug_enabled():
            err_console.print("[bold]Hint:[/] set G906_DEBUG=1 to see the traceback", markup=True)
    return 1
