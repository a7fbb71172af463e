"""Read the flags of `vllm serve` from its argparse help text.

vLLM builds its command line with argparse, so `vllm serve --help=all` (vLLM >= 0.9, where plain
`--help` only lists the config groups) or `vllm serve --help` (older releases) prints one entry per
option: a line indented by exactly two spaces that starts with the option strings
(`--dtype {auto,half,...}`, `--enforce-eager, --no-enforce-eager`, `--tensor-parallel-size N, -tp N`),
then the help text, on the same line after two or more spaces and/or on deeper-indented lines.
Option names accept `_` for `-` (vLLM's parser treats them alike); names are stored with dashes.
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from typing import Literal

_ENTRY_RE = re.compile(r"^  (-\S.*)$")
_SPLIT_HELP_RE = re.compile(r"\s{2,}")
_ITEM_SPLIT_RE = re.compile(r",\s+(?=-)")


def canonical_flag(name: str) -> str:
    """--max_model_len -> --max-model-len; the part after a '.' (JSON sub-keys) or '=' is dropped."""
    name = name.split("=", 1)[0]
    if name.startswith("--"):
        body = name[2:].split(".", 1)[0]
        return "--" + body.replace("_", "-")
    return name


@dataclass
class FlagInfo:
    names: list[str]                      # every option string of this entry, canonical form
    metavar: str = ""                     # what follows the first option string ("{a,b}", "N", "")
    choices: list[str] | None = None      # from "{a,b,c}" when argparse lists them
    help: str = ""                        # the help text, joined into one line

    @property
    def name(self) -> str:
        longs = [n for n in self.names if n.startswith("--")]
        return (longs or self.names)[0]

    @property
    def takes_value(self) -> bool:
        return bool(self.metavar)

    @property
    def deprecated(self) -> bool:
        return "deprecated" in self.help.lower()

    def to_json(self) -> dict:
        return {"names": self.names, "metavar": self.metavar, "choices": self.choices, "help": self.help}

    @classmethod
    def from_json(cls, d: dict) -> "FlagInfo":
        return cls(names=list(d["names"]), metavar=d.get("metavar", ""), choices=d.get("choices"),
                   help=d.get("help", ""))


def _parse_choices(metavar: str) -> list[str] | None:
    if not metavar.startswith("{"):
        return None
    end = metavar.find("}")
    if end < 0:
        return None
    inner = metavar[1:end]
    return [c.strip() for c in inner.split(",") if c.strip()]


def parse_serve_help(text: str) -> dict[str, FlagInfo]:
    """All option entries of an argparse help text, keyed by every canonical option string."""
    flags: dict[str, FlagInfo] = {}
    current: FlagInfo | None = None
    for raw in text.splitlines():
        line = raw.rstrip()
        m = _ENTRY_RE.match(line)
        if m:
            body = m.group(1)
            parts = _SPLIT_HELP_RE.split(body, maxsplit=1)
            invocation = parts[0]
            help_start = parts[1].strip() if len(parts) > 1 else ""
            names: list[str] = []
            metavar = ""
            for i, item in enumerate(_ITEM_SPLIT_RE.split(invocation)):
                opt, _, rest = item.strip().partition(" ")
                if not opt.startswith("-"):
                    continue
                names.append(canonical_flag(opt))
                if i == 0:
                    metavar = rest.strip()
            if not names:
                current = None
                continue
            current = FlagInfo(names=names, metavar=metavar, choices=_parse_choices(metavar), help=help_start)
            for n in names:
                flags.setdefault(n, current)
            continue
        if current is not None:
            stripped = line.strip()
            indent = len(line) - len(line.lstrip(" "))
            if stripped and indent > 2:
                current.help = (current.help + " " + stripped).strip()
            else:
                current = None
    return flags


MmLimitFormat = Literal["json-options", "json", "kv", "unknown"]


def mm_limit_format(info: FlagInfo | None) -> MmLimitFormat:
    """How this vLLM spells --limit-mm-per-prompt, read from the flag's help text.

    json-options: {"image": {"count": 1, "width": 512, "height": 512}, "video": 0} (vLLM >= 0.11);
    json: {"image": 1, "video": 0}; kv: image=1,video=0 (vLLM <= 0.8); unknown: no help text."""
    if info is None:
        return "unknown"
    h = info.help.lower()
    if "width" in h or "configurable format" in h or '"count"' in h:
        return "json-options"
    if "json" in h or "{" in h:
        return "json"
    if "image=" in h or "comma-separated" in h or "comma separated" in h:
        return "kv"
    return "unknown"
