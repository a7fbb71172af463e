"""Token counts as recipes write them: an integer or "8k"-style text (k = 1024)."""

from __future__ import annotations

import re

_LEN_RE = re.compile(r"^\s*(\d+)\s*([kKmM]?)\s*$")


def parse_token_count(value: int | str) -> int:
    """128, "8k", "32K" -> tokens (k = 1024, as vLLM and llama.cpp users write it)."""
    if isinstance(value, bool):
        raise ValueError("expected a whole number of tokens or a string such as \"32k\"")
    if isinstance(value, int):
        return value
    if isinstance(value, str):
        m = _LEN_RE.match(value)
        if m:
            scale = {"": 1, "k": 1024, "m": 1024 * 1024}[m.group(2).lower()]
            return int(m.group(1)) * scale
    raise ValueError(f"expected a whole number of tokens or a string such as \"32k\", got {value!r}")
