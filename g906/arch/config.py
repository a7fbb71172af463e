"""ModelConfig: one description of a hybrid (Gated DeltaNet + full attention) text model. Each
architecture module of g906.arch fills it from an HF config.json or from GGUF metadata; the
engine builds the model from it, the recipe resolver and the doctor size memory and tensor
parallelism from it. Torch-free."""

from __future__ import annotations

import json
import logging
import math
from dataclasses import asdict, dataclass, field, replace
from pathlib import Path
from typing import Any, Literal

from g906.errors import G906Error

log = logging.getLogger(__name__)


_SIZE = 1 << 24
# upper bounds far beyond any real model; max_position_embeddings is bounded by bound_positions()
_INT_FIELDS = {
    "vocab_size": _SIZE, "hidden_size": _SIZE, "intermediate_size": _SIZE, "num_hidden_layers": 1 << 12,
    "num_attention_heads": 1 << 12, "num_key_value_heads": 1 << 12, "head_dim": 1 << 14,
    "max_position_embeddings": 1 << 62, "linear_conv_kernel_dim": 64, "linear_key_head_dim": 1 << 14,
    "linear_value_head_dim": 1 << 14, "linear_num_key_heads": 1 << 12, "linear_num_value_heads": 1 << 12,
}


@dataclass
class ModelConfig:
    vocab_size: int
    hidden_size: int
    intermediate_size: int
    num_hidden_layers: int              # main layers only (MTP layers are counted separately)
    num_attention_heads: int
    num_key_value_heads: int
    head_dim: int
    rms_norm_eps: float = 1e-6
    rope_theta: float = 10_000_000.0
    partial_rotary_factor: float = 0.25
    mrope_section: list[int] = field(default_factory=lambda: [11, 11, 10])
    mrope_interleaved: bool = True
    max_position_embeddings: int = 262_144
    layer_types: list[str] = field(default_factory=list)  # "linear_attention" | "full_attention"
    linear_conv_kernel_dim: int = 4
    linear_key_head_dim: int = 128
    linear_value_head_dim: int = 128
    linear_num_key_heads: int = 16
    linear_num_value_heads: int = 32
    # How value heads map to key heads in the linear-attention tensors: HF checkpoints group
    # them (v head j uses k head j // ratio); llama.cpp's GGUF converter reorders them so that
    # v head j uses k head j % num_k_heads ("tiled"). The model computes either way, so
    # quantized GGUF tensors never need re-blocking.
    linear_v_head_order: Literal["grouped", "tiled"] = "grouped"
    tie_word_embeddings: bool = False
    num_mtp_layers: int = 0             # multi-token-prediction blocks (kept loadable, not run)
    bos_token_id: int | None = None
    eos_token_ids: list[int] = field(default_factory=list)
    pad_token_id: int | None = None
    architecture: str = "qwen35"
    # multimodal token ids when the checkpoint has a vision tower (None for text-only)
    image_token_id: int | None = None
    vision_start_token_id: int | None = None
    vision_end_token_id: int | None = None
    # sparse MoE MLP (num_experts 0: a dense SwiGLU MLP of intermediate_size). Each token's
    # router picks num_experts_per_tok experts of moe_intermediate_size features (softmax over
    # all experts, top-k, renormalised when norm_topk_prob) and a shared expert of
    # shared_expert_intermediate_size features is added, scaled by sigmoid(its gate).
    num_experts: int = 0
    num_experts_per_tok: int = 0
    moe_intermediate_size: int = 0
    shared_expert_intermediate_size: int = 0
    norm_topk_prob: bool = True

    def __post_init__(self) -> None:
        self._check_values()
        if not self.layer_types:
            self.layer_types = [
                "full_attention" if (i + 1) % 4 == 0 else "linear_attention"
                for i in range(self.num_hidden_layers)
            ]
        if len(self.layer_types) != self.num_hidden_layers:
            raise G906Error(
                f"model config lists {len(self.layer_types)} layer types for {self.num_hidden_layers} layers"
            )
        if self.linear_num_value_heads % self.linear_num_key_heads:
            raise G906Error(
                f"linear_num_value_heads ({self.linear_num_value_heads}) is not a multiple of "
                f"linear_num_key_heads ({self.linear_num_key_heads})"
            )
        if self.num_experts and not 0 < self.num_experts_per_tok <= self.num_experts:
            raise G906Error(
                f"num_experts_per_tok ({self.num_experts_per_tok}) must be between 1 and "
                f"num_experts ({self.num_experts})"
            )

    @property
    def is_moe(self) -> bool:
        return self.num_experts > 0

    def _check_values(self) -> None:
        """Every size a positive integer in a sane range, every float finite and positive: a
        damaged config.json or GGUF header is named by field here, not by a division by zero or
        an impossible allocation later."""
        for name, hi in _INT_FIELDS.items():
            v = getattr(self, name)
            if isinstance(v, bool) or not isinstance(v, int) or not 1 <= v <= hi:
                raise G906Error(f"model config: {name} = {v!r} is not an integer from 1 to {hi}",
                                hint="the model's config is damaged or not a Qwen3.5 config")
        if isinstance(self.num_mtp_layers, bool) or not isinstance(self.num_mtp_layers, int) \
                or not 0 <= self.num_mtp_layers <= 64:
            raise G906Error(f"model config: mtp layers = {self.num_mtp_layers!r} is not an integer from 0 to 64")
        for name in ("rms_norm_eps", "rope_theta", "partial_rotary_factor"):
            v = getattr(self, name)
            if isinstance(v, bool) or not isinstance(v, (int, float)) or not math.isfinite(v) or v <= 0:
                raise G906Error(f"model config: {name} = {v!r} is not a positive number",
                                hint="the model's config is damaged")
        if self.partial_rotary_factor > 1:
            raise G906Error(f"model config: partial_rotary_factor = {self.partial_rotary_factor!r} is above 1")

    @property
    def rotary_dim(self) -> int:
        return int(self.head_dim * self.partial_rotary_factor)

    @property
    def full_attention_layers(self) -> list[int]:
        return [i for i, t in enumerate(self.layer_types) if t == "full_attention"]

    @property
    def linear_attention_layers(self) -> list[int]:
        return [i for i, t in enumerate(self.layer_types) if t == "linear_attention"]

    @property
    def linear_conv_dim(self) -> int:
        """Channels of the causal conv1d: q, k and v concatenated."""
        return 2 * self.linear_num_key_heads * self.linear_key_head_dim + (
            self.linear_num_value_heads * self.linear_value_head_dim
        )

    def to_json(self) -> dict[str, Any]:
        return asdict(self)


