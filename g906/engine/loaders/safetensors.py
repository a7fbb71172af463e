"""Hugging Face model directories: config.json + safetensors weights (single file or sharded
with model.safetensors.index.json), F32/F16/BF16, memory-mapped through safetensors.safe_open.
Multimodal checkpoints (Qwen3_5ForConditionalGeneration) yield the text part only. GPTQ, AWQ
and compressed-tensors checkpoints (config.json quantization_config) yield their quantized
projections as GroupQuantWeights (hf_quant.py); other schemes are refused when the directory
is opened."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Iterator

import torch

from g906.arch import config_from_hf_dir
from g906.arch.config import ModelConfig
from g906.errors import G906Error

_VISION_PREFIXES = ("model.visual.", "visual.", "model.vision_tower.", "vision_tower.")
_SUPPORTED_DTYPES = {"F32", "F16", "BF16"}


def is_hf_dir(path: str | Path) -> bool:
    p = Path(path)
    return p.is_dir() and (p / "config.json").is_file()


class HFModelDir:
    """One HF model directory. Same protocol as the GGUF loader's GGUFModelFile:
    config(), weights(), tokenizer(), chat_template()."""

    def __init__(self, path: str | Path):
        self.path = Path(path)
        if not self.path.is_dir():
            raise G906Error(f"{self.path}: not a directory")
        self._config: ModelConfig | None = None
        self.quant = _quant_scheme(self.path)
        self.files = self._weight_files()

    # ------------------------------------------------------------------ files

    def _weight_files(self) -> dict[str, list[str]]:
        """safetensors file -> tensor names in it (vision tensors left out)."""
        index = self.path / "model.safetensors.index.json"
        if index.is_file():
            try:
                data = json.loads(index.read_text(encoding="utf-8"))
                weight_map = data["weight_map"]
            except (OSError, ValueError, KeyError, TypeError) as exc:
                raise G906Error(f"{index}: cannot read the shard index: {exc}") from None
            files: dict[str, list[str]] = {}
            for name, fname in weight_map.items():
                if name.startswith(_VISION_PREFIXES):
                    continue
                files.setdefault(fname, []).append(name)
            for fname in files:
                if not (self.path / fname).is_file():
                    raise G906Error(
                        f"{self.path / fname}: shard listed in model.safetensors.index.json is missing",
                        hint="download the complete model directory",
                    )
            return files
        single = self.path / "model.safetensors"
        candidates = [single] if single.is_file() else sorted(self.path.glob("*.safetensors"))
        if not candidates:
            raise G906Error(
                f"{self.path}: no safetensors weights (model.safetensors or an index)",
                hint="point the model at a Hugging Face directory with .safetensors files",
            )
        files = {}
        for f in candidates:
            files[f.name] = [n for n in self._names_in(f) if not n.startswith(_VISION_PREFIXES)]
        return files

    def _open(self, fpath: Path):
        from safetensors import safe_open

        try:
            return safe_open(str(fpath), framework="pt", device="cpu")
        except Exception as exc:  # safetensors raises its own SafetensorError / OSError
            raise G906Error(f"{fpath}: not a readable safetensors file: {exc}") from None

    def _names_in(self, fpath: Path) -> list[str]:
        with self._open(fpath) as f:
            return list(f.keys())

    @property
    def total_bytes(self) -> int:
        return sum((self.path / f).stat().st_size for f in self.files)

    # ------------------------------------------------------------------ protocol

    def config(self) -> ModelConfig:
        if self._config is None:
            self._config = config_from_hf_dir(self.path)
        return self._config

    def weights(self, progress: bool = False) -> Iterator[tuple[str, torch.Tensor]]:
        """(name, tensor) for every text-model tensor, memory-mapped (copied on conversion)."""
        from g906.engine.progress import Step

        assembler = None
        if self.quant is not None:
            from g906.engine.loaders.hf_quant import QuantAssembler

            assembler = QuantAssembler(self.quant, (n for ns in self.files.values() for n in ns), str(self.path))
        with Step(f"Loading {_display_name(self.path)}", total=self.total_bytes, unit="bytes", count_noun="tensors",
                  enabled=progress) as step:
            for fname, names in self.files.items():
                fpath = self.path / fname
                with self._open(fpath) as f:
                    present = set(f.keys())
                    for name in names:
                        if name not in present:
                            raise G906Error(
                                f"{fpath}: tensor {name} is listed in the index but not in the file",
                                hint="the download is incomplete or the index is stale",
                            )
                        try:
                            t = f.get_tensor(name)
                        except Exception as exc:
                            raise G906Error(f"{fpath}: cannot read tensor {name}: {exc}") from None
                        if t.dtype not in (torch.float32, torch.float16, torch.bfloat16) and t.is_floating_point():
                            raise G906Error(
                                f"{fpath}: tensor {name} has dtype {t.dtype}; only F32, F16 and BF16 are supported"
                            )
                        step.advance(t.numel() * t.element_size(), count=1)
                        if assembler is None:
                            yield name, t
                        else:
                            yield from assembler.feed(name, t)
            if assembler is not None:
                assembler.finish()

    def tokenizer(self):
        """The directory's tokenizer (g906.engine.tokenizer), or None when it has no
        tokenizer.json (token-id prompts still work; text prompts need one)."""
        if not (self.path / "tokenizer.json").is_file():
            return None
        try:
            from g906.engine.tokenizer import Tokenizer
        except ImportError:
            return None
        return Tokenizer.from_hf_dir(self.path)

    def chat_template(self) -> str | None:
        jinja = self.path / "chat_template.jinja"
        if jinja.is_file():
            return jinja.read_text(encoding="utf-8")
        for fname in ("tokenizer_config.json", "chat_template.json"):
            p = self.path / fname
            if p.is_file():
                try:
                    tmpl = json.loads(p.read_text(encoding="utf-8")).get("chat_template")
                except (OSError, ValueError, AttributeError):
                    continue
                if isinstance(tmpl, list):  # named templates: take "default"
                    tmpl = next((t.get("template") for t in tmpl if t.get("name") == "default"), None)
                if isinstance(tmpl, str):
                    return tmpl
        return None


def _display_name(path) -> str:
    """A model folder's name for people: org/name for a Hugging Face cache snapshot
    (models--org--name/snapshots/<commit>), else the folder's own name."""
    parent = path.parent
    if parent.name == "snapshots" and parent.parent.name.startswith("models--"):
        return parent.parent.name[len("models--"):].replace("--", "/")
    return path.name


def _quant_scheme(path: Path):
    """config.json's quantization_config as an HFQuant (g906.arch.hf_quant), None when the model
    is not quantized; an unsupported scheme raises (QuantSchemeError names it)."""
    from g906.arch.hf_quant import parse_quant_config, quant_config_of

    cfg_path = path / "config.json"
    try:
        cfg = json.loads(cfg_path.read_text(encoding="utf-8"))
    except (OSError, ValueError):
        return None          # config() reports an unreadable config.json
    if not isinstance(cfg, dict):
        return None
    return parse_quant_config(quant_config_of(cfg, path))
