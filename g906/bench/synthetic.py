"""Synthetic models for benchmarks: a LoadedModel of random weights of a real Qwen3.5 shape,
built on the device, and the weight bytes a decode step reads.

    loaded = build_synthetic("qwen3.5-9b", quant="q4_k", device="cuda", dtype="float16")

The shapes, the quant mixes and the weights themselves are g906.engine.synthetic's (tensor-
parallel workers load the same ones by source name)."""

from __future__ import annotations

import time
from typing import Any

import torch

from g906.engine.synthetic import DENSE_DTYPES, SEED, NullTokenizer, normalize_quant, shape_config, synthetic_weights
from g906.engine.weights import GroupQuantExperts, GroupQuantWeight, is_quantized


def _tensors_of(w) -> list[torch.Tensor]:
    """The tensors holding a weight: a dense tensor, a QuantizedTensor's blocks, or the planes of
    a repacked quantized weight (g906.kernels' PackedQuant)."""
    if isinstance(w, torch.Tensor):
        return [w]
    if isinstance(w, (GroupQuantWeight, GroupQuantExperts)):   # GPTQ / AWQ / compressed-tensors: words + scales
        return [t for t in (w.qweight, w.scales, w.zeros, w.perm) if t is not None]
    planes = getattr(w, "planes", None)
    if isinstance(planes, dict):
        return [t for t in planes.values() if isinstance(t, torch.Tensor)]
    data = getattr(w, "data", None)
    return [data] if isinstance(data, torch.Tensor) else []


def _is_weight(v) -> bool:
    return is_quantized(v) or isinstance(getattr(v, "planes", None), dict)


def weight_stats(model) -> dict[str, int]:
    """Resident weight bytes of a loaded model and the bytes one decode step reads.

    bytes_per_token: every weight except the embedding table, of which one row is read, and for an
    MoE model only top_k / num_experts of the routed experts (its active bytes); when
    the LM head is the embedding (tied), the whole table is read by the head."""
    seen: set[int] = set()
    total = 0

    def add(w) -> int:
        n = 0
        for t in _tensors_of(w):
            if t.numel() == 0:
                continue
            key = t.untyped_storage().data_ptr() + t.storage_offset() * t.element_size()
            if key in seen:
                continue
            seen.add(key)
            n += t.numel() * t.element_size()
        return n

    for mod in model.modules():
        for t in list(mod._parameters.values()) + list(mod._buffers.values()):
            if t is not None:
                total += add(t)
        for name, v in mod.__dict__.items():
            # quantized weights, and fused ones kept as plain attributes (gate_up_weight)
            if _is_weight(v) or (isinstance(v, torch.Tensor) and (name.endswith("weight") or name == "gate_up")):
                total += add(v)
            elif hasattr(v, "linears") and hasattr(v, "weights"):   # FusedProjections
                total += sum(add(w) for w in v.weights)
    # MoE: a token reads only its top_k of the routed experts
    cfg = model.config
    expert_bytes = 0
    for mod in model.modules():
        if type(mod).__name__ == "Experts":
            ws = [mod.gate_up, mod.down_proj] if not isinstance(mod.gate_up, tuple) else [*mod.gate_up, mod.down_proj]
            expert_bytes += sum(t.numel() * t.element_size() for w in ws for t in _tensors_of(w))
    unread = expert_bytes - expert_bytes * cfg.num_experts_per_tok // cfg.num_experts if expert_bytes else 0
    emb = model.model.embed_tokens.weight
    emb_bytes = sum(t.numel() * t.element_size() for t in _tensors_of(emb))
    rows = int(getattr(emb, "shape", (1,))[0]) or 1
    row = emb_bytes // rows
    per_token = total - emb_bytes + row - unread
    if model.lm_head is None:
        per_token += emb_bytes
    out = {"weight_bytes": int(total), "embedding_bytes": int(emb_bytes), "bytes_per_token": int(per_token)}
    if expert_bytes:
        out["expert_bytes"] = int(expert_bytes)
    return out


def build_synthetic(shape: str, *, quant: str = "f16", dtype: str | torch.dtype = "auto", device=None,
                    overrides: dict[str, Any] | None = None, seed: int = SEED, max_positions: int | None = None):
    """A LoadedModel (g906.engine.loader) with random weights of `shape`, built on `device`."""
    from g906.engine.device import default_device, resolve_dtype
    from g906.engine.sources import LoadedModel
    from g906.engine.models import model_class

    quant = normalize_quant(quant)
    config = shape_config(shape, overrides)
    dev = torch.device(device) if device is not None else default_device()
    if dtype != "auto":
        cdtype = resolve_dtype(dtype, dev)
    elif quant in DENSE_DTYPES:
        cdtype = DENSE_DTYPES[quant]
        if dev.type == "cpu" and cdtype != torch.float32:
            cdtype = torch.float32          # CPU math in fp32 (the stored weights are random anyway)
        else:
            cdtype = resolve_dtype(cdtype, dev)
    else:
        # quantized weights compute with fp16 activations on GPUs (the fused dequant kernels'
        # input type), fp32 on the CPU
        cdtype = torch.float16 if dev.type == "cuda" else torch.float32
    t0 = time.perf_counter()
    model = model_class(config)(config, dtype=cdtype, device=dev, max_positions=max_positions)
    stats = model.load_weights(synthetic_weights(config, quant=quant, dtype=cdtype, device=dev, seed=seed))
    if dev.type == "cuda":
        torch.cuda.synchronize(dev)
    ws = weight_stats(model)
    info = {
        "source": f"synthetic:{shape}", "format": "synthetic", "shape": shape, "quant": quant,
        "dtype": str(cdtype).replace("torch.", ""), "device": str(dev),
        "load_seconds": round(time.perf_counter() - t0, 3), "seed": seed, "synthetic": True,
        **stats, **ws,
    }
    if overrides:
        info["overrides"] = dict(overrides)
    return LoadedModel(model, config, NullTokenizer(), None, "synthetic", info)
