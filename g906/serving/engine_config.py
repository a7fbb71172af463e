"""A recipe's Plan in the engine's own terms: what to load (ModelArgs) and how to run it
(EngineConfig). The engine never reads a Plan; this module is the one place that does.

    args = model_args_from_plan(plan)            # source, dtype, device, devices, TP, template
    config = engine_config_from_plan(plan)       # the engine's limits and graph settings

Torch is imported only where a device must be chosen or an EngineConfig built."""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from g906.errors import G906Error

if TYPE_CHECKING:
    from g906.engine.llm_engine import EngineConfig
    from g906.recipe.plan import Plan


@dataclass(frozen=True)
class ModelArgs:
    """load_model's arguments (g906.engine.loader) for a plan's model."""
    source: str                        # GGUF first shard, HF directory or builtin:NAME
    dtype: str = "auto"
    device: str | None = None          # None: the engine's default device
    devices: list[int] | None = None   # GPU indices, one per tensor-parallel rank
    tensor_parallel_size: int = 1
    chat_template: str | None = None   # a template file overriding the model's
    keep_mtp: bool = False             # keep the MTP block (speculative method "mtp")

    def load_kwargs(self) -> dict[str, Any]:
        kw = {"dtype": self.dtype, "device": self.device, "devices": self.devices,
              "tensor_parallel_size": self.tensor_parallel_size, "chat_template": self.chat_template}
        if self.keep_mtp:
            kw["keep_mtp"] = True
        return kw


def model_source(plan: Plan) -> str:
    """What the loader opens: builtin:NAME as written, else the resolved file or directory."""
    return plan.model_source if plan.model_format == "builtin" else str(plan.model_path)


def plan_device(plan: Plan) -> str | None:
    """The first of the plan's GPUs when GPUs are visible, else None (the engine's default)."""
    if not plan.devices:
        return None
    import torch

    return f"cuda:{plan.devices[0]}" if torch.cuda.is_available() else None


def model_args_from_plan(plan: Plan) -> ModelArgs:
    return ModelArgs(
        source=model_source(plan), dtype=plan.dtype, device=plan_device(plan), devices=plan.devices,
        tensor_parallel_size=plan.tensor_parallel_size,
        chat_template=str(plan.chat_template_path) if plan.chat_template_path else None,
        keep_mtp=(getattr(plan, "speculative", None) or {}).get("method") == "mtp",
    )


def engine_config_from_plan(plan: Plan, **overrides: Any) -> EngineConfig:
    """The EngineConfig of a plan's limits and engine.embedded settings. `overrides` are
    EngineConfig fields (num_kv_blocks=, seed=, enforce_eager=, ...); None values are ignored,
    so optional command-line values can be passed through as they are."""
    from g906.engine.llm_engine import EngineConfig

    emb = plan.recipe.engine.embedded
    kw: dict[str, Any] = dict(
        max_num_seqs=plan.max_num_seqs,
        max_num_batched_tokens=plan.max_num_batched_tokens,
        max_model_len=plan.max_model_len,
        block_size=emb.block_size,
        gpu_memory_utilization=plan.gpu_memory_utilization,
        cpu_kv_cache_gib=emb.cpu_kv_cache_gib,
        max_waiting_requests=emb.max_waiting_requests,
        enforce_eager=bool(plan.enforce_eager),
        prefill_graph_tokens=emb.prefill_graph_tokens,
        enable_prefix_caching=bool(plan.recipe.engine.prefix_caching),
        prefix_state_stride=emb.prefix_state_stride,
        prefix_snapshot_share=emb.prefix_snapshot_share,
        speculative=getattr(plan, "speculative", None),
    )
    fields = {f.name for f in dataclasses.fields(EngineConfig)}
    unknown = sorted(set(overrides) - fields)
    if unknown:
        raise G906Error(f"unknown engine setting(s): {', '.join(unknown)}",
                        hint="EngineConfig takes: " + ", ".join(sorted(fields)))
    kw.update({k: v for k, v in overrides.items() if v is not None})
    return EngineConfig(**kw)
