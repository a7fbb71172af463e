"""Model sources: a source string (a Hugging Face directory, a GGUF file or the first file of a
split set, or "builtin:<name>") opened as a source object with one protocol: config() ->
ModelConfig, weights() -> Iterator[(hf_name, Tensor | QuantizedTensor)], tokenizer(),
chat_template(). load_model (g906.engine.loader) and the tensor-parallel workers both start here."""

from __future__ import annotations

import os
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from g906.arch.config import ModelConfig
from g906.engine.tokenizer import Tokenizer
from g906.errors import G906Error


@dataclass
class LoadedModel:
    model: Any                      # the architecture's model class (e.g. Qwen35ForCausalLM)
    config: ModelConfig
    tokenizer: Any | None
    chat_template: str | None
    source_format: str              # "hf" | "gguf" | "builtin"
    info: dict = field(default_factory=dict)


def open_source(source: str):
    """(source object, format) for a model source string."""
    if source.startswith("builtin:"):
        try:
            from g906.engine import builtin
        except ImportError as exc:
            raise G906Error(f"builtin models are unavailable: {exc}") from None
        return _BuiltinSource(builtin, source), "builtin"
    p = Path(source).expanduser()
    if p.is_dir():
        from g906.engine.loaders.safetensors import HFModelDir

        return HFModelDir(p), "hf"
    if p.is_file():
        if p.suffix.lower() == ".gguf" or _has_gguf_magic(p):
            from g906.engine.loaders.gguf import GGUFModelFile

            return GGUFModelFile.open(p), "gguf"
        if p.name == "config.json":
            from g906.engine.loaders.safetensors import HFModelDir

            return HFModelDir(p.parent), "hf"
        raise G906Error(
            f"{p}: not a GGUF file or a Hugging Face model directory",
            hint="pass a .gguf file, a directory with config.json and *.safetensors, or builtin:tiny-qwen35",
        )
    raise G906Error(
        f"model source {source!r} does not exist",
        hint="pass a local .gguf file, a Hugging Face model directory, or builtin:tiny-qwen35",
    )


class _BuiltinSource:
    """builtin.load_builtin(name) -> (config, weights, tokenizer, template) as a source object."""

    def __init__(self, builtin, source: str):
        self._config, self._weights, self._tokenizer, self._template = builtin.load_builtin(source)
        self.info = dict(builtin.builtin_info(source)) if hasattr(builtin, "builtin_info") else {}

    def config(self):
        return self._config

    def weights(self):
        return self._weights

    def tokenizer(self):
        return self._tokenizer

    def chat_template(self):
        return self._template


def _has_gguf_magic(p: Path) -> bool:
    try:
        with open(p, "rb") as f:
            return f.read(4) == b"GGUF"
    except OSError:
        return False


def tokenizer_and_template(src, chat_template: str | None):
    """The source's tokenizer (None when it has none) and chat template (the override, if given)."""
    try:
        tok = src.tokenizer()
    except ImportError:
        tok = None
    template = _resolve_template(chat_template) if chat_template else src.chat_template()
    return tok, template


def _resolve_template(value: str) -> str:
    p = Path(value).expanduser()
    if "\n" not in value and "{" not in value and len(value) < 4096:
        if p.is_file():
            try:
                return p.read_text(encoding="utf-8")
            except (OSError, UnicodeDecodeError) as exc:
                raise G906Error(f"{p}: cannot read the chat template: {exc}") from None
        if p.suffix in (".jinja", ".j2", ".jinja2"):
            raise G906Error(f"{p}: chat template file does not exist")
    return value


def load_tokenizer(source: str | os.PathLike[str]) -> Tokenizer:
    """A tokenizer from an HF model directory, a tokenizer.json file or a .gguf file."""
    p = Path(source)
    if p.is_dir():
        return Tokenizer.from_hf_dir(p)
    if p.suffix == ".gguf":
        from g906.engine.loaders.gguf import GGUFModelFile

        return GGUFModelFile.open(p).tokenizer()
    return Tokenizer.from_file(p)
