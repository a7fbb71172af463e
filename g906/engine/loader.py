"""One entry point that loads any model source into a ready model (the class its architecture
names in g906.arch).

Sources: a Hugging Face directory (config.json + safetensors), a GGUF file (or the first file
of a split set), or "builtin:<name>" (synthetic models in g906.engine.builtin). Every source
object has the same protocol: config() -> ModelConfig, weights() -> Iterator[(hf_name,
Tensor | QuantizedTensor)], tokenizer(), chat_template()."""

from __future__ import annotations

import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import torch

from g906.engine.config import ModelConfig
from g906.errors import G906Error

_DTYPES = {
    "float32": torch.float32, "fp32": torch.float32, "f32": torch.float32,
    "float16": torch.float16, "fp16": torch.float16, "f16": torch.float16, "half": torch.float16,
    "bfloat16": torch.bfloat16, "bf16": torch.bfloat16,
}
# ROCm gfx9 parts with usable bf16 math; the rest of gfx9 (gfx900/gfx906/gfx908) run fp16
_GFX9_BF16 = ("gfx90a", "gfx940", "gfx941", "gfx942", "gfx950")


@dataclass
class LoadedModel:
    model: Any                      # the architecture's model class (e.g. Qwen35ForCausalLM)
    config: ModelConfig
    tokenizer: Any | None
    chat_template: str | None
    source_format: str              # "hf" | "gguf" | "builtin"
    info: dict = field(default_factory=dict)


def default_device() -> torch.device:
    return torch.device("cuda") if torch.cuda.is_available() else torch.device("cpu")


def _gpu_arch(device: torch.device) -> str:
    try:
        return str(getattr(torch.cuda.get_device_properties(device), "gcnArchName", "") or "")
    except Exception:
        return ""


def resolve_dtype(dtype: str | torch.dtype, device: torch.device) -> torch.dtype:
    """'auto': fp32 on CPU; fp16 on ROCm gfx9 without bf16 (gfx906...); bf16 on CUDA/ROCm with
    bf16 support, else fp16. Explicit names: float32/fp32, float16/fp16, bfloat16/bf16."""
    if isinstance(dtype, torch.dtype):
        resolved = dtype
    else:
        key = str(dtype).strip().lower()
        if key == "auto":
            if device.type != "cuda":
                return torch.float32
            if torch.version.hip:
                arch = _gpu_arch(device).split(":")[0]
                if arch.startswith("gfx9") and not arch.startswith(_GFX9_BF16):
                    return torch.float16
            try:
                return torch.bfloat16 if torch.cuda.is_bf16_supported() else torch.float16
            except Exception:
                return torch.float16
        if key not in _DTYPES:
            raise G906Error(
                f"unknown dtype {dtype!r}", hint="use auto, float32, float16 or bfloat16"
            )
        resolved = _DTYPES[key]
    if resolved == torch.bfloat16 and device.type == "cuda" and torch.version.hip:
        arch = _gpu_arch(device).split(":")[0]
        if arch.startswith("gfx9") and not arch.startswith(_GFX9_BF16):
            raise G906Error(
                f"bfloat16 is not supported on {arch}",
                hint="use dtype float16 (or auto); BF16 weights are converted with a range check",
            )
    if resolved not in (torch.float32, torch.float16, torch.bfloat16):
        raise G906Error(f"unsupported compute dtype {resolved}", hint="use float32, float16 or bfloat16")
    return resolved


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


def load_model(
    source: str,
    *,
    dtype: str | torch.dtype = "auto",
    device=None,
    chat_template: str | None = None,
    progress: bool = True,
    tensor_parallel_size: int = 1,
    devices: list[int] | None = None,
) -> LoadedModel:
    """Load `source` (HF dir, GGUF file, builtin:NAME) onto `device` in `dtype`.

    chat_template overrides the model's own template: a path to a .jinja file or the template
    text itself. tensor_parallel_size > 1 splits the model over that many worker processes
    (g906.engine.parallel; `devices`: one GPU index per rank); .model is then a TPModel."""
    if int(tensor_parallel_size) > 1:
        from g906.engine.parallel import load_model_tp

        return load_model_tp(source, tensor_parallel_size=int(tensor_parallel_size), dtype=dtype, device=device,
                             devices=devices, chat_template=chat_template, progress=progress)
    from g906.engine.models import model_class

    dev = torch.device(device) if device is not None else default_device()
    cdtype = resolve_dtype(dtype, dev)
    src, fmt = open_source(str(source))
    config = src.config()
    t0 = time.perf_counter()
    model = model_class(config)(config, dtype=cdtype, device=dev)
    try:
        weights = src.weights(progress=progress)
    except TypeError:
        weights = src.weights()
    stats = model.load_weights(weights)
    load_s = time.perf_counter() - t0

    tok, template = tokenizer_and_template(src, chat_template)
    info = {
        "source": str(source),
        "format": fmt,
        "dtype": str(cdtype).replace("torch.", ""),
        "device": str(dev),
        "load_seconds": round(load_s, 3),
        **stats,
    }
    for attr in ("total_bytes", "file_bytes"):
        val = getattr(src, attr, None)
        if callable(val):
            val = val()
        if isinstance(val, int):
            info["file_bytes"] = val
            break
    if fmt == "builtin":
        info.update({k: v for k, v in getattr(src, "info", {}).items() if k not in info})
    return LoadedModel(model, config, tok, template, fmt, info)


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
