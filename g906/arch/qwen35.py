"""Qwen3.5 / Qwen3.6 dense: a hybrid stack where layer i is full attention when
(i + 1) % full_attention_interval == 0 and Gated DeltaNet otherwise, each followed by a SwiGLU MLP.

HF checkpoints: Qwen3_5ForConditionalGeneration (text_config + vision tower) or
Qwen3_5ForCausalLM. GGUF: general.architecture = "qwen35" as llama.cpp's converter writes it,
which differs from HF in ways the loader undoes through the transforms named here:
- RMSNorm weights are stored plain (the HF zero-centred weight + 1), except ssm_norm ("norm");
- ssm_a = -exp(A_log) ("a_log"); ssm_dt.bias is dt_bias; conv1d is [C, K] ("conv");
- value heads are reordered to the tiled order when they outnumber key heads
  (ModelConfig.linear_v_head_order = "tiled"); the model computes in either order.
The MTP block (nextn_predict_layers) follows the main layers as blk.L.*."""

from __future__ import annotations

import re
from typing import Any, Iterator, Mapping

import numpy as np

from g906.arch.config import ModelConfig
from g906.arch.spec import Architecture, TPCount
from g906.errors import G906Error

# blk.N.<suffix> -> (HF suffix under model.layers.N. / mtp.layers.J., transform)
LAYER_MAP: dict[str, tuple[str, str]] = {
    "attn_norm.weight": ("input_layernorm.weight", "norm"),
    "post_attention_norm.weight": ("post_attention_layernorm.weight", "norm"),
    "attn_q.weight": ("self_attn.q_proj.weight", ""),
    "attn_k.weight": ("self_attn.k_proj.weight", ""),
    "attn_v.weight": ("self_attn.v_proj.weight", ""),
    "attn_output.weight": ("self_attn.o_proj.weight", ""),
    "attn_q_norm.weight": ("self_attn.q_norm.weight", "norm"),
    "attn_k_norm.weight": ("self_attn.k_norm.weight", "norm"),
    "attn_qkv.weight": ("linear_attn.in_proj_qkv.weight", ""),
    "attn_gate.weight": ("linear_attn.in_proj_z.weight", ""),
    "ssm_beta.weight": ("linear_attn.in_proj_b.weight", ""),
    "ssm_alpha.weight": ("linear_attn.in_proj_a.weight", ""),
    "ssm_conv1d.weight": ("linear_attn.conv1d.weight", "conv"),
    "ssm_dt.bias": ("linear_attn.dt_bias", ""),
    "ssm_a": ("linear_attn.A_log", "a_log"),
    "ssm_norm.weight": ("linear_attn.norm.weight", ""),
    "ssm_out.weight": ("linear_attn.out_proj.weight", ""),
    "ffn_gate.weight": ("mlp.gate_proj.weight", ""),
    "ffn_up.weight": ("mlp.up_proj.weight", ""),
    "ffn_down.weight": ("mlp.down_proj.weight", ""),
}
# MTP block-level tensors (on the first MTP block) -> HF names
NEXTN_MAP: dict[str, tuple[str, str]] = {
    "nextn.eh_proj.weight": ("mtp.fc.weight", ""),
    "nextn.enorm.weight": ("mtp.pre_fc_norm_embedding.weight", "norm"),
    "nextn.hnorm.weight": ("mtp.pre_fc_norm_hidden.weight", "norm"),
    "nextn.shared_head_norm.weight": ("mtp.norm.weight", "norm"),
}
GLOBAL_MAP: dict[str, tuple[str, str]] = {
    "token_embd.weight": ("model.embed_tokens.weight", ""),
    "output_norm.weight": ("model.norm.weight", "norm"),
    "output.weight": ("lm_head.weight", ""),
}
LINEAR_ONLY = frozenset(k for k, (v, _) in LAYER_MAP.items() if v.startswith("linear_attn."))

