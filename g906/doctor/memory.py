"""Memory estimate per device for a Plan: weights / TP + KV cache for max_model_len x max_num_seqs
+ linear-attention state + activations + runtime overhead. A pure function of the plan (it only
stats model files when the plan's facts do not give the weight size), reusable by the engine.

The numbers are an upper-bound style estimate meant to answer "will this fit", not an allocator.
"""

from __future__ import annotations

import math
import os
from dataclasses import asdict, dataclass, field
from typing import Any

from g906.arch.hybrid import HybridShape

GiB = 1024 ** 3
MiB = 1024 ** 2

DTYPE_BYTES = {"float32": 4, "float16": 2, "bfloat16": 2, "f32": 4, "f16": 2, "bf16": 2,
               "fp32": 4, "fp16": 2, "float": 4, "half": 2}

# A fixed allowance for the HIP/CUDA context, BLAS workspaces and decode graphs
GPU_RUNTIME_OVERHEAD = 512 * MiB


def resolve_dtype(requested: str, device: str, arch: str | None = None) -> str:
    """The compute dtype the embedded engine uses: auto = float16 on ROCm (gfx906 has no bf16
    math), bfloat16 on CUDA, float32 on CPU; an explicit request is kept."""
    if requested and requested != "auto":
        return requested
    if device == "rocm":
        return "float16"
    if device == "cuda":
        return "bfloat16"
    return "float32"


@dataclass
class DeviceMemory:
    device: int | str
    weights: int
    kv_cache: int
    linear_state: int
    activations: int
    overhead: int
    total: int
    prefix_snapshots: int = 0             # the prefix cache's linear-attention state snapshots
    # weight bytes one decode token reads: all of them for a dense model; for an MoE model the
    # non-expert weights plus top_k / num_experts of the experts (the decode bandwidth limit)
    active_weights: int = 0
    capacity: int | None = None           # VRAM (or RAM) of the device
    budget: int | None = None             # capacity x gpu_memory_utilization
    fits: bool | None = None

    def to_json(self) -> dict[str, Any]:
        return asdict(self)


@dataclass
class MemoryEstimate:
    dtype: str
    device_kind: str
    tensor_parallel_size: int
    max_model_len: int
    max_num_seqs: int
    per_device: list[DeviceMemory]
    assumptions: list[str] = field(default_factory=list)

    @property
    def fits(self) -> bool | None:
        vals = [d.fits for d in self.per_device]
        if any(v is False for v in vals):
            return False
        if vals and all(v is True for v in vals):
            return True
        return None

    def to_json(self) -> dict[str, Any]:
        out = asdict(self)
        out["fits"] = self.fits
        return out


def _int(facts: dict[str, Any], *keys: str, default: int | None = None) -> int | None:
    for k in keys:
        node: Any = facts
        for part in k.split("/"):
            node = node.get(part) if isinstance(node, dict) else None
        if isinstance(node, (int, float)) and not isinstance(node, bool) and node > 0:
            return int(node)
    return default


def _weight_bytes(plan: Any, notes: list[str]) -> int:
    facts = plan.model_facts or {}
    wb = _int(facts, "weights_bytes")
    if wb is None:
        total = 0
        for p in plan.model_files or []:
            name = str(p).lower()
            if name.endswith((".gguf", ".safetensors", ".bin", ".pt")):
                try:
                    total += os.path.getsize(p)
                except OSError:
                    pass
        wb = total or None
    elif plan.mmproj_path is not None and getattr(plan, "images_enabled", False):
        try:
            wb += os.path.getsize(plan.mmproj_path)
        except OSError:
            pass
    if wb is None:
        hidden = _int(facts, "hidden_size")
        layers = _int(facts, "num_hidden_layers")
        inter = _int(facts, "intermediate_size")
        vocab = _int(facts, "vocab_size")
        if hidden and layers:
            params = layers * (4 * hidden * hidden + 3 * hidden * (inter or 4 * hidden)) + 2 * (vocab or 0) * hidden
            wb = params * 2
            notes.append("weights estimated from the layer shapes (no model files to measure)")
        else:
            wb = 0
            notes.append("weight size unknown (no model files, no shapes)")
    return wb


