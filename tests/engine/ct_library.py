"""Int4 checkpoints written by compressed-tensors itself (the format library llm-compressor saves
with; llm-compressor and gptqmodel do not install here), from a tiny random transformers model:

  the model is cast to bfloat16 (as the releases are quantized), a W4A16 QuantizationConfig is
  applied with the library's apply_quantization_config, every quantized module gets min-max
  scales / zero points per group from the library's calculate_qparams (llm-compressor's
  minmax observer without calibration data), ModelCompressor compresses the model
  (pack-quantized), save_pretrained writes the tensors and update_config the
  quantization_config, exactly as llm-compressor's save does.

The reference transformers model (float32) gets the library's own decompression of those
tensors (the bf16 scales widened to float32 first, so (q - z) * s is not rounded to bf16).

MoE (qwen3_5_moe): transformers holds the routed experts fused in one Qwen3_5MoeExperts module,
which no Linear target matches; llm-compressor calibrates such models through per-expert Linear
modules (mlp.experts.<e>.{gate,up,down}_proj, the names the Hub checkpoints use), and so does
this: the fused experts are split into Linear modules before quantizing and fused back into the
reference from the decompressed weights."""

from __future__ import annotations

import copy
import json
from pathlib import Path

import torch

from compressed_tensors.compressors import ModelCompressor
from compressed_tensors.quantization import (
    QuantizationArgs,
    QuantizationConfig,
    apply_quantization_config,
    preset_name_to_scheme,
)
from compressed_tensors.quantization.utils import calculate_qparams

FUSED = ("mlp.experts.gate_up_proj", "mlp.experts.down_proj")


class _Expert(torch.nn.Module):
    def __init__(self, gate_up: torch.Tensor, down: torch.Tensor):
        super().__init__()
        inter, hidden = down.shape[1], down.shape[0]
        kw = dict(bias=False, dtype=down.dtype)         # the model's dtype: the scales follow it
        self.gate_proj = torch.nn.Linear(hidden, inter, **kw)
        self.up_proj = torch.nn.Linear(hidden, inter, **kw)
        self.down_proj = torch.nn.Linear(inter, hidden, **kw)
        self.gate_proj.weight.data.copy_(gate_up[:inter])
        self.up_proj.weight.data.copy_(gate_up[inter:])
        self.down_proj.weight.data.copy_(down)


def _split_experts(model) -> list[str]:
    """Replace every fused experts module by a ModuleList of per-expert Linear modules; their
    names."""
    names = []
    for name, mod in list(model.named_modules()):
        fused = hasattr(mod, "gate_up_proj") and hasattr(mod, "down_proj")
        if fused and name.endswith("mlp.experts"):
            parent = model.get_submodule(name.rsplit(".", 1)[0])
            E = mod.gate_up_proj.shape[0]
            parent.experts = torch.nn.ModuleList(
                _Expert(mod.gate_up_proj.data[e], mod.down_proj.data[e]) for e in range(E))
            names.append(name)
    return names


def _minmax_qparams(model) -> int:
    """Per-group min-max scales / zero points for every module the config quantized; how many."""
    n = 0
    for _, mod in model.named_modules():
        scheme = getattr(mod, "quantization_scheme", None)
        if scheme is None or scheme.weights is None:
            continue
        args = scheme.weights
        w = mod.weight.data
        gs = w.shape[-1] if args.group_size in (None, -1) else args.group_size
        groups = w.unflatten(-1, (w.shape[-1] // gs, gs))
        scale, zp = calculate_qparams(groups.amin(-1), groups.amax(-1), args)
        mod.weight_scale.data.copy_(scale.reshape(mod.weight_scale.shape))
        if hasattr(mod, "weight_zero_point"):
            mod.weight_zero_point.data.copy_(zp.reshape(mod.weight_zero_point.shape))
        n += 1
    return n


def quantize_with_compressed_tensors(model, d: Path, *, preset: str, ignore: list[str],
                                     group_size: int | None = None, more: tuple = (),
                                     fmt: str | None = "pack-quantized",
                                     max_shard_size: str | None = None):
    """Write d (config.json with the library's quantization_config, model.safetensors with its
    tensors) from a copy of model. The library's preset scheme (W4A16: symmetric groups of 128;
    W4A16_ASYM: with zero points; group_size narrows the groups for the tiny shapes, -1 asks
    for the channel strategy) goes on every Linear but the ignored ones, and each
    (preset, targets, group_size) of more on the modules its targets name (a named target wins
    over "Linear"). fmt: the format the compressor is forced to; None lets the library infer
    it from the scheme (int-quantized, float-quantized, nvfp4-pack-quantized, ...).
    max_shard_size: save_pretrained's (dense models), for a sharded directory.
    Returns (reference float32 model holding the library-decompressed weights, the number of
    quantized modules)."""
    ref = copy.deepcopy(model).to(torch.float32)
    work = copy.deepcopy(model).to(torch.bfloat16)
    fused = _split_experts(work)
    groups = {}
    for i, (name, targets, gs) in enumerate(((preset, ["Linear"], group_size), *more)):
        scheme = preset_name_to_scheme(name, targets)
        if gs == -1:             # one scale per output row
            scheme.weights = QuantizationArgs(**{**scheme.weights.model_dump(), "strategy": "channel",
                                                 "group_size": None})
        elif gs is not None and scheme.weights.group_size is not None:
            scheme.weights = scheme.weights.model_copy(update={"group_size": gs})
        groups[f"group_{i}"] = scheme
    config = QuantizationConfig(config_groups=groups, ignore=ignore)
    apply_quantization_config(work, config, show_progress=False)
    n = _minmax_qparams(work)
    compressor = ModelCompressor.from_pretrained_model(work, quantization_format=fmt)
    compressor.compress_model(work)
    d.mkdir(parents=True, exist_ok=True)
    if fused:
        # transformers' save would map the fused experts' names; the per-expert Linear modules
        # already carry the Hub names, so their state dict is written as it is
        from safetensors.torch import save_file

        sd = {k: v.contiguous() for k, v in work.state_dict().items()}
        save_file(sd, str(d / "model.safetensors"), metadata={"format": "pt"})
        work.config.save_pretrained(d)
    else:
        work.save_pretrained(d, **({"max_shard_size": max_shard_size} if max_shard_size else {}))
    compressor.update_config(str(d))

    work.to(torch.float32)             # packed ints stay ints; bf16 scales widen exactly
    compressor.decompress_model(work)
    state = {k: v for k, v in work.state_dict().items()
             if not k.rsplit(".", 1)[-1].startswith("weight_")}
    for name in fused:
        experts = work.get_submodule(name)
        state[f"{name}.gate_up_proj"] = torch.stack(
            [torch.cat([e.gate_proj.weight, e.up_proj.weight]) for e in experts])
        state[f"{name}.down_proj"] = torch.stack([e.down_proj.weight for e in experts])
        for k in [k for k in state if k.startswith(f"{name}.") and k.count(".") > name.count(".") + 1]:
            del state[k]
    ref.load_state_dict(state, strict=True)
    return ref.eval(), n


def quantization_config(d: Path) -> dict:
    return json.loads((Path(d) / "config.json").read_text())["quantization_config"]