TP_COUNTS = (
    TPCount("num_attention_heads", "attention heads", "attention.head_count"),
    TPCount("num_key_value_heads", "KV heads", "attention.head_count_kv"),
    TPCount("linear_num_key_heads", "linear-attention key heads", "ssm.group_count"),
    TPCount("linear_num_value_heads", "linear-attention value heads", "ssm.time_step_rank"),
    TPCount("intermediate_size", "MLP intermediate features", "feed_forward_length"),
)

# GGUF "<arch>.<key>" -> ModelConfig / HF config.json spelling, for the facts the recipe resolver
# and the doctor read from a header without building a whole ModelConfig
GGUF_FACT_KEYS = {
    "block_count": "num_hidden_layers",
    "embedding_length": "hidden_size",
    "feed_forward_length": "intermediate_size",
    "attention.head_count": "num_attention_heads",
    "attention.head_count_kv": "num_key_value_heads",
    "attention.key_length": "head_dim",
    "context_length": "context_length",
    "full_attention_interval": "full_attention_interval",
    "vocab_size": "vocab_size",
    "nextn_predict_layers": "num_mtp_layers",
}


def layer_types(n_layers: int, interval: int) -> list[str]:
    return ["full_attention" if (i + 1) % interval == 0 else "linear_attention" for i in range(n_layers)]


def config_from_hf(cfg: Mapping[str, Any]) -> ModelConfig:
    """From a parsed config.json: the multimodal wrapper (text_config inside) or a text config."""
    return hf_config(cfg, lambda text: {"intermediate_size": text["intermediate_size"]})


def hf_config(cfg: Mapping[str, Any], mlp: Any, default_arch: str = "qwen35") -> ModelConfig:
    """ModelConfig of the hybrid stack from a config.json; mlp(text config) -> the MLP's fields
    (dense: intermediate_size; MoE: the expert counts and sizes)."""
    top = cfg
    text = cfg.get("text_config", cfg)
    rope = dict(text.get("rope_parameters") or text.get("rope_scaling") or {})
    eos = text.get("eos_token_id", top.get("eos_token_id"))
    eos_ids = [] if eos is None else ([eos] if isinstance(eos, int) else list(eos))
    archs = top.get("architectures") or []
    try:
        return ModelConfig(
            vocab_size=text["vocab_size"],
            hidden_size=text["hidden_size"],
            **mlp(text),
            num_hidden_layers=text["num_hidden_layers"],
            num_attention_heads=text["num_attention_heads"],
            num_key_value_heads=text["num_key_value_heads"],
            head_dim=text.get("head_dim") or text["hidden_size"] // text["num_attention_heads"],
            rms_norm_eps=text.get("rms_norm_eps", 1e-6),
            rope_theta=rope.get("rope_theta", text.get("rope_theta", 10_000_000.0)),
            partial_rotary_factor=rope.get("partial_rotary_factor", text.get("partial_rotary_factor", 0.25)),
            mrope_section=list(rope.get("mrope_section", [11, 11, 10])),
            mrope_interleaved=bool(rope.get("mrope_interleaved", True)),
            max_position_embeddings=text.get("max_position_embeddings", 262_144),
            layer_types=list(text.get("layer_types") or [])
            or layer_types(text["num_hidden_layers"], text.get("full_attention_interval", 4)),
            linear_conv_kernel_dim=text.get("linear_conv_kernel_dim", 4),
            linear_key_head_dim=text.get("linear_key_head_dim", 128),
            linear_value_head_dim=text.get("linear_value_head_dim", 128),
            linear_num_key_heads=text.get("linear_num_key_heads", 16),
            linear_num_value_heads=text.get("linear_num_value_heads", 32),
            tie_word_embeddings=bool(top.get("tie_word_embeddings", text.get("tie_word_embeddings", False))),
            num_mtp_layers=int(text.get("mtp_num_hidden_layers", 0) or 0),
            bos_token_id=text.get("bos_token_id", top.get("bos_token_id")),
            eos_token_ids=eos_ids,
            pad_token_id=text.get("pad_token_id", top.get("pad_token_id")),
            architecture=archs[0] if archs else default_arch,
            image_token_id=top.get("image_token_id"),
            vision_start_token_id=top.get("vision_start_token_id"),
            vision_end_token_id=top.get("vision_end_token_id"),
        )
    except KeyError as exc:
        raise G906Error(f"model config.json lacks the key {exc.args[0]!r}") from None


