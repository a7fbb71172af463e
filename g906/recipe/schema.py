"""The recipe: one TOML file that declares a deployment. pydantic v2 models,
extra="forbid" everywhere so that a misspelt key is an error, not a silent default."""

from __future__ import annotations

import re
from typing import Annotated, Any, Literal, Union

from pydantic import (
    BaseModel,
    ConfigDict,
    Discriminator,
    Field,
    PrivateAttr,
    Tag,
    ValidationInfo,
    WithJsonSchema,
    field_validator,
    model_validator,
)

from g906.recipe.tokens import parse_token_count


class _Strict(BaseModel):
    model_config = ConfigDict(extra="forbid", validate_default=True)


# The JSON Schema of a token count: what an editor should accept (the model stores an int).
_TOKENS_JSON = {
    "anyOf": [
        {"type": "integer", "minimum": 1},
        {"type": "string", "pattern": r"^\s*[0-9]+\s*[kKmM]?\s*$"},
        {"type": "null"},
    ]
}
TokenCount = Annotated[int | None, WithJsonSchema(_TOKENS_JSON)]
_DEFAULT_MAX_JSON = {"anyOf": [*_TOKENS_JSON["anyOf"][:2], {"type": "string", "enum": ["context"]}, {"type": "null"}]}


class ModelSection(_Strict):
    source: str = Field(
        description="A GGUF file (the first shard of a split set), a Hugging Face model directory, a Hugging "
        "Face Hub id (org/name, org/name:REVISION, org/name:Q4_K_M for GGUF repos; read from the local HF cache, "
        "which `g906 pull` and `g906 up` fill), or builtin:<name> for a synthetic smoke-test model."
    )
    name: str | None = Field(
        None, min_length=1, description="Served model name (defaults to the file or directory name)."
    )
    mmproj: str = Field(
        "auto",
        min_length=1,
        description='Vision projector of a GGUF model: "auto" (an mmproj*.gguf beside the model, when there '
        'is exactly one), a path, or "none".',
    )
    dtype: Literal["auto", "float16", "bfloat16", "float32"] = Field(
        "auto", description="auto = float16 on gfx906, bfloat16/float16 on CUDA, float32 on CPU."
    )
    quantization: Literal["auto", "none", "gguf", "gptq", "awq", "compressed-tensors"] = Field(
        "auto", description="auto detects it from the model files (GGUF, or config.json's "
        "quantization_config: GPTQ, AWQ, compressed-tensors W4A16/W8A16); another value must agree "
        "with them."
    )
    chat_template: str | None = Field(
        None, min_length=1, description="Path to a Jinja chat template that overrides the model's."
    )

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
    max_model_len: TokenCount = Field(
        None,
        description='Context length in tokens: an integer or "32k"-style text (k = 1024). '
        "Defaults to the model's own context length.",
    )
    max_num_seqs: int = Field(16, ge=1, le=4096, description="Most sequences decoded together.")
    max_num_batched_tokens: TokenCount = Field(
        None, description='Most tokens in one engine step (bounds chunked prefill); an integer or "8k"-style text, '
        "at least max_num_seqs (a decode step takes one token per sequence). Unset: 2048, or max_num_seqs if larger."
    )
    gpu_memory_utilization: float = Field(
        0.9, gt=0.0, le=1.0, description="Fraction of each GPU's memory the engine may use."
    )
    default_max_tokens: Annotated[int | Literal["context"] | None, WithJsonSchema(_DEFAULT_MAX_JSON)] = Field(
        None,
        description="max_tokens of a chat request that sets none: a token count (\"2k\"-style text too), "
        "\"context\" (the rest of the context), or unset: the model's generation_config.json max_new_tokens "
        "(Hugging Face directories, as vLLM does), else the rest of the context.",
    )

    @field_validator("default_max_tokens", mode="before")
    @classmethod
    def _parse_default_max(cls, v):
        if v is None or v == "context":
            return v
        n = parse_token_count(v)
        if n < 1:
            raise ValueError(f"must be at least 1 token (or \"context\"), got {n}")
        return n

    @field_validator("max_model_len", mode="before")
    @classmethod
    def _parse_len(cls, v):
        if v is None:
            return v
        n = parse_token_count(v)
        if n < 16:
            raise ValueError(f"must be at least 16 tokens, got {n}")
        return n

    @field_validator("max_num_batched_tokens", mode="before")
    @classmethod
    def _parse_batched(cls, v):
        if v is None:
            return v
        n = parse_token_count(v)
        if n < 1:
            raise ValueError(f"must be at least 1 token, got {n}")
        return n


