"""The engine's model classes, one module per architecture. Which class runs a model is the
architecture's own fact (g906.arch: Architecture.model_class), looked up here."""

from __future__ import annotations

import importlib

from g906.arch import for_config
from g906.arch.config import ModelConfig


def model_class(config: ModelConfig) -> type:
    """The nn.Module class that runs `config`'s architecture (G906Error when none does)."""
    arch = for_config(config)
    module, _, name = arch.model_class.partition(":")
    return getattr(importlib.import_module(module), name)
