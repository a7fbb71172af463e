"""Test helper: write a llama.cpp-style mmproj GGUF (arch `clip`, projector `qwen3vl_merger`)
from a tiny Hugging Face Qwen3_5ForConditionalGeneration, following what llama.cpp's converter
does for Qwen3.5 vision towers (conventions in docs/multimodal.md):

- metadata: general.type = mmproj; clip.has_vision_encoder; clip.projector_type =
  qwen3vl_merger; clip.use_gelu; clip.vision.{projection_dim (text hidden), image_size
  (sqrt(num_position_embeddings) * patch), patch_size, embedding_length, feed_forward_length,
  block_count, attention.head_count, attention.layer_norm_epsilon (the text rms eps),
  image_mean, image_std, spatial_merge_size};
- tensors: visual.patch_embed.proj.weight [out, C, 2, P, P] split into v.patch_embd.weight
  (temporal slice 0) and v.patch_embd.weight.1 (slice 1); merger.linear_fc1/2 -> mm.0 / mm.2,
  merger.norm -> v.post_ln; everything else through gguf-py's tensor map for MMPROJ
  (blocks.N.attn.qkv -> v.blk.N.attn_qkv, norm1/2 -> ln1/ln2, attn.proj -> attn_out,
  mlp.linear_fc1/2 -> ffn_up/ffn_down, pos_embed -> v.position_embd).

The main GGUF is written by tests/engine/gguf_writer.write_gguf (it drops the vision tensors).
"""

from __future__ import annotations

import json
import math
from collections.abc import Mapping
from pathlib import Path
from typing import Any

import numpy as np
import torch

from tests.engine.gguf_writer import load_hf


def _load(source: Any) -> tuple[dict[str, torch.Tensor], dict[str, Any], dict[str, Any]]:
    """load_hf's (state dict, config) plus the directory's preprocessor config ({} if none)."""
    sd, cfg = load_hf(source)
    pre = {}
    if isinstance(source, (str, Path)):
        pre_path = Path(source) / "preprocessor_config.json"
        if pre_path.is_file():
            pre = json.loads(pre_path.read_text())
    return sd, cfg, pre


def write_mmproj(
    source: Any,
    path: str | Path,
    *,
    qtype: str = "F32",
    preprocessor: Mapping[str, Any] | None = None,
    drop_tensors: tuple[str, ...] = (),
    metadata_overrides: Mapping[str, Any] | None = None,
    projector_type: str = "qwen3vl_merger",
) -> Path:
    """Write the mmproj GGUF of an HF Qwen3.5 multimodal model (object or directory).

    qtype: type of 2-D weights ("F32", "F16" or "Q8_0"); 1-D tensors and the patch/position
    embeddings stay F32. metadata_overrides: key -> value written instead (None deletes)."""
    import gguf

    sd, cfg, pre_file = _load(source)
    pre = {**pre_file, **(preprocessor or {})}
    v = cfg["vision_config"]
    text = cfg.get("text_config") or cfg
    depth = int(v["depth"])
    patch = int(v.get("patch_size", 16))
    image_size = int(math.isqrt(int(v.get("num_position_embeddings", 2304))) * patch)

    meta: dict[str, Any] = {
        "general.type": "mmproj",
        "general.name": "tiny-qwen35-vl-mmproj-test",
        "clip.has_vision_encoder": True,
        "clip.vision.projection_dim": int(text["hidden_size"]),
        "clip.vision.image_size": image_size,
        "clip.vision.patch_size": patch,
        "clip.vision.embedding_length": int(v["hidden_size"]),
        "clip.vision.feed_forward_length": int(v["intermediate_size"]),
        "clip.vision.block_count": depth,
        "clip.vision.attention.head_count": int(v["num_heads"]),
        "clip.vision.image_mean": [float(x) for x in pre.get("image_mean", [0.5, 0.5, 0.5])],
        "clip.vision.image_std": [float(x) for x in pre.get("image_std", [0.5, 0.5, 0.5])],
        "clip.projector_type": projector_type,
        "clip.use_gelu": True,
        "clip.vision.spatial_merge_size": int(v.get("spatial_merge_size", 2)),
        "clip.vision.attention.layer_norm_epsilon": float(text.get("rms_norm_eps", 1e-6)),
    }
    for k, val in (metadata_overrides or {}).items():
        if val is None:
            meta.pop(k, None)
        else:
            meta[k] = val

    w = gguf.GGUFWriter(path=None, arch="clip")
    for k, val in meta.items():
        if k == "general.architecture":
            continue
        if isinstance(val, bool):
            w.add_bool(k, val)
        elif isinstance(val, int):
            w.add_uint32(k, val)
        elif isinstance(val, float):
            w.add_float32(k, val)
        elif isinstance(val, str):
            w.add_string(k, val)
        else:
            w.add_array(k, list(val))
    w.add_file_type(gguf.LlamaFileType.ALL_F32 if qtype == "F32" else gguf.LlamaFileType.MOSTLY_F16)

    tmap = gguf.get_tensor_name_map(gguf.MODEL_ARCH.MMPROJ, depth)
    out: list[tuple[str, np.ndarray]] = []
    for name, t in sd.items():
        if name.startswith("model.visual."):
            name = "visual." + name[len("model.visual."):]
        if not name.startswith("visual."):
            continue
        arr = t.float().numpy()
        if name == "visual.patch_embed.proj.weight":
            assert arr.shape[2] == 2, "the converter only supports temporal_patch_size 2"
            out.append(("v.patch_embd.weight", arr[:, :, 0]))
            out.append(("v.patch_embd.weight.1", arr[:, :, 1]))
            continue
        if name == "visual.patch_embed.proj.bias":
            out.append(("v.patch_embd.bias", arr))
            continue
        if name.startswith("visual.merger."):
            suffix = name[len("visual.merger."):]
            if suffix.startswith("linear_fc1."):
                gname = "mm.0." + suffix.split(".", 1)[1]
            elif suffix.startswith("linear_fc2."):
                gname = "mm.2." + suffix.split(".", 1)[1]
            elif suffix.startswith("norm."):
                gname = "v.post_ln." + suffix.split(".", 1)[1]
            else:
                raise AssertionError(f"unexpected merger tensor {name}")
            out.append((gname, arr))
            continue
        gname = tmap.get_name(name, try_suffixes=(".weight", ".bias"))
        assert gname is not None, f"no GGUF name for {name}"
        out.append((gname, arr))

    for gname, arr in out:
        if gname in drop_tensors:
            continue
        arr = np.ascontiguousarray(arr, dtype=np.float32)
        keep_f32 = arr.ndim <= 1 or "patch_embd" in gname or "position_embd" in gname
        if qtype == "F32" or keep_f32:
            w.add_tensor(gname, arr)
        elif qtype == "F16":
            w.add_tensor(gname, arr.astype(np.float16))
        elif qtype == "Q8_0":
            q = gguf.quants.quantize(arr, gguf.GGMLQuantizationType.Q8_0)
            w.add_tensor(gname, q, raw_dtype=gguf.GGMLQuantizationType.Q8_0)
        else:
            raise AssertionError(f"qtype {qtype} is not supported by this helper")
    p = Path(path)
    w.write_header_to_file(path=p)
    w.write_kv_data_to_file()
    w.write_tensors_to_file()
    w.close()
    return p