class MediaLimit(_Strict):
    count: int = Field(ge=0, le=64, description="Items per prompt (0 disables this modality).")
    width: int | None = Field(None, ge=1, le=16384, description="Largest width in pixels (set with height).")
    height: int | None = Field(None, ge=1, le=16384, description="Largest height in pixels (set with width).")


def _media_form(value: Any) -> str:
    return "<table>" if isinstance(value, (dict, MediaLimit)) else "<count>"


# Either a bare count or a table; the discriminator keeps errors to the form the user wrote.
# Tags start with "<" so that error locations can drop them (g906/recipe/load.py).
MediaLimitValue = Annotated[
    Union[
        Annotated[Annotated[int, Field(ge=0, le=64)], Tag("<count>")],
        Annotated[MediaLimit, Tag("<table>")],
    ],
    Discriminator(_media_form),
]


class ImageFetchSection(_Strict):
    allowed_hosts: list[Annotated[str, Field(min_length=1, max_length=253, pattern=r"^(\*|(\*\.)?[A-Za-z0-9_.:\[\]-]+)$")]] = Field(
        default_factory=list, max_length=256,
        description="Hosts that chat requests may name in http(s) image URLs: names, IP addresses, "
        "\"*.example.com\" (its subdomains) or \"*\" (any public host). Empty (the default): remote images are "
        "off and clients send images inline (data: URLs). Checked on every redirect too.")
    schemes: list[Literal["http", "https"]] = Field(
        default_factory=lambda: ["https"], min_length=1, description="URL schemes allowed for remote images.")
    allow_private_networks: bool = Field(
        False, description="Let allowed hosts resolve to private, loopback or link-local addresses (an image "
        "host on your own network). Off: such addresses are refused after DNS resolution.")
    timeout_s: float = Field(10.0, gt=0, le=300, description="Total time one fetch may take (DNS, connect, "
                             "redirects and every read together).")
    max_bytes: int = Field(20 * 1024 * 1024, ge=1024, le=1 << 30, description="Largest image a fetch may download.")
    max_concurrent: int = Field(16, ge=1, le=1024, description="Remote fetches in flight at once; more wait "
                                "(within their timeout).")


class MultimodalSection(_Strict):
    image: MediaLimitValue | None = Field(
        None, description="Images per prompt: a count, or {count, width, height} (as vLLM's --limit-mm-per-prompt). "
        "Unset or 0: images are off."
    )
    video: MediaLimitValue | None = Field(None, description="Videos per prompt, same forms as image.")
    image_fetch: ImageFetchSection = Field(
        default_factory=ImageFetchSection, description="Fetching http(s) image URLs named in requests (off by default).")


class VllmOptions(_Strict):
    python: str | None = Field(None, description="Interpreter whose vLLM to run (python -m vllm...).")
    executable: str | None = Field(None, description="Path of the vllm executable (default: found on PATH).")
    extra_args: list[str] = Field(default_factory=list, description="Extra `vllm serve` arguments, checked against its --help.")
    skip_mm_profiling: bool = Field(False, description="Pass --skip-mm-profiling (faster start for multimodal models).")
    use_modelscope: bool = Field(False, description="Set VLLM_USE_MODELSCOPE=1 (download from ModelScope).")
    gfx906_mobydick_awq: bool = Field(False, description="Set VLLM_ROCM_USE_GFX906_MOBYDICK_AWQ=1 (AWQ on gfx906 forks).")
    startup_timeout_s: float = Field(900.0, gt=0, description="Seconds to wait for vLLM to answer /health.")


