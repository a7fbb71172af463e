"""The device the engine runs on and the compute dtype it uses there."""

from __future__ import annotations

import torch

from g906.errors import G906Error

_DTYPES = {
    "float32": torch.float32, "fp32": torch.float32, "f32": torch.float32,
    "float16": torch.float16, "fp16": torch.float16, "f16": torch.float16, "half": torch.float16,
    "bfloat16": torch.bfloat16, "bf16": torch.bfloat16,
}
# ROCm gfx9 parts with usable bf16 math; the rest of gfx9 (gfx900/gfx906/gfx908) run fp16
_GFX9_BF16 = ("gfx90a", "gfx940", "gfx941", "gfx942", "gfx950")


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


def auto_dtype_for(src, fmt: str, device: torch.device, dtype: str | torch.dtype) -> str | torch.dtype:
    """'auto' for a model source: float16 on a GPU for GGUF files (unless their matrices are
    BF16) and for int4/int8 checkpoints, whose fused kernels take fp16 activations (llama.cpp
    computes these files in fp16 too); a bf16 compute dtype would send every quantized matmul
    to the reference path. Anything else keeps resolve_dtype's device default."""
    if not (isinstance(dtype, str) and dtype.strip().lower() == "auto") or device.type != "cuda":
        return dtype
    if fmt == "gguf":
        file_type = getattr(src, "metadata", {}).get("general.file_type")
        return "bfloat16" if file_type == 32 and torch.cuda.is_bf16_supported() else "float16"
    if getattr(src, "quant", None) is not None:
        return "float16"
    return dtype
