"""Project data tables (one source of truth per fact), read by doctor, recipe and engine.

quant_types.toml  GGUF tensor types the embedded engine supports, and how it stores them.
compat.toml       the ROCm / PyTorch / Triton compatibility matrix and known-bad combinations.
models.toml       builtin synthetic models and the real shapes of synthetic benchmark models.
"""

from __future__ import annotations

import functools
import sys
from importlib import resources
from typing import Any

if sys.version_info >= (3, 11):
    import tomllib
else:  # pragma: no cover
    import tomli as tomllib


@functools.cache
def load(name: str) -> dict[str, Any]:
    """Parse g906/data/<name>.toml (cached)."""
    text = resources.files(__name__).joinpath(f"{name}.toml").read_text(encoding="utf-8")
    return tomllib.loads(text)
