"""Which tensor-parallel sizes a model allows, torch-free: shared by the recipe resolver (with
the facts it read from the model files) and the engine (with a ModelConfig).

Every rank holds 1/tp of each count its architecture lists (Architecture.tp_counts: attention
heads, KV heads, linear-attention key and value heads, MLP features), so tp must divide each.
The vocabulary needs no divisibility (the last rank's share is smaller). Row-parallel splits of
quantized GGUF tensors must also fall on whole quant blocks; that depends on each tensor's type
and is checked when the weights are sharded."""

from __future__ import annotations

from typing import Any, Mapping

from g906.arch import qwen35
from g906.arch.registry import lookup
from g906.arch.spec import TPCount
from g906.errors import G906Error


def _counts_of(source: Any) -> tuple[TPCount, ...]:
    name = source.get("architecture") if isinstance(source, Mapping) else getattr(source, "architecture", None)
    arch = lookup(name) if isinstance(name, str) else None
    return arch.tp_counts if arch is not None and arch.tp_counts else qwen35.TP_COUNTS


def model_counts(source: Any) -> dict[str, int]:
    """The counts tp must divide, from a ModelConfig, an HF config/facts dict, or the recipe's
    facts of a GGUF file (raw keys under facts["gguf"]). Unknown counts are left out."""
    out: dict[str, int] = {}
    gguf: Mapping[str, Any] = {}
    if isinstance(source, Mapping):
        get = source.get
        g = source.get("gguf")
        gguf = g if isinstance(g, Mapping) else {}
    else:
        def get(k, default=None):
            return getattr(source, k, default)
    for count in _counts_of(source):
        v = get(count.field)
        if v is None:
            v = gguf.get(count.gguf_key)
        if isinstance(v, int) and not isinstance(v, bool) and v > 0:
            out[count.field] = v
    return out


def tp_problems(source: Any, tp: int) -> list[str]:
    """One message per count tp does not divide, with the numbers; [] when tp fits (or nothing
    is known)."""
    if tp <= 1:
        return []
    what = {c.field: c.what for c in _counts_of(source)}
    return [f"tensor_parallel_size {tp} does not divide the model's {n} {what[k]} ({k} = {n})"
            for k, n in model_counts(source).items() if n % tp]


def tp_message(source: Any, tp: int) -> str | None:
    """One sentence naming every count tp does not divide, with the numbers; None when it fits."""
    if tp <= 1:
        return None
    what = {c.field: c.what for c in _counts_of(source)}
    bad = [(k, n) for k, n in model_counts(source).items() if n % tp]
    if not bad:
        return None
    if len(bad) == 1:
        return tp_problems(source, tp)[0]
    return (f"tensor_parallel_size {tp} does not divide the model's "
            + ", ".join(f"{n} {what[k]} ({k})" for k, n in bad))


def valid_tp_sizes(source: Any, limit: int = 64) -> list[int]:
    counts = model_counts(source)
    return [t for t in range(1, limit + 1) if all(n % t == 0 for n in counts.values())]


def check_tp_size(source: Any, tp: int) -> None:
    """Raise G906Error naming every count tp does not divide (the engine's check)."""
    msg = tp_message(source, tp)
    if msg:
        raise G906Error(msg, hint="tensor-parallel sizes this model allows: "
                        + ", ".join(map(str, valid_tp_sizes(source))))
