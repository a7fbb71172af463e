"""VisionConfig: the Qwen3.5 vision tower and its image preprocessing, from an HF config.json
(+ preprocessor_config.json) or from the metadata of a llama.cpp mmproj GGUF (arch `clip`,
projector `qwen3vl_merger`).

Facts this relies on (transformers' Qwen3_5VisionConfig, llama.cpp's converter):
- HF: vision_config {depth, hidden_size, intermediate_size, num_heads, in_channels, patch_size,
  temporal_patch_size, spatial_merge_size, out_hidden_size, num_position_embeddings,
  hidden_act}; the rotary is axial with theta 10000; LayerNorm eps is 1e-6.
- mmproj GGUF: clip.vision.{block_count, embedding_length, feed_forward_length,
  attention.head_count, patch_size, image_size (= sqrt(num_position_embeddings) * patch),
  projection_dim (= text hidden size), spatial_merge_size, image_mean, image_std}; the
  temporal patch is implied by the two patch-embedding slices (v.patch_embd.weight, .weight.1).
"""

from __future__ import annotations

import math
from collections.abc import Mapping
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

from g906.arch.config import read_json_object
from g906.errors import G906Error

# Qwen3-VL / Qwen3.5 processor defaults (preprocessor_config.json of the released checkpoints)
DEFAULT_MIN_PIXELS = 65_536
DEFAULT_MAX_PIXELS = 16_777_216
DEFAULT_MEAN = (0.5, 0.5, 0.5)
DEFAULT_STD = (0.5, 0.5, 0.5)

PROJECTOR_TYPE = "qwen3vl_merger"