def _f32(v: Any) -> float:
    """A float32 metadata value as the shortest decimal that round-trips (1e-06, not 9.99e-07)."""
    return float(str(np.float32(v)))


def _scalar_heads(v: Any) -> int:
    if isinstance(v, list):  # per-layer head counts: linear layers carry 0
        nz = [int(x) for x in v if int(x)]
        return max(nz) if nz else 0
    return int(v)


def config_from_gguf(md: Mapping[str, Any], shapes: Mapping[str, tuple[int, ...]], source: str) -> ModelConfig:
    """From GGUF metadata (full keys, "qwen35.block_count", ...) and the tensors' shapes (the
    vocabulary is token_embd's rows; no output.weight means a tied LM head). Token ids come from
    the tokenizer metadata, which the loader reads."""
    return gguf_config(md, shapes, source,
                       lambda k: {"intermediate_size": int(k("feed_forward_length", required=True))})


def gguf_config(md: Mapping[str, Any], shapes: Mapping[str, tuple[int, ...]], source: str, mlp: Any,
                architecture: str = "qwen35") -> ModelConfig:
    """ModelConfig of the hybrid stack from GGUF metadata; mlp(k) -> the MLP's fields, k reading
    "<arch>.<key>" (k(key, default, required=...))."""
    arch = md.get("general.architecture")

    def k(key: str, default: Any = None, *, required: bool = False) -> Any:
        full = f"{arch}.{key}"
        if full in md:
            return md[full]
        if required:
            raise G906Error(f"{source}: GGUF metadata lacks {full}",
                            hint="the file was not written by a Qwen3.5-aware converter")
        return default

    total_layers = int(k("block_count", required=True))
    n_mtp = int(k("nextn_predict_layers", 0) or 0)
    n_layers = total_layers - n_mtp
    if n_layers <= 0:
        raise G906Error(f"{source}: block_count {total_layers} leaves no main layers after {n_mtp} MTP layer(s)")
    hidden = int(k("embedding_length", required=True))
    n_heads = k("attention.head_count", required=True)
    n_kv = _scalar_heads(k("attention.head_count_kv", n_heads))
    n_heads = _scalar_heads(n_heads)
    head_dim = int(k("attention.key_length", 0) or hidden // n_heads)
    rope_dim = int(k("rope.dimension_count", 0) or head_dim // 4)
    sections = [int(x) for x in (k("rope.dimension_sections", None) or [11, 11, 10])]
    while len(sections) > 3 and sections[-1] == 0:
        sections.pop()
    interval = int(k("full_attention_interval", 4) or 4)
    n_v = int(k("ssm.time_step_rank", required=True))
    n_k = int(k("ssm.group_count", required=True))
    inner = int(k("ssm.inner_size", required=True))
    if n_v <= 0 or inner % n_v:
        raise G906Error(f"{source}: ssm.inner_size {inner} is not a multiple of ssm.time_step_rank {n_v}")
    emb = shapes.get("token_embd.weight")
    if emb is None:
        raise G906Error(f"{source}: tensor token_embd.weight is missing")
    bos = md.get("tokenizer.ggml.bos_token_id")
    pad = md.get("tokenizer.ggml.padding_token_id")
    try:
        return ModelConfig(
            vocab_size=int(emb[0]),
            hidden_size=hidden,
            **mlp(k),
            num_hidden_layers=n_layers,
            num_attention_heads=n_heads,
            num_key_value_heads=n_kv,
            head_dim=head_dim,
            rms_norm_eps=_f32(k("attention.layer_norm_rms_epsilon", 1e-6)),
            rope_theta=_f32(k("rope.freq_base", 10_000_000.0)),
            partial_rotary_factor=rope_dim / head_dim,
            mrope_section=sections,
            mrope_interleaved=True,
            max_position_embeddings=int(k("context_length", 262_144)),
            layer_types=layer_types(n_layers, interval),
            linear_conv_kernel_dim=int(k("ssm.conv_kernel", required=True)),
            linear_key_head_dim=int(k("ssm.state_size", required=True)),
            linear_value_head_dim=inner // n_v,
            linear_num_key_heads=n_k,
            linear_num_value_heads=n_v,
            # the converter reorders V heads whenever they outnumber K heads
            linear_v_head_order="tiled" if n_v != n_k else "grouped",
            tie_word_embeddings="output.weight" not in shapes,
            num_mtp_layers=n_mtp,
            bos_token_id=None if bos is None else int(bos),
            pad_token_id=None if pad is None else int(pad),
            architecture=architecture,
        )
    except G906Error as exc:
        raise G906Error(f"{source}: {exc.message}", hint=exc.hint) from None


def map_gguf_name(gguf_name: str, c: ModelConfig, layer_map: Mapping[str, tuple[str, str]]) -> tuple[str, str] | None:
    """GGUF tensor name -> (HF name, transform) with `layer_map` for the per-layer tensors (the
    hybrid stack's globals and MTP block-level tensors are shared by the qwen35 family)."""
    if gguf_name in GLOBAL_MAP:
        return GLOBAL_MAP[gguf_name]
    m = re.match(r"^blk\.(\d+)\.(.+)$", gguf_name)
    if not m:
        return None
    b, suf = int(m.group(1)), m.group(2)
    L = c.num_hidden_layers
    if b < L:
        if suf in layer_map:
            hf, tr = layer_map[suf]
            return f"model.layers.{b}.{hf}", tr
        return None
    if b < L + c.num_mtp_layers:
        if suf in NEXTN_MAP:
            return NEXTN_MAP[suf]
        if suf in layer_map and suf not in LINEAR_ONLY:
            hf, tr = layer_map[suf]
            return f"mtp.layers.{b - L}.{hf}", tr
    return None


def gguf_to_hf(gguf_name: str, c: ModelConfig) -> tuple[str, str] | None:
    return map_gguf_name(gguf_name, c, LAYER_MAP)


def _block_shapes(c: ModelConfig) -> dict[str, dict[str, tuple[int, ...]]]:
    """Per-layer GGUF suffix -> shape, by layer kind ("full_attention", "linear_attention", "mlp")."""
    H, I = c.hidden_size, c.intermediate_size
    hd, nh, nkv = c.head_dim, c.num_attention_heads, c.num_key_value_heads
    nv, dv = c.linear_num_value_heads, c.linear_value_head_dim
    conv = c.linear_conv_dim
    return {
        "full_attention": {
            "attn_q.weight": (2 * nh * hd, H), "attn_k.weight": (nkv * hd, H),
            "attn_v.weight": (nkv * hd, H), "attn_output.weight": (H, nh * hd),
            "attn_q_norm.weight": (hd,), "attn_k_norm.weight": (hd,),
        },
        "linear_attention": {
            "attn_qkv.weight": (conv, H), "attn_gate.weight": (nv * dv, H),
            "ssm_beta.weight": (nv, H), "ssm_alpha.weight": (nv, H),
            "ssm_conv1d.weight": (conv, c.linear_conv_kernel_dim), "ssm_dt.bias": (nv,),
            "ssm_a": (nv,), "ssm_norm.weight": (dv,), "ssm_out.weight": (H, nv * dv),
        },
        "mlp": {
            "attn_norm.weight": (H,), "post_attention_norm.weight": (H,),
            "ffn_gate.weight": (I, H), "ffn_up.weight": (I, H), "ffn_down.weight": (H, I),
        },
    }


def stack_shapes(c: ModelConfig, mlp: Mapping[str, tuple[int, ...]]) -> dict[str, tuple[int, ...]]:
    """Every main-layer and global tensor of a qwen35-family GGUF file, with its shape (torch
    order); `mlp`: the per-layer MLP tensors (with the two norms) of the family member."""
    blocks = _block_shapes(c)
    H = c.hidden_size
    exp: dict[str, tuple[int, ...]] = {"token_embd.weight": (c.vocab_size, H), "output_norm.weight": (H,)}
    if not c.tie_word_embeddings:
        exp["output.weight"] = (c.vocab_size, H)
    for i, kind in enumerate(c.layer_types):
        for suf, shp in {**mlp, **blocks[kind]}.items():
            exp[f"blk.{i}.{suf}"] = shp
    return exp


def mtp_stack_shapes(c: ModelConfig, mlp: Mapping[str, tuple[int, ...]]) -> dict[str, tuple[int, ...]]:
    """The MTP blocks' tensors: a full-attention layer with `mlp`, plus the block-level projections."""
    H, L = c.hidden_size, c.num_hidden_layers
    out: dict[str, tuple[int, ...]] = {}
    if c.num_mtp_layers:
        out.update({f"blk.{L}.nextn.eh_proj.weight": (H, 2 * H), f"blk.{L}.nextn.enorm.weight": (H,),
                    f"blk.{L}.nextn.hnorm.weight": (H,), f"blk.{L}.nextn.shared_head_norm.weight": (H,)})
    full = _block_shapes(c)["full_attention"]
    for j in range(c.num_mtp_layers):
        for suf, shp in {**mlp, **full}.items():
            out[f"blk.{L + j}.{suf}"] = shp
    return out


def gguf_shapes(c: ModelConfig, present: Any = None) -> dict[str, tuple[int, ...]]:
    """Every tensor a qwen35 GGUF file must hold, with its shape (torch order)."""
    return stack_shapes(c, _block_shapes(c)["mlp"])


def gguf_mtp_shapes(c: ModelConfig, present: Any = None) -> dict[str, tuple[int, ...]]:
    """The MTP blocks' tensors (a full-attention layer plus the block-level projections)."""
    return mtp_stack_shapes(c, _block_shapes(c)["mlp"])


def hf_shapes_of(tables, to_hf, c: ModelConfig, reshape=None) -> Iterator[tuple[str, tuple[int, ...]]]:
    """(HF name, shape) of every tensor in GGUF shape `tables`, through `to_hf`, so that the two
    namings cannot drift apart; reshape(hf_name, shape) adjusts family-specific layouts."""
    for table in tables:
        for gguf_name, shape in table.items():
            mapped = to_hf(gguf_name, c)
            if mapped is None:
                continue
            hf, tr = mapped
            if tr == "conv":
                shape = (shape[0], 1, shape[1])
            yield hf, (reshape(hf, shape) if reshape else shape)


def hf_shapes(c: ModelConfig) -> Iterator[tuple[str, tuple[int, ...]]]:
    """(HF name, shape) of every weight of the text model, MTP blocks included."""
    return hf_shapes_of((gguf_shapes(c), gguf_mtp_shapes(c)), gguf_to_hf, c)


ARCH = Architecture(
    name="qwen35",
    description="Qwen3.5 / Qwen3.6 dense (hybrid Gated DeltaNet + gated full attention)",
    hf_names=("Qwen3_5ForConditionalGeneration", "Qwen3_5ForCausalLM"),
    gguf_names=("qwen35",),
    multimodal=True,
    moe=False,
    reasoning_parser="qwen3",
    tool_parser="qwen3_coder",
    model_class="g906.engine.models.qwen35:Qwen35ForCausalLM",
    tp_counts=TP_COUNTS,
    gguf_fact_keys=GGUF_FACT_KEYS,
    config_from_hf=config_from_hf,
    config_from_gguf=config_from_gguf,
    gguf_to_hf=gguf_to_hf,
    gguf_shapes=gguf_shapes,
    gguf_optional_shapes=gguf_mtp_shapes,
    hf_shapes=hf_shapes,
)
