"""Architecture: what g906 knows about one model architecture, torch-free.

An architecture module (g906/arch/<name>.py) builds one Architecture and g906/arch/registry.py
lists it. Everything else asks the registry: the loaders (config mapping, GGUF tensor names and
shapes, which engine model class), tensor parallelism (the counts a TP size must divide), the
recipe resolver and the doctor (is it supported, KV-cache and recurrent-state bytes)."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Callable, Iterator, Mapping

from g906.arch.config import ModelConfig

# GGUF tensor name -> (HF tensor name, transform) where transform names a conversion the loader
# applies ("" none, "norm" zero-centred -> plain RMSNorm weight, "conv" [C,1,K] -> [C,K],
# "a_log" ssm_a = -exp(A_log) -> A_log); None for a tensor the engine does not use.
GGUFNameMap = Callable[[str, ModelConfig], "tuple[str, str] | None"]


@dataclass(frozen=True)
class TPCount:
    """A count that tensor parallelism splits evenly over the ranks."""

    field: str          # ModelConfig field (also the HF config.json key)
    what: str           # for messages: "attention heads", ...
    gguf_key: str       # GGUF metadata key under "<arch>."


@dataclass(frozen=True)
class Architecture:
    name: str                                    # registry key, e.g. "qwen35"
    description: str
    hf_names: tuple[str, ...]                    # config.json "architectures" values
    gguf_names: tuple[str, ...]                  # GGUF general.architecture values
    multimodal: bool                             # a vision tower / mmproj file can come with it
    moe: bool
    # "module:Class" of the embedded engine's model; None: not run by the embedded engine yet
    # (`engine.kind = "vllm"` hands it over). A string, so that this package stays torch-free.
    model_class: str | None = None
    tp_counts: tuple[TPCount, ...] = ()
    # GGUF "<arch>.<key>" -> ModelConfig / config.json name, for facts read from a bare header
    gguf_fact_keys: Mapping[str, str] | None = None
    config_from_hf: Callable[[Mapping[str, Any]], ModelConfig] | None = None
    # (metadata, tensor shapes by GGUF name, source for messages) -> ModelConfig
    config_from_gguf: Callable[[Mapping[str, Any], Mapping[str, tuple[int, ...]], str], ModelConfig] | None = None
    gguf_to_hf: GGUFNameMap | None = None
    # (config, the file's tensor names or None) -> GGUF tensor name -> shape every file of this
    # architecture must have (main layers) and may have (MTP blocks); the names let a module
    # accept either of two layouts a converter writes (fused or separate expert projections)
    gguf_shapes: Callable[..., dict[str, tuple[int, ...]]] | None = None
    gguf_optional_shapes: Callable[..., dict[str, tuple[int, ...]]] | None = None
    # HF tensor name, shape for every weight of the model (synthetic models are built from it)
    hf_shapes: Callable[[ModelConfig], Iterator[tuple[str, tuple[int, ...]]]] | None = None
    # output parsers the server uses by default for this architecture (the recipe may override)
    reasoning_parser: str | None = None
    tool_parser: str | None = None

    @property
    def embedded(self) -> bool:
        return self.model_class is not None

    def names(self) -> tuple[str, ...]:
        return (self.name, *self.hf_names, *self.gguf_names)