def _snapshot_pool(plan: Any, kv_cache: int, per_state: int, seqs: int, notes: list[str]) -> int:
    """Bytes of the prefix cache's state snapshots: the embedded engine gives them
    prefix_snapshot_share of its cache budget (at least two per sequence), taken from what the KV
    cache would otherwise get, so max_model_len x max_num_seqs still needs kv_cache beside them."""
    recipe = getattr(plan, "recipe", None)
    engine = getattr(recipe, "engine", None)
    if engine is None or not getattr(engine, "prefix_caching", False) or getattr(plan, "engine_kind", "") != "embedded":
        return 0
    share = float(engine.embedded.prefix_snapshot_share)
    if share <= 0 or per_state <= 0:
        return 0
    pool = max(2 * seqs * per_state, int(share / (1 - share) * kv_cache) // per_state * per_state)
    notes.append(f"prefix caching: {pool // per_state} linear-attention state snapshots "
                 f"({share:.0%} of the cache budget, engine.embedded.prefix_snapshot_share)")
    return pool


_FLOAT_BYTES = {"F64": 8, "F32": 4, "F16": 2, "BF16": 2}


def _packed_weight_bytes(by_dtype: dict, act_bytes: int) -> int:
    """Resident bytes of a GPTQ / AWQ / compressed-tensors checkpoint (bytes per safetensors
    dtype): the packed integer tensors as stored (the engine keeps them packed), the floating
    ones converted to the compute dtype."""
    total = 0
    for dt, n in by_dtype.items():
        if not isinstance(n, int):
            continue
        src = _FLOAT_BYTES.get(str(dt))
        total += n * act_bytes // src if src else n
    return total


@dataclass(frozen=True)
class MoEFacts:
    num_experts: int
    top_k: int
    expert_bytes: int               # bytes of all routed experts (every layer), in the files' types
    expert_types: dict[str, int]    # GGUF types of the stacked expert tensors ({} for HF)

    def active_bytes(self, weights: int) -> int:
        """Weight bytes one token reads: the non-expert weights and its top_k experts."""
        return weights - self.expert_bytes + math.ceil(self.expert_bytes * self.top_k / self.num_experts)


def moe_facts(facts: dict[str, Any], weights: int, dtype_bytes: int) -> MoEFacts | None:
    """The MoE facts of a model (None for a dense one): from the GGUF header (expert_count,
    expert_used_count, the ffn_*_exps tensors' bytes and types) or the HF config (num_experts,
    num_experts_per_tok, moe_intermediate_size: expert bytes from the shapes)."""
    gg = facts.get("gguf") or {}
    experts = _int(facts, "num_experts") or _int(gg, "expert_count")
    top_k = _int(facts, "num_experts_per_tok") or _int(gg, "expert_used_count")
    if not experts or not top_k:
        return None
    ebytes = _int(facts, "expert_bytes")
    if ebytes is None:
        hidden, layers = _int(facts, "hidden_size"), _int(facts, "num_hidden_layers")
        inter = _int(facts, "moe_intermediate_size") or _int(gg, "expert_feed_forward_length")
        ebytes = 3 * experts * inter * hidden * layers * dtype_bytes if hidden and layers and inter else 0
    types = facts.get("expert_types")
    return MoEFacts(experts, top_k, min(ebytes, weights), dict(types) if isinstance(types, dict) else {})


def estimate_memory(
    plan: Any,
    *,
    device_kind: str = "rocm",
    capacities: list[int] | None = None,
    arch: str | None = "gfx906",
    devices: list[int | str] | None = None,
    state_bytes: int = 4,
) -> MemoryEstimate:
    """Estimate the memory each device needs for `plan` (a g906.recipe.plan.Plan).

    device_kind: "rocm", "cuda" or "cpu" (decides the auto dtype and the runtime overhead).
    capacities: bytes of memory of each device used (VRAM, or RAM for the CPU); when given, each
    device gets budget = capacity x plan.gpu_memory_utilization and fits = total <= budget.
    devices: labels for the devices (default: plan.devices or 0..TP-1, or "cpu").
    state_bytes: bytes per element of the linear-attention recurrent state (float32 by default).
    """
    notes: list[str] = []
    facts = plan.model_facts or {}
    tp = max(1, int(plan.tensor_parallel_size or 1)) if device_kind != "cpu" else 1
    dtype = resolve_dtype(plan.dtype, device_kind, arch)
    act_bytes = DTYPE_BYTES.get(dtype, 2)

    # --- weights ---------------------------------------------------------------------------
    weights = _weight_bytes(plan, notes)
    by_dtype = facts.get("weights_bytes_by_dtype")
    if plan.model_format == "hf" and plan.quantization != "none" and isinstance(by_dtype, dict) and by_dtype:
        weights = _packed_weight_bytes(by_dtype, act_bytes)
        notes.append(f"{plan.quantization} weights stay packed: integer words counted as stored, "
                     f"16/32-bit tensors (scales, norms, embeddings, unquantized projections) as {dtype}")
    elif plan.model_format == "hf" and plan.quantization == "none":
        src = DTYPE_BYTES.get(str(facts.get("torch_dtype", "")).replace("torch.", ""), None)
        if src and src != act_bytes:
            weights = weights * act_bytes // src
            notes.append(f"dense weights converted from {facts.get('torch_dtype')} to {dtype}")
    weights_per_dev = math.ceil(weights / tp)
    moe = moe_facts(facts, weights, act_bytes)
    active_per_dev = math.ceil((moe.active_bytes(weights) if moe else weights) / tp)
    if moe is not None:
        kinds = ", ".join(f"{t} x{n}" for t, n in moe.expert_types.items()) or "the checkpoint's dtype"
        notes.append(f"MoE: {moe.num_experts} experts, {moe.top_k} per token; experts {fmt_bytes(moe.expert_bytes)} "
                     f"of {fmt_bytes(weights)} ({kinds}); a decode token reads about "
                     f"{fmt_bytes(active_per_dev)} of weights per device")

    # --- shapes ----------------------------------------------------------------------------
    layers = _int(facts, "num_hidden_layers") or 0
    hidden = _int(facts, "hidden_size") or 0
    heads = _int(facts, "num_attention_heads") or 0
    kv_heads = _int(facts, "num_key_value_heads") or heads
    head_dim = _int(facts, "head_dim") or (hidden // heads if heads else 0)
    interval = _int(facts, "full_attention_interval") or 4
    layer_types = facts.get("layer_types")
    if isinstance(layer_types, list) and layer_types:
        n_full = sum(1 for t in layer_types if t == "full_attention")
    else:
        n_full = sum(1 for i in range(layers) if (i + 1) % interval == 0)
    n_linear = max(0, layers - n_full)
    if not layers:
        notes.append("layer counts unknown: KV cache and linear-attention state not counted")

    ctx = plan.max_model_len or _int(facts, "context_length", "max_position_embeddings") or 4096
    if plan.max_model_len is None:
        notes.append(f"max_model_len not set: the model's own context ({ctx} tokens) is assumed")
    seqs = max(1, int(plan.max_num_seqs or 1))

    # --- KV cache (full-attention layers) and linear-attention state: g906.arch's formulas ----
    inner = _int(facts, "gguf/ssm.inner_size")
    v_heads = _int(facts, "linear_num_value_heads", "gguf/ssm.time_step_rank") or 32
    shape = HybridShape(
        num_full_layers=n_full, num_linear_layers=n_linear, num_key_value_heads=kv_heads or 0,
        head_dim=head_dim,
        linear_num_key_heads=_int(facts, "linear_num_key_heads", "gguf/ssm.group_count") or 16,
        linear_num_value_heads=v_heads,
        linear_key_head_dim=_int(facts, "linear_key_head_dim", "gguf/ssm.state_size") or 128,
        linear_value_head_dim=_int(facts, "linear_value_head_dim") or (inner // v_heads if inner else 128),
        linear_conv_kernel_dim=_int(facts, "linear_conv_kernel_dim", "gguf/ssm.conv_kernel") or 4,
    )
    kv_cache = shape.kv_bytes_per_token(act_bytes, tp) * ctx * seqs
    per_state = shape.state_bytes_per_sequence(act_bytes, tp, recurrent_bytes=state_bytes)
    linear_state = per_state * seqs
    snapshots = _snapshot_pool(plan, kv_cache, per_state, seqs, notes)

    # --- activations ---------------------------------------------------------------------------
    step_tokens = plan.max_num_batched_tokens or min(ctx, 4096)
    inter = _int(facts, "intermediate_size") or 4 * hidden
    if moe is not None:   # a token's MLP activations: its chosen experts and the shared expert
        gg = facts.get("gguf") or {}
        e_inter = _int(facts, "moe_intermediate_size") or _int(gg, "expert_feed_forward_length") or inter
        s_inter = (_int(facts, "shared_expert_intermediate_size")
                   or _int(gg, "expert_shared_feed_forward_length") or e_inter)
        inter = moe.top_k * e_inter + s_inter
    vocab = _int(facts, "vocab_size") or 0
    per_token = (4 * hidden + 3 * math.ceil(inter / tp) + 2 * math.ceil(max(heads, 1) * head_dim / tp)) * act_bytes
    activations = step_tokens * per_token + seqs * vocab * 4 + 2 * step_tokens * hidden * 4
    overhead = GPU_RUNTIME_OVERHEAD if device_kind in ("rocm", "cuda") else 0

    total = weights_per_dev + kv_cache + linear_state + snapshots + activations + overhead
    labels: list[int | str]
    if devices is not None:
        labels = list(devices)
    elif device_kind == "cpu":
        labels = ["cpu"]
    else:
        labels = list(plan.devices) if plan.devices else list(range(tp))
    per_device = []
    util = float(plan.gpu_memory_utilization or 0.9)
    for i, label in enumerate(labels):
        cap = capacities[i] if capacities is not None and i < len(capacities) else None
        budget = int(cap * util) if cap is not None and device_kind != "cpu" else cap
        per_device.append(DeviceMemory(
            device=label, weights=weights_per_dev, active_weights=active_per_dev, kv_cache=kv_cache,
            linear_state=linear_state, activations=activations, overhead=overhead, total=total,
            prefix_snapshots=snapshots, capacity=cap, budget=budget,
            fits=(total <= budget) if budget is not None else None,
        ))
    return MemoryEstimate(dtype=dtype, device_kind=device_kind, tensor_parallel_size=tp, max_model_len=ctx,
                          max_num_seqs=seqs, per_device=per_device, assumptions=notes)


def fmt_bytes(n: int | None) -> str:
    if n is None:
        return "?"
    if n >= GiB:
        return f"{n / GiB:.1f} GiB"
    if n >= MiB:
        return f"{n / MiB:.0f} MiB"
    return f"{n / 1024:.0f} KiB"
