"""Vision weights from the two sources, with names relative to the HF `visual.` prefix:

- HF checkpoints: model.visual.* (or visual.*) tensors of the safetensors files;
- llama.cpp mmproj GGUF (arch clip, projector qwen3vl_merger), whose names map as
      v.patch_embd.weight / .weight.1   patch_embed.proj.weight[:, :, 0] / [:, :, 1] (Conv3d split
                                        into its two temporal slices)
      v.patch_embd.bias                 patch_embed.proj.bias
      v.position_embd.weight            pos_embed.weight
      v.blk.N.ln1 / ln2                 blocks.N.norm1 / norm2
      v.blk.N.attn_qkv                  blocks.N.attn.qkv
      v.blk.N.attn_out                  blocks.N.attn.proj
      v.blk.N.ffn_up / ffn_down         blocks.N.mlp.linear_fc1 / linear_fc2
      v.post_ln                         merger.norm
      mm.0 / mm.2                       merger.linear_fc1 / linear_fc2
  Tensors are stored in torch order (GGUF dims reversed); quantized ones are dequantized here
  (the tower computes densely).
"""

from __future__ import annotations

import json
import re
from collections.abc import Iterator
from pathlib import Path

import torch

from g906.engine.vision.config import VisionConfig
from g906.errors import G906Error

HF_PREFIXES = ("model.visual.", "visual.", "thinker.visual.")

_GGUF_BLOCK = {
    "ln1": "norm1", "ln2": "norm2", "attn_qkv": "attn.qkv", "attn_out": "attn.proj",
    "ffn_up": "mlp.linear_fc1", "ffn_down": "mlp.linear_fc2",
}
_GGUF_GLOBAL = {
    "v.patch_embd.bias": "patch_embed.proj.bias",
    "v.position_embd.weight": "pos_embed.weight",
    "v.post_ln.weight": "merger.norm.weight",
    "v.post_ln.bias": "merger.norm.bias",
    "mm.0.weight": "merger.linear_fc1.weight",
    "mm.0.bias": "merger.linear_fc1.bias",
    "mm.2.weight": "merger.linear_fc2.weight",
    "mm.2.bias": "merger.linear_fc2.bias",
}


def gguf_to_hf_name(name: str) -> str | None:
    """mmproj GGUF tensor name -> name relative to visual. (None for the patch-embedding slices,
    handled together, and for tensors the tower does not use)."""
    if name in _GGUF_GLOBAL:
        return _GGUF_GLOBAL[name]
    m = re.fullmatch(r"v\.blk\.(\d+)\.(\w+)\.(weight|bias)", name)
    if m and m.group(2) in _GGUF_BLOCK:
        return f"blocks.{m.group(1)}.{_GGUF_BLOCK[m.group(2)]}.{m.group(3)}"
    return None


# -------------------------------------------------------------------------------------------
# HF


def hf_vision_weights(path: str | Path) -> Iterator[tuple[str, torch.Tensor]]:
    """(name relative to visual., tensor) for the vision tensors of an HF model directory."""
    from safetensors import safe_open

    d = Path(path)
    index = d / "model.safetensors.index.json"
    files: dict[str, list[str]] = {}
    if index.is_file():
        try:
            weight_map = json.loads(index.read_text(encoding="utf-8"))["weight_map"]
        except (OSError, ValueError, KeyError, TypeError) as exc:
            raise G906Error(f"{index}: cannot read the shard index: {exc}") from None
        for name, fname in weight_map.items():
            if name.startswith(HF_PREFIXES):
                files.setdefault(fname, []).append(name)
    else:
        for f in sorted(d.glob("*.safetensors")):
            files[f.name] = []
    if not files:
        raise G906Error(f"{d}: no vision tensors (model.visual.*) in the checkpoint",
                        hint="the checkpoint has no vision tower; use a Qwen3.5 multimodal checkpoint")
    seen = 0
    for fname, names in files.items():
        fpath = d / fname
        try:
            with safe_open(str(fpath), framework="pt", device="cpu") as f:
                keys = names or [k for k in f.keys() if k.startswith(HF_PREFIXES)]
                present = set(f.keys())
                for k in keys:
                    if k not in present:
                        raise G906Error(f"{fpath}: tensor {k} is listed in the index but not in the file")
                    prefix = next(p for p in HF_PREFIXES if k.startswith(p))
                    seen += 1
                    yield k[len(prefix):], f.get_tensor(k)
        except G906Error:
            raise
        except Exception as exc:  # safetensors raises its own errors
            raise G906Error(f"{fpath}: cannot read vision tensors: {exc}") from None
    if not seen:
        raise G906Error(f"{d}: no vision tensors (model.visual.*) in the checkpoint",
                        hint="the checkpoint has no vision tower; use a Qwen3.5 multimodal checkpoint")


