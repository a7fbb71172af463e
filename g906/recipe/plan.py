"""The Plan: a recipe resolved against the file system — what `g906 up` will actually do.

resolve() (g906/recipe/resolve.py) builds it; the doctor, the vLLM handoff and the
embedded engine read it. Plain data, JSON-serialisable through to_json()."""

from __future__ import annotations

from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any, Literal

from g906.recipe.schema import Recipe

ModelFormat = Literal["gguf", "hf", "builtin"]


@dataclass
class MediaLimitPlan:
    count: int
    width: int | None = None
    height: int | None = None


@dataclass
class Plan:
    recipe: Recipe
    recipe_path: Path | None
    # model
    model_source: str                      # as written in the recipe (builtin:..., path)
    model_format: ModelFormat
    model_path: Path | None                # GGUF first shard or HF directory; None for builtin
    model_files: list[Path]                # every file that will be read (all shards, safetensors, tokenizer...)
    mmproj_path: Path | None
    served_model_name: str
    quantization: str                      # none | gguf | gptq | awq | compressed-tensors (vLLM: any it reads)
    gguf_tensor_types: dict[str, int]      # GGUF type name -> tensor count (empty when not GGUF)
    dtype: str                             # as requested: auto | float16 | bfloat16 | float32
    chat_template_path: Path | None
    architecture: str | None               # e.g. qwen35 / Qwen3_5ForConditionalGeneration
    model_facts: dict[str, Any]            # layer/head counts etc. for memory estimates (may be partial)
    # parallel
    tensor_parallel_size: int
    devices: list[int] | None
    rccl_package: Path | None
    # limits
    max_model_len: int | None              # None: the model's own
    max_num_seqs: int
    max_num_batched_tokens: int | None
    gpu_memory_utilization: float
    default_max_tokens: int | str | None = None   # as the recipe says (g906/serving/generation_defaults.py)
    mm_limits: dict[str, MediaLimitPlan] = field(default_factory=dict)  # "image"/"video" -> limit
    # engine and server
    engine_kind: Literal["embedded", "vllm"] = "embedded"
    enforce_eager: bool = False
    reasoning_parser: str = "none"
    tool_parser: str = "auto"
    speculative: dict[str, Any] | None = None   # vLLM's speculative_config (checked), None: off
    host: str = "127.0.0.1"
    port: int = 8000
    api_key_env: str | None = None
    allowed_origins: list[str] = field(default_factory=list)   # CORS; empty: none
    root_path: str | None = None            # the reverse proxy's path prefix (g906/server/root_path.py)
    force_include_usage: bool = False
    per_request_metrics: bool = False
    log_level: str = "info"
    access_log: bool = False
    env: dict[str, str] = field(default_factory=dict)
    # what resolve() could not settle: located one-line messages, and files that do not exist
    # (only with resolve(check_files=False); `g906 up` resolves with check_files=True)
    warnings: list[str] = field(default_factory=list)
    missing_files: list[Path] = field(default_factory=list)
    # a quantized HF checkpoint's scheme in words ("GPTQ (gptq): 4-bit, group 128, symmetric")
    quant_detail: str | None = None

    @property
    def images_enabled(self) -> bool:
        lim = self.mm_limits.get("image")
        return lim is not None and lim.count > 0

    def to_json(self) -> dict[str, Any]:
        out = asdict(self)
        out["recipe"] = self.recipe.model_dump(mode="json")
        for k, v in list(out.items()):
            if isinstance(v, Path):
                out[k] = str(v)
        out["model_files"] = [str(p) for p in self.model_files]
        out["missing_files"] = [str(p) for p in self.missing_files]
        return out
