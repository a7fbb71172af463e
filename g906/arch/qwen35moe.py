"""Qwen3.5 / Qwen3.6 MoE (35B-A3B family): the qwen35 hybrid stack whose MLP is a sparse MoE.

Routing (transformers' models/qwen3_5_moe): router logits = mlp.gate(x) [E]; softmax over all
experts (fp32); the top num_experts_per_tok; their weights renormalised to sum 1
(norm_topk_prob, always on in Qwen3.5 MoE); the sum of the chosen experts' SwiGLU outputs
weighted so, plus the shared expert's SwiGLU output times sigmoid(shared_expert_gate(x)).

HF checkpoints: Qwen3_5MoeForConditionalGeneration (text_config + vision tower) or
Qwen3_5MoeForCausalLM. Experts come either fused as transformers holds them
(mlp.experts.gate_up_proj [E, 2I, H], mlp.experts.down_proj [E, H, I]) or one tensor per expert
(mlp.experts.<e>.{gate,up,down}_proj.weight); the engine stacks the latter at load.

GGUF (general.architecture = "qwen35moe", llama.cpp's converter): the qwen35 tensors and
transforms, and per layer ffn_gate_inp [E, H] (router), ffn_gate_exps / ffn_up_exps [E, I, H]
(or one ffn_gate_up_exps [E, 2I, H]), ffn_down_exps [E, H, I], ffn_{gate,up,down}_shexp (shared
expert) and ffn_gate_inp_shexp [H] (its gate; [1, H] accepted). Metadata: expert_count,
expert_used_count, expert_feed_forward_length, expert_shared_feed_forward_length and, when
written, expert_weights_norm. The engine names stacked experts mlp.experts.gate_proj /
up_proj / down_proj (3-D)."""

from __future__ import annotations

from typing import Any, Iterator, Mapping

from g906.arch import qwen35
from g906.arch.config import ModelConfig
from g906.arch.spec import Architecture, TPCount
from g906.errors import G906Error

MOE_MAP: dict[str, tuple[str, str]] = {
    "ffn_gate_inp.weight": ("mlp.gate.weight", ""),
    "ffn_gate_exps.weight": ("mlp.experts.gate_proj", ""),
    "ffn_up_exps.weight": ("mlp.experts.up_proj", ""),
    "ffn_gate_up_exps.weight": ("mlp.experts.gate_up_proj", ""),
    "ffn_down_exps.weight": ("mlp.experts.down_proj", ""),
    "ffn_gate_shexp.weight": ("mlp.shared_expert.gate_proj.weight", ""),
    "ffn_up_shexp.weight": ("mlp.shared_expert.up_proj.weight", ""),
    "ffn_down_shexp.weight": ("mlp.shared_expert.down_proj.weight", ""),
    "ffn_gate_inp_shexp.weight": ("mlp.shared_expert_gate.weight", ""),
}
DENSE_MLP = ("ffn_gate.weight", "ffn_up.weight", "ffn_down.weight")
LAYER_MAP = {**{k: v for k, v in qwen35.LAYER_MAP.items() if k not in DENSE_MLP}, **MOE_MAP}

TP_COUNTS = (
    *(c for c in qwen35.TP_COUNTS if c.field != "intermediate_size"),
    TPCount("moe_intermediate_size", "expert intermediate features", "expert_feed_forward_length"),
    TPCount("shared_expert_intermediate_size", "shared-expert intermediate features",
            "expert_shared_feed_forward_length"),
)

GGUF_FACT_KEYS = {
    **{k: v for k, v in qwen35.GGUF_FACT_KEYS.items() if k != "feed_forward_length"},
    "expert_count": "num_experts",
    "expert_used_count": "num_experts_per_tok",
    "expert_feed_forward_length": "moe_intermediate_size",
    "expert_shared_feed_forward_length": "shared_expert_intermediate_size",
}


def _moe_fields(experts: int, used: int, inter: int, shared: int, norm: bool) -> dict[str, Any]:
    # intermediate_size: one expert's features (there is no dense MLP)
    return {"intermediate_size": inter, "num_experts": experts, "num_experts_per_tok": used,
            "moe_intermediate_size": inter, "shared_expert_intermediate_size": shared,
            "norm_topk_prob": norm}


def config_from_hf(cfg: Mapping[str, Any]) -> ModelConfig:
    def mlp(text: Mapping[str, Any]) -> dict[str, Any]:
        inter = text["moe_intermediate_size"]
        return _moe_fields(text["num_experts"], text["num_experts_per_tok"], inter,
                           text.get("shared_expert_intermediate_size", inter),
                           bool(text.get("norm_topk_prob", True)))

    return qwen35.hf_config(cfg, mlp, default_arch="qwen35moe")


