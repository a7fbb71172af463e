"""The recipe: one TOML file that declares a deployment. pydantic v2 models,
extra="forbid" everywhere so that a misspelt key is an error, not a silent default."""

from __future__ import annotations

import re
from typing import Annotated, Literal, Union

from pydantic import BaseModel, ConfigDict, Field, field_validator, model_validator


class _Strict(BaseModel):
    model_config = ConfigDict(extra="forbid", validate_default=True)


_LEN_RE = re.compile(r"^\s*(\d+)\s*([kKmM]?)\s*$")


def parse_token_count(value: int | str) -> int:
    """128, "8k", "32K" -> tokens (k = 1024, as vLLM and llama.cpp users write it)."""
    if isinstance(value, bool):
        raise ValueError("expected a whole number of tokens or a string such as \"32k\"")
    if isinstance(value, int):
        return value
    if isinstance(value, str):
        m = _LEN_RE.match(value)
        if m:
            scale = {"": 1, "k": 1024, "m": 1024 * 1024}[m.group(2).lower()]
            return int(m.group(1)) * scale
    raise ValueError(f"expected a whole number of tokens or a string such as \"32k\", got {value!r}")


class ModelSection(_Strict):
    source: str = Field(
        description="A GGUF file (the first shard of a split set), a Hugging Face model directory, "
        "or builtin:<name> for a synthetic smoke-test model."
    )
    name: str | None = Field(None, description="Served model name (defaults to the source's stem).")
    mmproj: str = Field("auto", description='"auto" (find mmproj-*.gguf beside a GGUF), a path, or "none".')
    dtype: Literal["auto", "float16", "bfloat16", "float32"] = Field(
        "auto", description="auto = float16 on gfx906, bfloat16/float16 on CUDA, float32 on CPU."
    )
    quantization: Literal["auto", "none", "gguf", "gptq", "awq"] = Field(
        "auto", description="auto detects it from the model files."
    )
    chat_template: str | None = Field(None, description="Path to a Jinja chat template that overrides the model's.")

    @field_validator("source")
    @classmethod
    def _source_not_empty(cls, v: str) -> str:
        if not v.strip():
            raise ValueError("must not be empty")
        return v


class ParallelSection(_Strict):
    tensor_parallel_size: int = Field(1, ge=1, le=64, description="Number of GPUs one model is split over.")
    devices: list[Annotated[int, Field(ge=0)]] | None = Field(
        None, description="GPU indices to use (HIP_VISIBLE_DEVICES); length must equal tensor_parallel_size."
    )
    rccl: str | None = Field(
        None, description="A gfx906 RCCL package (tarball, directory or .so) that `g906 up` may install for TP>1."
    )


class LimitsSection(_Strict):
    max_model_len: int | None = Field(
        None, description='Context length in tokens: an integer or "32k"-style text (defaults to the model\'s).'
    )
    max_num_seqs: int = Field(16, ge=1, le=4096, description="Most sequences decoded together.")
    max_num_batched_tokens: int | None = Field(
        None, ge=1, description="Most tokens in one engine step (bounds chunked prefill)."
    )
    gpu_memory_utilization: float = Field(
        0.9, gt=0.0, le=1.0, description="Fraction of each GPU's memory the engine may use."
    )

    @field_validator("max_model_len", mode="before")
    @classmethod
    def _parse_len(cls, v):
        if v is None:
            return v
        n = parse_token_count(v)
        if n < 16:
            raise ValueError(f"must be at least 16 tokens, got {n}")
        return n


class MediaLimit(_Strict):
    count: int = Field(ge=0, le=64)
    width: int | None = Field(None, ge=1, le=16384)
    height: int | None = Field(None, ge=1, le=16384)


MediaLimitValue = Union[Annotated[int, Field(ge=0, le=64)], MediaLimit]


class MultimodalSection(_Strict):
    image: MediaLimitValue | None = Field(
        None, description="Images per prompt: a count, or {count, width, height} (as vLLM's --limit-mm-per-prompt)."
    )
    video: MediaLimitValue | None = Field(None, description="Videos per prompt, same forms as image.")


class VllmOptions(_Strict):
    python: str | None = Field(None, description="Interpreter whose vLLM to run (python -m vllm...).")
    executable: str | None = Field(None, description="Path of the vllm executable (default: found on PATH).")
    extra_args: list[str] = Field(default_factory=list, description="Extra `vllm serve` arguments, checked against its --help.")
    skip_mm_profiling: bool = False
    use_modelscope: bool = False
    gfx906_mobydick_awq: bool = Field(False, description="Set VLLM_ROCM_USE_GFX906_MOBYDICK_AWQ=1 (AWQ on gfx906 forks).")
    startup_timeout_s: float = Field(900.0, gt=0)


class EmbeddedOptions(_Strict):
    block_size: int = Field(16, ge=1, le=1024, description="Tokens per paged KV-cache block.")
    cpu_kv_cache_gib: float = Field(1.0, gt=0, description="KV-cache budget when running on the CPU.")
    max_waiting_requests: int = Field(1024, ge=1, description="Queue bound; beyond it requests get 503.")


class EngineSection(_Strict):
    kind: Literal["embedded", "vllm"] = "embedded"
    enforce_eager: bool = Field(False, description="Disable decode graphs.")
    reasoning_parser: Literal["none", "qwen3"] = Field(
        "none", description="qwen3 splits <think>...</think> into reasoning_content."
    )
    embedded: EmbeddedOptions = Field(default_factory=EmbeddedOptions)
    vllm: VllmOptions = Field(default_factory=VllmOptions)


class ServerSection(_Strict):
    host: str = "127.0.0.1"
    port: int = Field(8000, ge=1, le=65535)
    api_key_env: str | None = Field(None, description="Name of the environment variable that holds the API key.")

    @field_validator("api_key_env")
    @classmethod
    def _env_name(cls, v: str | None) -> str | None:
        if v is not None and not re.fullmatch(r"[A-Za-z_][A-Za-z0-9_]*", v):
            raise ValueError(f"{v!r} is not a valid environment variable name")
        return v


class Recipe(_Strict):
    model: ModelSection
    parallel: ParallelSection = Field(default_factory=ParallelSection)
    limits: LimitsSection = Field(default_factory=LimitsSection)
    multimodal: MultimodalSection = Field(default_factory=MultimodalSection)
    engine: EngineSection = Field(default_factory=EngineSection)
    server: ServerSection = Field(default_factory=ServerSection)
    env: dict[str, str] = Field(default_factory=dict, description="Extra environment variables for the engine processes.")

    @model_validator(mode="after")
    def _cross_fields(self) -> "Recipe":
        devices = self.parallel.devices
        if devices is not None:
            if len(set(devices)) != len(devices):
                raise ValueError(f"parallel.devices lists a device twice: {devices}")
            if len(devices) != self.parallel.tensor_parallel_size:
                raise ValueError(
                    f"parallel.devices has {len(devices)} entries but parallel.tensor_parallel_size is "
                    f"{self.parallel.tensor_parallel_size}; they must match"
                )
        lim = self.limits
        if lim.max_num_batched_tokens is not None and lim.max_model_len is not None:
            pass  # chunked prefill lets max_num_batched_tokens be smaller than max_model_len
        for key in self.env:
            if not re.fullmatch(r"[A-Za-z_][A-Za-z0-9_]*", key):
                raise ValueError(f"env key {key!r} is not a valid environment variable name")
        return self
