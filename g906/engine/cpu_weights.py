"""GGUF weights on the CPU: dequantized once at load, not on every matmul.

The CPU has no dequantizing GEMV: the PyTorch reference dequantizes a quantized weight in full
before its matmul. Done per call, that cost a whole-model dequantization per decoded token (the
248k-row output layer included), ~30x the matmuls themselves. The model keeps its
QuantizedTensors (what it reports, shards and fuses stays the same); each gets its float32 matrix
beside it (g906.kernels.ops.keep_dense_on_cpu), here at load so that the first request is not
the one that pays. Memory: 4 bytes per weight on top of the blocks; G906_CPU_DEQUANT_CACHE=0
keeps per-call dequantization for machines where that does not fit."""

from __future__ import annotations

import torch

from g906.engine.progress import Step
from g906.engine.weights import QuantizedTensor


def _quantized_weights(model: torch.nn.Module, skip: list) -> list[QuantizedTensor]:
    """Every QuantizedTensor the model computes with: module attributes, and the stacked weights
    of fused projections (plain objects hung on the modules)."""
    seen: dict[int, QuantizedTensor] = {}
    skipped = {id(w) for w in skip}

    def add(v) -> None:
        if isinstance(v, QuantizedTensor) and v.data.device.type == "cpu" and id(v) not in skipped:
            seen.setdefault(id(v), v)

    for mod in model.modules():
        for v in vars(mod).values():
            add(v)
            stacked = getattr(v, "weights", None) if not isinstance(v, (torch.Tensor, dict)) else None
            if isinstance(stacked, list):
                for w in stacked:
                    add(w)
    return list(seen.values())


def dequantize_for_cpu(model: torch.nn.Module, *, skip: list | None = None, progress: bool = True) -> int:
    """Give every CPU GGUF weight of the model its dense matrix; returns how many (0 when the
    cache is off or nothing is quantized). skip: weights only gathered from (an untied
    embedding table: its rows are dequantized as they are looked up)."""
    from g906.kernels.ops import keep_dense_on_cpu
    from g906.kernels.linear.reference import cpu_dequant_cache_enabled

    weights = _quantized_weights(model, skip or [])
    if not weights or not cpu_dequant_cache_enabled():
        return 0
    total = sum(w.shape[0] * w.shape[1] * 4 for w in weights)
    with Step("Dequantizing the GGUF weights for the CPU", total=total, unit="bytes", count_noun="weights",
              enabled=progress) as step:
        for w in weights:
            keep_dense_on_cpu(w)
            step.advance(w.shape[0] * w.shape[1] * 4, count=1)
    return len(weights)