def read_json_object(p: Path, *, missing: str = "file not found") -> dict[str, Any]:
    """A JSON file that must hold an object (config.json and friends), with clear errors."""
    try:
        data = json.loads(p.read_text(encoding="utf-8"))
    except FileNotFoundError:
        raise G906Error(f"{p}: {missing}") from None
    except (OSError, UnicodeDecodeError, json.JSONDecodeError) as exc:
        raise G906Error(f"{p}: cannot read it: {exc}") from None
    if not isinstance(data, dict):
        raise G906Error(f"{p}: expected a JSON object")
    return data


# More positions than any model is trained for: a config claiming more is corrupt, and tables
# sized by it (rotary: rows x rotary_dim floats) could not be allocated
MAX_PLAUSIBLE_POSITIONS = 1 << 24


def bound_positions(config: ModelConfig, max_model_len: int | None, *, source: str = "the model") -> ModelConfig:
    """The config with max_position_embeddings set to max_model_len (what will be run): lowered,
    so nothing is sized by a larger (or absurd) value from the file; raised (with a warning:
    positions past the trained ones are extrapolated), so that the tables indexed by position
    (rotary) cover every position a sequence can reach, instead of failing the first sequence
    that runs past them. Without max_model_len, an implausible value is an error naming the
    field."""
    n = int(config.max_position_embeddings)
    if max_model_len is not None and n > int(max_model_len):
        return replace(config, max_position_embeddings=int(max_model_len))
    if max_model_len is not None and int(max_model_len) > n and 1 <= n:
        log.warning("%s: max_model_len %d exceeds the %d positions the model was trained for; positions past "
                    "them are extrapolated, and answers there may degrade", source, int(max_model_len), n)
        return replace(config, max_position_embeddings=int(max_model_len))
    if not 1 <= n <= MAX_PLAUSIBLE_POSITIONS:
        raise G906Error(f"{source}: the model config says max_position_embeddings = {n}, which is not a "
                        f"plausible context length (1 to {MAX_PLAUSIBLE_POSITIONS})",
                        hint="set limits.max_model_len in the recipe to the context you serve, or fix the config")
    return config