def config_from_gguf(md: Mapping[str, Any], shapes: Mapping[str, tuple[int, ...]], source: str) -> ModelConfig:
    def mlp(k) -> dict[str, Any]:
        inter = int(k("expert_feed_forward_length", required=True))
        return _moe_fields(int(k("expert_count", required=True)), int(k("expert_used_count", required=True)),
                           inter, int(k("expert_shared_feed_forward_length", inter)),
                           bool(k("expert_weights_norm", True)))

    cfg = qwen35.gguf_config(md, shapes, source, mlp, architecture="qwen35moe")
    # the router's rows are the experts: a header that disagrees with the tensors is a bad file
    router = shapes.get("blk.0.ffn_gate_inp.weight")
    if router is not None and router[0] != cfg.num_experts:
        raise G906Error(f"{source}: qwen35moe.expert_count is {cfg.num_experts} but blk.0.ffn_gate_inp.weight "
                        f"routes to {router[0]} experts")
    return cfg


def gguf_to_hf(gguf_name: str, c: ModelConfig) -> tuple[str, str] | None:
    return qwen35.map_gguf_name(gguf_name, c, LAYER_MAP)


def moe_shapes(c: ModelConfig, *, gate_up_stacked: bool = False) -> dict[str, tuple[int, ...]]:
    """GGUF suffix -> shape of one layer's MoE MLP (and its two norms)."""
    H, E, I, S = c.hidden_size, c.num_experts, c.moe_intermediate_size, c.shared_expert_intermediate_size
    out: dict[str, tuple[int, ...]] = {
        "attn_norm.weight": (H,), "post_attention_norm.weight": (H,),
        "ffn_gate_inp.weight": (E, H), "ffn_down_exps.weight": (E, H, I),
        "ffn_gate_shexp.weight": (S, H), "ffn_up_shexp.weight": (S, H), "ffn_down_shexp.weight": (H, S),
        "ffn_gate_inp_shexp.weight": (H,),
    }
    if gate_up_stacked:
        out["ffn_gate_up_exps.weight"] = (E, 2 * I, H)
    else:
        out["ffn_gate_exps.weight"] = (E, I, H)
        out["ffn_up_exps.weight"] = (E, I, H)
    return out


def _stacked(shapes_seen: Mapping[str, Any] | None) -> bool:
    return bool(shapes_seen) and "blk.0.ffn_gate_up_exps.weight" in shapes_seen


def gguf_shapes(c: ModelConfig, present: Mapping[str, Any] | None = None) -> dict[str, tuple[int, ...]]:
    """Every tensor a qwen35moe GGUF file must hold, with its shape (torch order). present: the
    file's tensor names (a file with ffn_gate_up_exps is checked for that form)."""
    return qwen35.stack_shapes(c, moe_shapes(c, gate_up_stacked=_stacked(present)))


def gguf_mtp_shapes(c: ModelConfig, present: Mapping[str, Any] | None = None) -> dict[str, tuple[int, ...]]:
    return qwen35.mtp_stack_shapes(c, moe_shapes(c, gate_up_stacked=_stacked(present)))


def _hf_layout(hf: str, shape: tuple[int, ...]) -> tuple[int, ...]:
    return (1, shape[0]) if hf.endswith("shared_expert_gate.weight") else shape


def hf_shapes(c: ModelConfig) -> Iterator[tuple[str, tuple[int, ...]]]:
    """(HF name, shape) of every weight, experts fused as transformers holds them."""
    fused = {"blk.0.ffn_gate_up_exps.weight": None}
    return qwen35.hf_shapes_of((gguf_shapes(c, fused), gguf_mtp_shapes(c)), gguf_to_hf, c, _hf_layout)


def expert_tensor(hf_name: str) -> bool:
    """Whether an HF-named tensor is a routed expert weight (stacked, read per chosen expert)."""
    return ".mlp.experts." in f".{hf_name}"


ARCH = Architecture(
    name="qwen35moe",
    description="Qwen3.5 / Qwen3.6 MoE (hybrid stack, sparse MoE MLP with a shared expert)",
    hf_names=("Qwen3_5MoeForConditionalGeneration", "Qwen3_5MoeForCausalLM"),
    gguf_names=("qwen35moe",),
    multimodal=True,
    moe=True,
    reasoning_parser="qwen3",
    tool_parser="qwen3_coder",
    model_class="g906.engine.models.qwen35moe:Qwen35MoeForCausalLM",
    tp_counts=TP_COUNTS,
    gguf_fact_keys=GGUF_FACT_KEYS,
    config_from_hf=config_from_hf,
    config_from_gguf=config_from_gguf,
    gguf_to_hf=gguf_to_hf,
    gguf_shapes=gguf_shapes,
    gguf_optional_shapes=gguf_mtp_shapes,
    hf_shapes=hf_shapes,
)
