"""The architectures g906 knows, by any of their names: the registry key, an HF config.json
"architectures" value or a GGUF general.architecture. Adding an architecture = writing its
module (g906/arch/<name>.py, one Architecture) and listing it here."""

from __future__ import annotations

from pathlib import Path
from typing import Any, Mapping

from g906.arch import qwen35, qwen35moe
from g906.arch.config import ModelConfig, read_json_object
from g906.arch.spec import Architecture
from g906.errors import G906Error

ARCHITECTURES: tuple[Architecture, ...] = (qwen35.ARCH, qwen35moe.ARCH)


def lookup(name: str | None) -> Architecture | None:
    """The architecture one of whose names is `name` (None when unknown)."""
    if not name:
        return None
    for arch in ARCHITECTURES:
        if name in arch.names():
            return arch
    return None


def known_names() -> list[str]:
    """Every HF and GGUF name of every known architecture."""
    return [n for a in ARCHITECTURES for n in (*a.hf_names, *a.gguf_names)]


def embedded() -> list[Architecture]:
    """The architectures the embedded engine runs."""
    return [a for a in ARCHITECTURES if a.embedded]


def for_engine(name: str | None, source: str) -> Architecture:
    """The architecture `name` if the embedded engine runs it, else G906Error naming `source`."""
    arch = lookup(name)
    runs = ", ".join(a.name for a in embedded())
    if arch is None:
        raise G906Error(f"{source}: unknown or unsupported architecture {name!r}",
                        hint=f"the embedded engine runs: {runs}")
    if not arch.embedded:
        raise G906Error(f"{source}: architecture {name!r} is not run by the embedded engine yet",
                        hint='use engine.kind = "vllm" in the recipe')
    return arch


def hf_architecture_name(cfg: Mapping[str, Any]) -> str | None:
    archs = cfg.get("architectures")
    if isinstance(archs, list) and archs and isinstance(archs[0], str):
        return archs[0]
    return None


def config_from_hf(cfg: Mapping[str, Any], source: str = "config.json") -> ModelConfig:
    """ModelConfig from a parsed config.json, mapped by its architecture's module. A config that
    names no architecture is read as Qwen3.5 (text configs saved without one), MoE when its
    model_type says so or it counts experts."""
    name = hf_architecture_name(cfg)
    if name is None:
        text = cfg.get("text_config", cfg)
        moe = "moe" in str(cfg.get("model_type", "")) or bool(isinstance(text, Mapping) and text.get("num_experts"))
        arch = qwen35moe.ARCH if moe else qwen35.ARCH
    else:
        arch = for_engine(name, source)
    assert arch.config_from_hf is not None
    try:
        return arch.config_from_hf(cfg)
    except G906Error as exc:
        if source in exc.message:
            raise
        raise G906Error(f"{source}: {exc.message}", hint=exc.hint) from None
    except (TypeError, ValueError, ZeroDivisionError, AttributeError) as exc:
        raise G906Error(f"{source}: a value has the wrong type or is out of range ({type(exc).__name__}: {exc})",
                        hint="the model's config is damaged or not a Qwen3.5 config") from None


def config_from_hf_dir(path: str | Path) -> ModelConfig:
    p = Path(path) / "config.json"
    return config_from_hf(read_json_object(p, missing="no config.json in the model directory"), str(p))


def config_from_gguf(md: Mapping[str, Any], shapes: Mapping[str, tuple[int, ...]], source: str) -> ModelConfig:
    arch_name = md.get("general.architecture")
    if arch_name is None:
        raise G906Error(f"{source}: GGUF metadata has no general.architecture")
    arch = for_engine(str(arch_name), source)
    assert arch.config_from_gguf is not None
    return arch.config_from_gguf(md, shapes, source)


def for_config(config: ModelConfig) -> Architecture:
    """The architecture a ModelConfig was built for."""
    return for_engine(config.architecture, "model config")


__all__ = ["ARCHITECTURES", "config_from_gguf", "config_from_hf", "config_from_hf_dir", "embedded",
           "for_config", "for_engine", "hf_architecture_name", "known_names", "lookup"]