@dataclass
class VisionConfig:
    depth: int
    hidden_size: int
    intermediate_size: int
    num_heads: int
    out_hidden_size: int                 # the text model's hidden size
    num_position_embeddings: int
    patch_size: int = 16
    temporal_patch_size: int = 2
    spatial_merge_size: int = 2
    in_channels: int = 3
    hidden_act: str = "gelu_pytorch_tanh"
    layer_norm_eps: float = 1e-6
    rope_theta: float = 10_000.0
    # preprocessing
    image_mean: tuple[float, ...] = DEFAULT_MEAN
    image_std: tuple[float, ...] = DEFAULT_STD
    min_pixels: int = DEFAULT_MIN_PIXELS
    max_pixels: int = DEFAULT_MAX_PIXELS
    source: str = ""                     # where it came from (for messages)
    extra: dict[str, Any] = field(default_factory=dict)

    def __post_init__(self) -> None:
        where = f"{self.source}: " if self.source else ""
        if self.hidden_size % self.num_heads:
            raise G906Error(f"{where}vision hidden size {self.hidden_size} is not a multiple of its "
                            f"{self.num_heads} heads")
        if (self.hidden_size // self.num_heads) % 4:
            raise G906Error(f"{where}vision head dim {self.hidden_size // self.num_heads} is not a multiple of 4 "
                            "(the 2-D rotary splits it in four)")
        side = math.isqrt(self.num_position_embeddings)
        if side * side != self.num_position_embeddings:
            raise G906Error(f"{where}num_position_embeddings {self.num_position_embeddings} is not a square")
        if self.temporal_patch_size < 1 or self.patch_size < 1 or self.spatial_merge_size < 1:
            raise G906Error(f"{where}patch sizes must be positive")
        if not 0 < self.min_pixels <= self.max_pixels:
            raise G906Error(f"{where}image min/max pixels {self.min_pixels}/{self.max_pixels} are inconsistent")

    # ------------------------------------------------------------------ derived

    @property
    def head_dim(self) -> int:
        return self.hidden_size // self.num_heads

    @property
    def num_grid_per_side(self) -> int:
        return math.isqrt(self.num_position_embeddings)

    @property
    def factor(self) -> int:
        """Image sides are resized to multiples of this (patch x merge)."""
        return self.patch_size * self.spatial_merge_size

    @property
    def merge_unit(self) -> int:
        return self.spatial_merge_size * self.spatial_merge_size

    @property
    def patch_dim(self) -> int:
        """Values per flattened patch: channels x temporal x patch x patch."""
        return self.in_channels * self.temporal_patch_size * self.patch_size * self.patch_size

    def to_json(self) -> dict[str, Any]:
        d = asdict(self)
        d["image_mean"] = list(self.image_mean)
        d["image_std"] = list(self.image_std)
        return d

    # ------------------------------------------------------------------ constructors

    @classmethod
    def from_hf_dict(cls, cfg: Mapping[str, Any], preprocessor: Mapping[str, Any] | None = None,
                     source: str = "config.json") -> VisionConfig:
        """From a parsed config.json of a Qwen3_5ForConditionalGeneration (vision_config inside)."""
        v = cfg.get("vision_config")
        if not isinstance(v, Mapping):
            raise G906Error(f"{source}: the model has no vision_config (not a multimodal checkpoint)",
                            hint="images need a Qwen3.5 checkpoint with a vision tower, or a GGUF with its mmproj file")
        text = cfg.get("text_config") or cfg
        if v.get("deepstack_visual_indexes"):
            raise G906Error(f"{source}: the vision tower uses deepstack layers (a Qwen3-VL checkpoint), "
                            "which the Qwen3.5 text model does not take")
        rope = v.get("rope_parameters") or v.get("rope_scaling") or {}
        pre = dict(preprocessor or {})
        size = pre.get("size") or {}
        kw: dict[str, Any] = {}
        try:
            kw = dict(
                depth=int(v["depth"]),
                hidden_size=int(v["hidden_size"]),
                intermediate_size=int(v["intermediate_size"]),
                num_heads=int(v["num_heads"]),
                out_hidden_size=int(v.get("out_hidden_size") or text["hidden_size"]),
                num_position_embeddings=int(v.get("num_position_embeddings", 2304)),
                patch_size=_int(v.get("patch_size", 16)),
                temporal_patch_size=_int(v.get("temporal_patch_size", 2)),
                spatial_merge_size=int(v.get("spatial_merge_size", 2)),
                in_channels=int(v.get("in_channels", 3)),
                hidden_act=str(v.get("hidden_act", "gelu_pytorch_tanh")),
                rope_theta=float(rope.get("rope_theta", 10_000.0)),
            )
        except KeyError as exc:
            raise G906Error(f"{source}: vision_config lacks the key {exc.args[0]!r}") from None
        except (TypeError, ValueError) as exc:
            raise G906Error(f"{source}: vision_config has a bad value: {exc}") from None
        if pre:
            for key, pkey in (("patch_size", "patch_size"), ("temporal_patch_size", "temporal_patch_size"),
                              ("spatial_merge_size", "merge_size")):
                if pkey in pre and int(pre[pkey]) != kw[key]:
                    raise G906Error(f"{source}: preprocessor_config.json says {pkey} = {pre[pkey]} but the "
                                    f"vision config says {kw[key]}")
            kw["image_mean"] = tuple(float(x) for x in pre.get("image_mean", DEFAULT_MEAN))
            kw["image_std"] = tuple(float(x) for x in pre.get("image_std", DEFAULT_STD))
            kw["min_pixels"] = int(size.get("shortest_edge") or pre.get("min_pixels") or DEFAULT_MIN_PIXELS)
            kw["max_pixels"] = int(size.get("longest_edge") or pre.get("max_pixels") or DEFAULT_MAX_PIXELS)
        return cls(source=source, **kw)

    @classmethod
    def from_hf_dir(cls, path: str | Path) -> VisionConfig:
        d = Path(path)
        cfg = read_json_object(d / "config.json")
        pre_path = d / "preprocessor_config.json"
        pre = read_json_object(pre_path) if pre_path.is_file() else None
        return cls.from_hf_dict(cfg, pre, source=str(d / "config.json"))

    @classmethod
    def from_gguf_metadata(cls, md: Mapping[str, Any], tensor_names: set[str] | list[str],
                           source: str = "mmproj") -> VisionConfig:
        """From the metadata (plain values) and tensor names of an mmproj GGUF."""
        arch = md.get("general.architecture")
        if arch != "clip":
            raise G906Error(f"{source}: not a vision projector (general.architecture = {arch!r}, expected 'clip')",
                            hint="model.mmproj must name the mmproj-*.gguf file that came with the model")
        if md.get("clip.has_vision_encoder") is False:
            raise G906Error(f"{source}: the projector file has no vision encoder (audio only?)")
        ptype = md.get("clip.vision.projector_type", md.get("clip.projector_type"))
        if ptype != PROJECTOR_TYPE:
            raise G906Error(f"{source}: projector type {ptype!r} is not {PROJECTOR_TYPE!r} (Qwen3.5's)",
                            hint="use the mmproj file converted from the same Qwen3.5 checkpoint as the model")
        deep = md.get("clip.vision.is_deepstack_layers")
        if deep is not None and any(bool(x) for x in _as_list(deep)):
            raise G906Error(f"{source}: the projector has deepstack layers (a Qwen3-VL mmproj), which the "
                            "Qwen3.5 text model does not take")

        def need(key: str) -> Any:
            if key not in md:
                raise G906Error(f"{source}: mmproj metadata lacks {key}",
                                hint="the file was not written by llama.cpp's converter for Qwen3.5")
            return md[key]

        names = set(tensor_names)
        patch = int(need("clip.vision.patch_size"))
        image_size = int(need("clip.vision.image_size"))
        side = image_size // patch
        temporal = 2 if "v.patch_embd.weight.1" in names else 1
        mean = md.get("clip.vision.image_mean")
        std = md.get("clip.vision.image_std")
        kw: dict[str, Any] = dict(
            depth=int(need("clip.vision.block_count")),
            hidden_size=int(need("clip.vision.embedding_length")),
            intermediate_size=int(need("clip.vision.feed_forward_length")),
            num_heads=int(need("clip.vision.attention.head_count")),
            out_hidden_size=int(need("clip.vision.projection_dim")),
            num_position_embeddings=side * side,
            patch_size=patch,
            temporal_patch_size=temporal,
            spatial_merge_size=int(md.get("clip.vision.spatial_merge_size", 2)),
            image_mean=tuple(float(x) for x in _as_list(mean)) if mean is not None else DEFAULT_MEAN,
            image_std=tuple(float(x) for x in _as_list(std)) if std is not None else DEFAULT_STD,
        )
        if md.get("clip.vision.image_min_pixels") is not None:
            kw["min_pixels"] = int(md["clip.vision.image_min_pixels"])
        if md.get("clip.vision.image_max_pixels") is not None:
            kw["max_pixels"] = int(md["clip.vision.image_max_pixels"])
        return cls(source=source, **kw)


def _int(v: Any) -> int:
    if isinstance(v, (list, tuple)):
        if len(set(v)) != 1:
            raise G906Error(f"non-square patch sizes {v} are not supported")
        v = v[0]
    return int(v)


def _as_list(v: Any) -> list:
    if isinstance(v, (list, tuple)):
        return list(v)
    try:
        return list(v.tolist())
    except AttributeError:
        return [v]
