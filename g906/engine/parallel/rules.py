"""Which tensor-parallel sizes a Qwen3.5 model allows. No torch: shared by the recipe resolver
(with its model_facts) and the engine (with a ModelConfig).

Every rank holds 1/tp of the attention heads, of the KV heads, of the linear-attention key heads
(and so of the value heads, which are a multiple of them) and of the MLP's intermediate features;
so tp must divide each of those counts. The vocabulary needs no divisibility (the last rank's
share is smaller). Row-parallel splits of quantized GGUF tensors must also fall on whole quant
blocks; that depends on each tensor's type and is checked when the weights are sharded."""

from __future__ import annotations

from typing import Any, Mapping

# (count name in ModelConfig / HF facts, what it is, GGUF metadata key under facts["gguf"])
_COUNTS = (
    ("num_attention_heads", "attention heads", "attention.head_count"),
    ("num_key_value_heads", "KV heads", "attention.head_count_kv"),
    ("linear_num_key_heads", "linear-attention key heads", "ssm.group_count"),
    ("linear_num_value_heads", "linear-attention value heads", "ssm.time_step_rank"),
    ("intermediate_size", "MLP intermediate features", "feed_forward_length"),
)


def model_counts(source: Any) -> dict[str, int]:
    """The counts tp must divide, from a ModelConfig, an HF config/facts dict, or the recipe's
    model_facts of a GGUF file (raw keys under facts["gguf"]). Unknown counts are left out."""
    out: dict[str, int] = {}
    gguf = {}
    if isinstance(source, Mapping):
        get = source.get
        g = source.get("gguf")
        gguf = g if isinstance(g, Mapping) else {}
    else:
        def get(k, default=None):
            return getattr(source, k, default)
    for name, _, gkey in _COUNTS:
        v = get(name)
        if v is None:
            v = gguf.get(gkey)
        if isinstance(v, int) and not isinstance(v, bool) and v > 0:
            out[name] = v
    return out


def tp_problems(source: Any, tp: int) -> list[str]:
    """One message per count that tp does not divide, with the numbers; [] when tp fits (or
    nothing is known)."""
    if tp <= 1:
        return []
    counts = model_counts(source)
    what = {name: desc for name, desc, _ in _COUNTS}
    return [f"tensor_parallel_size {tp} does not divide the model's {n} {what[k]} ({k} = {n})"
            for k, n in counts.items() if n % tp]


def tp_message(source: Any, tp: int) -> str | None:
    """One sentence naming every count tp does not divide, with the numbers; None when it fits."""
    if tp <= 1:
        return None
    counts = model_counts(source)
    what = {name: desc for name, desc, _ in _COUNTS}
    bad = [(k, n) for k, n in counts.items() if n % tp]
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
        from g906.errors import G906Error

        sizes = valid_tp_sizes(source)
        raise G906Error(msg,
                        hint="tensor-parallel sizes this model allows: " + ", ".join(map(str, sizes)))
