"""The model registry (g906/data/models.toml): architectures and builtin synthetic models."""

from __future__ import annotations

from functools import lru_cache
from importlib import resources
from typing import Any

try:
    import tomllib
except ModuleNotFoundError:  # Python 3.10
    import tomli as tomllib  # type: ignore[no-redef]


@lru_cache(maxsize=1)
def registry() -> dict[str, Any]:
    text = resources.files("g906.data").joinpath("models.toml").read_text(encoding="utf-8")
    return tomllib.loads(text)


def builtin_names() -> list[str]:
    return sorted(registry().get("builtin", {}))


def builtin_entry(name: str) -> dict[str, Any] | None:
    return registry().get("builtin", {}).get(name)


def architecture(name: str | None) -> tuple[str, dict[str, Any]] | None:
    """The registry entry whose hf or gguf names include `name` (e.g. "qwen35",
    "Qwen3_5ForConditionalGeneration"), as (key, entry)."""
    if not name:
        return None
    for key, entry in registry().get("architectures", {}).items():
        if name == key or name in entry.get("hf", []) or name in entry.get("gguf", []):
            return key, entry
    return None


def known_architecture_names() -> list[str]:
    names: list[str] = []
    for entry in registry().get("architectures", {}).values():
        names += entry.get("hf", []) + entry.get("gguf", [])
    return names