class EmbeddedOptions(_Strict):
    block_size: int = Field(16, ge=1, le=1024, description="Tokens per paged KV-cache block.")
    cpu_kv_cache_gib: float = Field(1.0, gt=0, description="KV-cache budget when running on the CPU.")
    max_waiting_requests: int = Field(1024, ge=1, description="Queue bound; beyond it requests get 503.")
    # the engine's default (DEFAULT_PREFILL_GRAPH_TOKENS, g906/engine/model_runner.py: this module
    # does not import the engine; tests/engine/test_prefill_graphs.py checks that they agree)
    prefill_graph_tokens: int = Field(
        512, ge=0, description="Prefill steps of at most this many tokens replay CUDA/HIP graphs (0: all prefill "
        "eager; otherwise at least 16). Off under enforce_eager."
    )

    prefix_state_stride: int = Field(
        512, ge=0, description="With engine.prefix_caching: also keep the linear-attention state every this many "
        "tokens of a long prefill (rounded up to whole blocks; 0: only at prompt and sequence ends)."
    )
    prefix_snapshot_share: float = Field(
        0.1, ge=0, lt=1, description="With engine.prefix_caching: the part of the cache budget given to "
        "linear-attention state snapshots (at least two per max_num_seqs; the doctor's memory estimate counts it)."
    )

    @field_validator("prefill_graph_tokens")
    @classmethod
    def _graph_tokens(cls, v: int) -> int:
        if 0 < v < 16:       # the smallest prefill graph holds 16 tokens
            raise ValueError(f"must be 0 (off) or at least 16, not {v}")
        return v


class SpeculativeSection(_Strict):
    """vLLM's speculative_config as a table (the vLLM hand-off passes it as --speculative-config)."""
    method: str = Field(
        description="mtp: the model's own multi-token-prediction block (vLLM's model-specific names such as "
        "qwen3_next_mtp are accepted); ngram: prompt lookup (drafts what followed the last occurrence of the "
        "output's own suffix)."
    )
    num_speculative_tokens: int = Field(ge=1, le=16, description="Draft tokens verified per step (k).")
    prompt_lookup_min: int | None = Field(None, ge=1, description="ngram: shortest suffix that may match.")
    prompt_lookup_max: int | None = Field(None, ge=1, description="ngram: longest suffix, tried first.")

    @field_validator("method")
    @classmethod
    def _method(cls, v: str) -> str:
        from g906.arch.speculative import SpeculativeConfigError, normalise_method

        try:
            normalise_method(v)
        except SpeculativeConfigError as exc:
            raise ValueError(str(exc).split(": ", 1)[-1]) from None
        return v

    @model_validator(mode="after")
    def _consistent(self) -> "SpeculativeSection":
        from g906.arch.speculative import SpeculativeConfig, SpeculativeConfigError

        try:
            SpeculativeConfig.parse(self.model_dump(exclude_none=True))
        except SpeculativeConfigError as exc:
            raise ValueError(str(exc).replace("speculative_config.", "", 1)) from None
        return self

    def config(self):
        """The checked SpeculativeConfig (g906.arch.speculative)."""
        from g906.arch.speculative import SpeculativeConfig

        return SpeculativeConfig.parse(self.model_dump(exclude_none=True))


class EngineSection(_Strict):
    kind: Literal["embedded", "vllm"] = Field(
        "embedded", description="embedded = g906's own engine; vllm = hand over to an installed vLLM."
    )
    enforce_eager: bool = Field(False, description="Disable CUDA/HIP graphs (decode and prefill).")
    prefix_caching: bool = Field(
        True, description="Embedded engine: reuse the KV blocks and linear-attention state of prompt prefixes that "
        "earlier requests computed (docs/engine.md, Prefix caching). A vLLM handoff keeps vLLM's own setting "
        "(engine.vllm.extra_args)."
    )
    reasoning_parser: Literal["none", "auto", "qwen3"] = Field(
        "none", description="qwen3 splits <think>...</think> into reasoning_content; auto: the model "
        "architecture's own parser (qwen3 for Qwen3.5)."
    )
    speculative: SpeculativeSection | None = Field(
        None, description="Speculative decoding (vLLM's speculative_config): the MTP head or n-gram lookup."
    )
    embedded: EmbeddedOptions = Field(default_factory=EmbeddedOptions, description="Options of the embedded engine.")
    vllm: VllmOptions = Field(default_factory=VllmOptions, description="Options of the vLLM handoff.")


