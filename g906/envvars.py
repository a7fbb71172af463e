"""Reading g906's tuning variables from the environment, with one clear error for bad values."""

from __future__ import annotations

import os
from typing import Callable, TypeVar

from g906.errors import G906Error

N = TypeVar("N", int, float)


def positive_env(name: str, default: N, parse: Callable[[str], N], unit: str) -> N:
    """The positive number in $name, or `default` when it is unset or empty."""
    raw = os.environ.get(name)
    if not raw:
        return default
    try:
        value = parse(raw)
    except ValueError:
        value = None
    if value is None or not value > 0:   # also refuses NaN
        raise G906Error(f"{name}={raw!r} is not a positive number of {unit}")
    return value
