"""Read the flags of `vllm serve` from vLLM's own argument parser, in vLLM's own Python.

vLLM builds `vllm serve`'s command line with argparse (vllm.entrypoints.openai.cli_args.
make_arg_parser on its FlexibleArgumentParser). Asking that parser for its actions gives every
option string, whether it takes a value, its choices and its help exactly, where the help text
(vllm_help.py) has to be read back from a layout that changes between releases (`--help=all`
from 0.9 on, wrapped lines, metavars such as "{hermes,...} or name registered in ..."). The help
text stays the fallback: for an executable whose interpreter is unknown, or a vLLM whose parser
lives elsewhere.

    flags = read_argparse_flags("/opt/vllm/bin/python", timeout=300)   # None: use the help text"""

from __future__ import annotations

import json
import subprocess

from g906.backends.vllm_help import FlagInfo, _parse_choices, canonical_flag

# Runs inside the target interpreter (imports vllm, and with it torch: seconds to a minute).
_ARGPARSE_SCRIPT = r"""
import argparse, json, sys
try:
    from vllm.utils.argparse_utils import FlexibleArgumentParser
except ImportError:
    from vllm.utils import FlexibleArgumentParser
from vllm.entrypoints.openai.cli_args import make_arg_parser

parser = make_arg_parser(FlexibleArgumentParser(prog="vllm serve"))
formatter = parser._get_formatter()
out = []
for action in parser._actions:
    if not action.option_strings or isinstance(action, argparse._HelpAction):
        continue
    if action.nargs == 0:
        metavar = ""
    elif action.metavar is not None:
        metavar = action.metavar if isinstance(action.metavar, str) else " ".join(map(str, action.metavar))
    elif action.choices is not None:
        metavar = "{" + ",".join(str(c) for c in action.choices) + "}"
    else:
        metavar = action.dest.upper()
    try:
        text = formatter._expand_help(action) if action.help else ""
    except Exception:
        text = action.help or ""
    choices = None
    if action.choices is not None:
        try:
            choices = [str(c) for c in action.choices]
        except TypeError:
            choices = None
    out.append({"names": list(action.option_strings), "metavar": metavar, "choices": choices,
                "help": " ".join(str(text).split())})
print("G906-ARGPARSE " + json.dumps(out))
"""

MIN_FLAGS = 8        # fewer: not vLLM's serve parser (the help text decides instead)


def parse_argparse_dump(entries: list[dict]) -> dict[str, FlagInfo]:
    """The probe's entries as FlagInfo, keyed by every canonical option string (as parse_serve_help)."""
    flags: dict[str, FlagInfo] = {}
    for e in entries:
        names = [canonical_flag(n) for n in e.get("names") or [] if isinstance(n, str) and n.startswith("-")]
        if not names:
            continue
        choices = e.get("choices")
        metavar = str(e.get("metavar") or "")
        # a "{a,b} or ..." metavar names the built-in choices of an open-ended option (vLLM's
        # --tool-call-parser): the help text shows them so, and the hand-off checks names against them
        info = FlagInfo(names=names, metavar=metavar,
                        choices=[str(c) for c in choices] if isinstance(choices, list) else _parse_choices(metavar),
                        help=str(e.get("help") or ""))
        for n in names:
            flags.setdefault(n, info)
    return flags


def read_argparse_flags(python: str, timeout: float, env: dict[str, str] | None = None) -> dict[str, FlagInfo] | None:
    """The serve flags from vLLM's parser in `python`; None when that cannot be done (no such
    module, an import error, a timeout, too few flags): the caller reads the help text then."""
    try:
        cp = subprocess.run([python, "-c", _ARGPARSE_SCRIPT], capture_output=True, text=True, timeout=timeout,
                            env=env, stdin=subprocess.DEVNULL, errors="replace")
    except (subprocess.TimeoutExpired, OSError):
        return None
    if cp.returncode != 0:
        return None
    for line in reversed(cp.stdout.splitlines()):
        if line.startswith("G906-ARGPARSE "):
            try:
                entries = json.loads(line[len("G906-ARGPARSE "):])
            except ValueError:
                return None
            flags = parse_argparse_dump(entries if isinstance(entries, list) else [])
            return flags if len({id(f) for f in flags.values()}) >= MIN_FLAGS else None
    return None