class ServerSection(_Strict):
    host: str = Field("127.0.0.1", min_length=1, description="Address to listen on (0.0.0.0 for every interface).")
    port: int = Field(8000, ge=1, le=65535, description="TCP port of the OpenAI-compatible API.")
    api_key_env: str | None = Field(None, description="Name of the environment variable that holds the API key.")
    header_timeout_s: float = Field(10.0, gt=0, le=3600, description="A connection must complete a request's "
                                    "headers within this many seconds of opening (or of its previous answer), or "
                                    "it is closed.")
    body_timeout_s: float = Field(60.0, gt=0, le=3600, description="Seconds a client has to send a whole request "
                                  "body; slower ones get 408.")
    max_connections: int = Field(2048, ge=1, le=1_000_000, description="Connections and requests in progress at "
                                 "once; beyond it new requests get 503 (uvicorn's limit_concurrency).")
    max_stored_responses: int = Field(1000, ge=1, le=1_000_000, description="Responses API: stored responses "
                                      "kept in memory (store=true, the default); beyond it the least recently used "
                                      "are dropped. Each holds its conversation's text.")
    allowed_origins: list[Annotated[str, Field(min_length=1)]] = Field(
        default_factory=list,
        description='Origins whose browsers may call the API (CORS), e.g. ["http://localhost:3000"] or ["*"]. '
        "Empty: no CORS headers.",
    )
    log_level: Literal["debug", "info", "warning", "error", "critical"] = Field(
        "info", description="Log level of the server's messages (debug also shows the HTTP server's own)."
    )
    access_log: bool = Field(False, description="Log one line per HTTP request (method, path, status).")
    root_path: str | None = Field(
        None, description='The path prefix a reverse proxy serves the API under, e.g. "/llm" (vLLM\'s '
        "--root-path): both /llm/v1/... and /v1/... are served, and links the server writes carry the prefix."
    )
    force_include_usage: bool = Field(
        False, description="Every streamed chunk carries usage, as if each request had sent stream_options "
        "{include_usage, continuous_usage_stats} (vLLM's --enable-force-include-usage)."
    )
    per_request_metrics: bool = Field(
        False, description="Answers carry a `metrics` object: time to first token, queue time, generation time, "
        "inter-token latency, tokens per second (vLLM's --enable-per-request-metrics)."
    )
    tool_parser: Literal["auto", "none", "qwen3_coder"] = Field(
        "auto", description="How tool calls are read from answers to requests with tools: qwen3_coder "
        "(Qwen3.5's <tool_call><function=...> XML); auto: the model architecture's own (qwen3_coder for "
        "Qwen3.5); none: answers stay text and tool_choice required / named are refused."
    )

    @field_validator("root_path")
    @classmethod
    def _root_path(cls, v: str | None) -> str | None:
        if v is None:
            return v
        v = v.rstrip("/")
        if not v:
            return None          # "/" is no prefix
        if not v.startswith("/") or any(c in v for c in "?#% ") or "//" in v:
            raise ValueError(f"{v!r} is not a URL path prefix: write it as \"/llm\" (a leading slash, "
                             "no query, no spaces)")
        return v

    @field_validator("api_key_env")
    @classmethod
    def _env_name(cls, v: str | None) -> str | None:
        if v is not None and not re.fullmatch(r"[A-Za-z_][A-Za-z0-9_]*", v):
            raise ValueError(f"{v!r} is not a valid environment variable name")
        return v


class Recipe(_Strict):
    """A g906 deployment: which model, on which GPUs, with which limits, served where."""

    model_config = ConfigDict(extra="forbid", validate_default=True, title="g906 recipe")

    model: ModelSection = Field(description="The model to serve.")
    parallel: ParallelSection = Field(default_factory=ParallelSection, description="GPUs and tensor parallelism.")
    limits: LimitsSection = Field(default_factory=LimitsSection, description="Context, batch and memory limits.")
    multimodal: MultimodalSection = Field(
        default_factory=MultimodalSection, description="Per-prompt image and video limits."
    )
    engine: EngineSection = Field(default_factory=EngineSection, description="Which engine runs the model, and its options.")
    server: ServerSection = Field(default_factory=ServerSection, description="The OpenAI-compatible HTTP server.")
    env: dict[str, str] = Field(
        default_factory=dict,
        description="Extra environment variables for the engine processes (string values).",
        json_schema_extra={"propertyNames": {"pattern": "^[A-Za-z_][A-Za-z0-9_]*$"}},
    )

    # Where the recipe came from (set by g906.recipe.load): path, text and key positions,
    # so that resolve() can point at lines too. Not part of the data.
    _origin: Any = PrivateAttr(default=None)

    @model_validator(mode="after")
    def _cross_fields(self, info: ValidationInfo) -> "Recipe":
        # The loader runs the same checks itself, with line numbers (context skip_cross_fields).
        if info.context and info.context.get("skip_cross_fields"):
            return self
        from g906.recipe.checks import cross_field_problems

        problems = cross_field_problems(self.model_dump(exclude_none=False))
        if problems:
            raise ValueError("; ".join(p.message for p in problems))
        return self