# -------------------------------------------------------------------------------------------
# mmproj GGUF


class MmprojFile:
    """A llama.cpp mmproj GGUF opened with the GGUF loader's reader (memory-mapped)."""

    def __init__(self, path: str | Path):
        from g906.engine.loaders.gguf import GGUFModelFile

        self.path = Path(path)
        self.file = GGUFModelFile(self.path)
        self._config: VisionConfig | None = None

    def metadata(self) -> dict:
        return {k: _plain(self.file.metadata[k]) for k in self.file.metadata}

    def config(self) -> VisionConfig:
        if self._config is None:
            self._config = VisionConfig.from_gguf_metadata(self.metadata(), self.file.tensor_names(),
                                                           source=str(self.path))
        return self._config

    def _dense(self, name: str) -> torch.Tensor:
        from g906.engine.weights import QuantizedTensor

        t = self.file.raw_tensor(name)
        if isinstance(t, QuantizedTensor):
            from g906.engine.quant.dequant import dequantize

            t = dequantize(t.data, t.qtype, t.shape)
        return t

    def weights(self) -> Iterator[tuple[str, torch.Tensor]]:
        names = self.file.tensor_names()
        cfg = self.config()
        if "v.patch_embd.weight" not in names:
            raise G906Error(f"{self.path}: tensor v.patch_embd.weight is missing",
                            hint="the file is not a complete Qwen3.5 mmproj")
        w0 = self._dense("v.patch_embd.weight")
        if w0.dim() != 4:
            raise G906Error(f"{self.path}: v.patch_embd.weight has shape {tuple(w0.shape)}, expected 4 dimensions")
        slices = [w0]
        if cfg.temporal_patch_size == 2:
            w1 = self._dense("v.patch_embd.weight.1")
            if w1.shape != w0.shape:
                raise G906Error(f"{self.path}: v.patch_embd.weight.1 {tuple(w1.shape)} does not match "
                                f"v.patch_embd.weight {tuple(w0.shape)}")
            slices.append(w1)
        yield "patch_embed.proj.weight", torch.stack([s.float() for s in slices], dim=2)
        for name in names:
            if name.startswith("v.patch_embd.weight"):
                continue
            hf = gguf_to_hf_name(name)
            if hf is None:
                if name.startswith(("v.deepstack.", "v.blk.", "mm.", "v.")):
                    raise G906Error(f"{self.path}: unexpected tensor {name} in the projector",
                                    hint="the file is not a Qwen3.5 (qwen3vl_merger) mmproj")
                continue
            yield hf, self._dense(name)


def _plain(v):
    if isinstance(v, (bytes, bytearray)):
        return v.decode("utf-8", "replace")
    if hasattr(v, "tolist"):
        return v.tolist()
    return v


def is_mmproj(path: str | Path) -> bool:
    from g906.binfmt.gguf import GGUFFile

    try:
        with open(path, "rb") as f:
            if f.read(4) != b"GGUF":
                return False
        with GGUFFile(path) as f:
            return f.architecture == "clip"
    except Exception:  # noqa: BLE001 - a damaged file is simply not a projector
        return False
