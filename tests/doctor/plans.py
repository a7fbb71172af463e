"""Plan objects for the doctor tests, built directly (the resolver has its own tests)."""

from __future__ import annotations

import os
from pathlib import Path
from typing import Any

from g906.recipe.plan import MediaLimitPlan, Plan
from g906.recipe.schema import Recipe

GB = 1000 ** 3

# Qwen3.5-27B-like shapes (hybrid: 1 full-attention layer in 4)
QWEN35_27B = {
    "num_hidden_layers": 64, "hidden_size": 5120, "intermediate_size": 17408, "num_attention_heads": 24,
    "num_key_value_heads": 4, "head_dim": 256, "vocab_size": 248320, "full_attention_interval": 4,
    "linear_num_key_heads": 16, "linear_num_value_heads": 48, "linear_key_head_dim": 128,
    "linear_value_head_dim": 128, "linear_conv_kernel_dim": 4, "context_length": 262144,
}
QWEN35_9B = {
    "num_hidden_layers": 32, "hidden_size": 4096, "intermediate_size": 12288, "num_attention_heads": 16,
    "num_key_value_heads": 4, "head_dim": 256, "vocab_size": 248320, "full_attention_interval": 4,
    "linear_num_key_heads": 16, "linear_num_value_heads": 32, "linear_key_head_dim": 128,
    "linear_value_head_dim": 128, "linear_conv_kernel_dim": 4, "context_length": 262144,
}


def sparse_file(path: Path, size: int) -> Path:
    """A file of `size` bytes that takes no disk space (the estimate only stats it)."""
    path.parent.mkdir(parents=True, exist_ok=True)
    with open(path, "wb") as f:
        f.truncate(size)
    return path


def make_plan(
    tmp_path: Path,
    *,
    tp: int = 1,
    devices: list[int] | None = None,
    facts: dict[str, Any] | None = None,
    weights: int = 5 * GB,
    fmt: str = "gguf",
    quantization: str = "gguf",
    architecture: str = "qwen35",
    tensor_types: dict[str, int] | None = None,
    max_model_len: int | None = 32768,
    max_num_seqs: int = 8,
    util: float = 0.9,
    dtype: str = "auto",
    images: int | None = None,
    mmproj: Path | None = None,
    engine_kind: str = "embedded",
    files: list[Path] | None = None,
) -> Plan:
    model_dir = tmp_path / "models"
    if files is None:
        if fmt == "gguf":
            files = [sparse_file(model_dir / "model-Q4_K_M.gguf", weights)]
        elif fmt == "hf":
            files = [sparse_file(model_dir / "hf" / "model.safetensors", weights)]
        else:
            files = []
    recipe = Recipe.model_validate({
        "model": {"source": str(files[0]) if files else "builtin:tiny-qwen35"},
        "parallel": {"tensor_parallel_size": tp, **({"devices": devices} if devices else {})},
        "limits": {"max_num_seqs": max_num_seqs, "gpu_memory_utilization": util,
                   **({"max_model_len": max_model_len} if max_model_len else {})},
        "engine": {"kind": engine_kind},
    })
    mm = {"image": MediaLimitPlan(count=images)} if images else {}
    return Plan(
        recipe=recipe,
        recipe_path=tmp_path / "recipe.toml",
        model_source=recipe.model.source,
        model_format=fmt,  # type: ignore[arg-type]
        model_path=(files[0] if fmt == "gguf" else files[0].parent) if files else None,
        model_files=list(files) + ([mmproj] if mmproj and images else []),
        mmproj_path=mmproj,
        served_model_name="test-model",
        quantization=quantization,  # type: ignore[arg-type]
        gguf_tensor_types=tensor_types if tensor_types is not None else
        ({"F32": 300, "Q4_K": 400, "Q6_K": 50} if fmt == "gguf" else {}),
        dtype=dtype,
        chat_template_path=None,
        architecture=architecture,
        model_facts=dict(facts if facts is not None else QWEN35_9B),
        tensor_parallel_size=tp,
        devices=devices,
        rccl_package=None,
        max_model_len=max_model_len,
        max_num_seqs=max_num_seqs,
        max_num_batched_tokens=None,
        gpu_memory_utilization=util,
        mm_limits=mm,
        engine_kind=engine_kind,  # type: ignore[arg-type]
    )


def file_size(p: Path) -> int:
    return os.path.getsize(p)
