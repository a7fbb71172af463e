"""ModelConfig: one description of a Qwen3.5 text model, built from an HF config.json
(Qwen3_5ForConditionalGeneration with text_config, or the text-only form) or from GGUF
metadata (g906/engine/loaders/gguf.py fills the same fields)."""

from __future__ import annotations

import json
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any, Literal

from g906.errors import G906Error


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

    def __post_init__(self) -> None:
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

    @classmethod
    def from_hf_dict(cls, cfg: dict[str, Any]) -> "ModelConfig":
        """From a parsed config.json (either the multimodal wrapper or a text config)."""
        top = cfg
        text = cfg.get("text_config", cfg)
        rope = dict(text.get("rope_parameters") or text.get("rope_scaling") or {})
        eos = text.get("eos_token_id", top.get("eos_token_id"))
        eos_ids = [] if eos is None else ([eos] if isinstance(eos, int) else list(eos))
        archs = top.get("architectures") or []
        try:
            return cls(
                vocab_size=text["vocab_size"],
                hidden_size=text["hidden_size"],
                intermediate_size=text["intermediate_size"],
                num_hidden_layers=text["num_hidden_layers"],
                num_attention_heads=text["num_attention_heads"],
                num_key_value_heads=text["num_key_value_heads"],
                head_dim=text.get("head_dim") or text["hidden_size"] // text["num_attention_heads"],
                rms_norm_eps=text.get("rms_norm_eps", 1e-6),
                rope_theta=rope.get("rope_theta", text.get("rope_theta", 10_000_000.0)),
                partial_rotary_factor=rope.get(
                    "partial_rotary_factor", text.get("partial_rotary_factor", 0.25)
                ),
                mrope_section=list(rope.get("mrope_section", [11, 11, 10])),
                mrope_interleaved=bool(rope.get("mrope_interleaved", True)),
                max_position_embeddings=text.get("max_position_embeddings", 262_144),
                layer_types=list(text.get("layer_types") or []) or [
                    "full_attention" if (i + 1) % text.get("full_attention_interval", 4) == 0 else "linear_attention"
                    for i in range(text["num_hidden_layers"])
                ],
                linear_conv_kernel_dim=text.get("linear_conv_kernel_dim", 4),
                linear_key_head_dim=text.get("linear_key_head_dim", 128),
                linear_value_head_dim=text.get("linear_value_head_dim", 128),
                linear_num_key_heads=text.get("linear_num_key_heads", 16),
                linear_num_value_heads=text.get("linear_num_value_heads", 32),
                tie_word_embeddings=bool(top.get("tie_word_embeddings", text.get("tie_word_embeddings", False))),
                num_mtp_layers=int(text.get("mtp_num_hidden_layers", 0) or 0),
                bos_token_id=text.get("bos_token_id", top.get("bos_token_id")),
                eos_token_ids=eos_ids,
                pad_token_id=text.get("pad_token_id", top.get("pad_token_id")),
                architecture=archs[0] if archs else "qwen35",
                image_token_id=top.get("image_token_id"),
                vision_start_token_id=top.get("vision_start_token_id"),
                vision_end_token_id=top.get("vision_end_token_id"),
            )
        except KeyError as exc:
            raise G906Error(f"model config.json lacks the key {exc.args[0]!r}") from None

    @classmethod
    def from_hf_dir(cls, path: str | Path) -> "ModelConfig":
        p = Path(path) / "config.json"
        return cls.from_hf_dict(read_json_object(p, missing="no config.json in the model directory"))


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
