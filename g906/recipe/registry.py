"""What the recipe resolver asks of the registries: the builtin synthetic models
(g906/data/models.toml) and the architectures (g906.arch)."""

from __future__ import annotations

from typing import Any

from g906 import data as _data
from g906.arch import registry as _arch
from g906.arch.spec import Architecture


def registry() -> dict[str, Any]:
    return _data.load("models")


def builtin_names() -> list[str]:
    return sorted(registry().get("builtin", {}))


def builtin_entry(name: str) -> dict[str, Any] | None:
    return registry().get("builtin", {}).get(name)


def architecture(name: str | None) -> Architecture | None:
    """The architecture one of whose names is `name` ("qwen35", "Qwen3_5ForConditionalGeneration"...)."""
    return _arch.lookup(name)


def embedded_architectures() -> list[str]:
    return [a.name for a in _arch.embedded()]


def known_architecture_names() -> list[str]:
    return _arch.known_names()
