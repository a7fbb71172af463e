"""Qwen3.5 text model (dense MLP): hybrid Gated DeltaNet + gated full attention.

Module names mirror the Hugging Face checkpoint (model.layers.N.linear_attn.in_proj_qkv, ...),
so load_weights resolves a checkpoint name to its slot directly. Computes exactly what
transformers' models/qwen3_5 computes, on a flat batch described by a ForwardContext, reading
and writing the paged KV cache and the linear-attention state slots bound by bind_cache."""

from __future__ import annotations

from typing import Iterable

import torch
from torch import nn

from g906.engine.cache import ModelCache
from g906.arch.config import ModelConfig
from g906.engine.context import ForwardContext
from g906.engine.layers import ops
from g906.engine.layers.attention import Attention
from g906.engine.layers.base import WeightHolder, WeightSpec, check_shape
from g906.engine.layers.embedding import Embedding
from g906.engine.layers.gated_deltanet import GatedDeltaNet
from g906.engine.layers.linear import Linear
from g906.engine.layers.mlp import MLP
from g906.engine.layers.moe import SparseMoeBlock
from g906.engine.layers.norms import AddNorm, RMSNorm
from g906.engine.layers.rotary import RotaryEmbedding
from g906.engine.vision.glue import multimodal_step
from g906.engine.weights import QuantizedExperts, QuantizedTensor, is_quantized
from g906.errors import G906Error

_FP16_MAX = 65504.0


class DecoderLayer(nn.Module):
    def __init__(self, config: ModelConfig, layer_idx: int):
        super().__init__()
        self.layer_type = config.layer_types[layer_idx]
        eps = config.rms_norm_eps
        if self.layer_type == "linear_attention":
            self.linear_attn = GatedDeltaNet(
                config.hidden_size,
                config.linear_num_key_heads,
                config.linear_num_value_heads,
                config.linear_key_head_dim,
                config.linear_value_head_dim,
                config.linear_conv_kernel_dim,
                eps,
                head_order=config.linear_v_head_order,
            )
        elif self.layer_type == "full_attention":
            self.self_attn = Attention(
                config.hidden_size, config.num_attention_heads, config.num_key_value_heads, config.head_dim, eps
            )
        else:
            raise G906Error(f"layer {layer_idx}: unknown layer type {self.layer_type!r}")
        if config.is_moe:
            self.mlp = SparseMoeBlock(config.hidden_size, config.num_experts, config.num_experts_per_tok,
                                      config.moe_intermediate_size, config.shared_expert_intermediate_size,
                                      config.norm_topk_prob)
        else:
            self.mlp = MLP(config.hidden_size, config.intermediate_size)
        self.input_layernorm = RMSNorm(config.hidden_size, eps)
        self.post_attention_layernorm = RMSNorm(config.hidden_size, eps)

    def forward(self, x, residual, positions, rotary, ctx: ForwardContext, next_norm: RMSNorm | None = None):
        """(output, residual). x: the previous layer's output. Where the GEMVs can (decode), each
        output projection also does the residual add and the next RMSNorm (the next layer's
        input norm: next_norm) and returns a NormedInput (layers/norms.py)."""
        h, residual = self.input_layernorm.input_of(x, residual)
        post = AddNorm(residual, self.post_attention_layernorm)
        if self.layer_type == "linear_attention":
            y = self.linear_attn(h, ctx, post)
        else:
            y = self.self_attn(h, positions, rotary, ctx, post)
        h, residual = self.post_attention_layernorm.input_of(y, residual)
        return self.mlp(h, AddNorm(residual, next_norm) if next_norm is not None else None), residual


class Qwen35TextModel(nn.Module):
    def __init__(self, config: ModelConfig, dtype: torch.dtype, device: torch.device, max_positions: int):
        super().__init__()
        self.embed_tokens = Embedding(config.vocab_size, config.hidden_size, dtype)
        self.layers = nn.ModuleList([DecoderLayer(config, i) for i in range(config.num_hidden_layers)])
        self.norm = RMSNorm(config.hidden_size, config.rms_norm_eps)
        self.rotary = RotaryEmbedding(config.rotary_dim, config.rope_theta, max_positions, device)
        self.config = config

    def forward(self, input_ids, positions, ctx):
        x = self.embed_tokens(input_ids)
        rotary = self.rotary
        if ctx.mrope_positions is not None or ctx.mm_embeds is not None:
            # image tokens in this step: their embeddings from the vision tower, M-RoPE positions
            x, rotary = multimodal_step(x, ctx, self.config, rotary)
        residual = None
        layers = self.layers
        for i, layer in enumerate(layers):
            nxt = layers[i + 1].input_layernorm if i + 1 < len(layers) else None
            x, residual = layer(x, residual, positions, rotary, ctx, nxt)
        x, _ = self.norm(x, residual)
        return x


def _normalise_name(name: str) -> str | None:
    """Map a checkpoint name onto this module tree; None for tensors that belong to another
    part of a multimodal checkpoint (the vision tower)."""
    for prefix, repl in (
        ("model.language_model.", "model."),
        ("language_model.model.", "model."),
        ("language_model.lm_head.", "lm_head."),
        ("model.lm_head.", "lm_head."),
    ):
        if name.startswith(prefix):
            return repl + name[len(prefix):]
    if name.startswith(("model.visual.", "visual.", "vision_tower.", "model.vision_tower.")):
        return None
    return name


class Qwen35ForCausalLM(nn.Module):
    """Qwen3.5 causal LM.

    Qwen35ForCausalLM(config, dtype=, device=, max_positions=None, keep_mtp=False)
      .load_weights(iterable of (hf_name, Tensor | QuantizedTensor)) -> dict (loaded bytes etc.)
      .bind_cache(ModelCache)
      .forward(input_ids [T], positions [T], ctx) -> hidden [T, H]
           (ctx.mm_embed_index/mm_embeds: image embeddings over those tokens; ctx.mrope_positions
           [3, T]: multimodal rotary positions, see g906/engine/vision)
      .compute_logits(hidden [N, H]) -> float32 [N, V]
    """

    def __init__(self, config: ModelConfig, *, dtype: torch.dtype, device=None, max_positions: int | None = None,
                 keep_mtp: bool = False):
        super().__init__()
        self.config = config
        self.dtype = dtype
        self.device = torch.device(device) if device is not None else torch.device("cpu")
        # rotary table rows: positions the model can be run at (defaults to the config's limit)
        self.max_positions = int(max_positions or config.max_position_embeddings)
        self.model = Qwen35TextModel(config, dtype, self.device, self.max_positions)
        self.lm_head = None if config.tie_word_embeddings else Linear(config.hidden_size, config.vocab_size)
        # multi-token-prediction weights: accepted by load_weights, resident only with keep_mtp
        # (for speculative decoding later); never run here
        self.keep_mtp = keep_mtp
        self.mtp_weights: dict[str, torch.Tensor | QuantizedTensor] = {}
        self.cache: ModelCache | None = None

    # ---------------------------------------------------------------- weights

    def weight_slots(self) -> dict[str, tuple[WeightHolder, str, WeightSpec]]:
        """Every tensor this model needs: HF name -> (holder module, attribute, spec)."""
        slots = {}
        for mod_name, mod in self.named_modules():
            if isinstance(mod, WeightHolder):
                for attr, spec in mod.weight_specs().items():
                    slots[f"{mod_name}.{attr}" if mod_name else attr] = (mod, attr, spec)
        return slots

    def _convert(self, name: str, t: torch.Tensor, spec: WeightSpec) -> torch.Tensor:
        """To the device first (conversion is faster there), then to the slot's dtype, with a
        range check when narrowing to float16."""
        target = spec.dtype or self.dtype
        t = t.to(self.device)
        if t.dtype != target:
            if target == torch.float16 and t.dtype in (torch.bfloat16, torch.float32) and t.numel():
                big = float(t.abs().max())
                if big > _FP16_MAX and big != float("inf"):
                    raise G906Error(
                        f"tensor {name} holds values up to {big:.4g}, beyond float16's range (65504)",
                        hint="this checkpoint cannot run in float16; use dtype bfloat16 or float32 "
                        "on a device that supports them",
                    )
            t = t.to(target)
        if tuple(t.shape) != tuple(spec.shape):
            t = t.reshape(spec.shape)
        return t.contiguous()

    def load_weights(self, weights: Iterable[tuple[str, torch.Tensor | QuantizedTensor]]) -> dict:
        """Load (name, tensor) pairs with HF names (text-only or multimodal wrapper names).
        Every tensor is checked against the config; a missing, unknown or mis-shaped tensor raises
        G906Error naming it. mtp.* weights are accepted and counted, and kept in self.mtp_weights
        when keep_mtp (never run). Returns {"weight_bytes": resident bytes, "quantized_tensors": n,
        "mtp_tensors": n seen, "mtp_kept": n resident}."""
        slots = self.weight_slots()
        loaded: set[str] = set()
        nbytes = 0
        nquant = 0
        nmtp = 0
        for raw_name, tensor in weights:
            name = _normalise_name(raw_name)
            if name is None:
                continue
            if name.startswith("mtp."):
                nmtp += 1
                if not self.keep_mtp:
                    continue
                if is_quantized(tensor):
                    tensor = tensor.to(self.device)
                else:
                    tensor = tensor.to(self.device, self.dtype if tensor.is_floating_point() else tensor.dtype)
                self.mtp_weights[name] = tensor
                nbytes += tensor.nbytes
                continue
            if name == "lm_head.weight" and self.lm_head is None:
                continue  # tied: the embedding serves as the output projection
            slot = slots.get(name)
            if slot is None:
                raise G906Error(
                    f"unexpected tensor {raw_name} in the checkpoint",
                    hint="the weights do not belong to a Qwen3.5 text model with this config",
                )
            mod, attr, spec = slot
            if isinstance(tensor, QuantizedExperts):
                check_shape(raw_name, tuple(tensor.shape), spec)
                value = tensor.to(self.device)
                nquant += 1
            elif is_quantized(tensor):
                check_shape(raw_name, tuple(tensor.shape), spec)
                if not spec.quantizable:
                    value = ops.dequantize_weight(tensor, spec.dtype or self.dtype).reshape(spec.shape).to(self.device)
                else:
                    value = tensor.to(self.device)
                    nquant += 1
            else:
                if not isinstance(tensor, torch.Tensor):
                    raise G906Error(f"tensor {raw_name}: not a tensor ({type(tensor).__name__})")
                check_shape(raw_name, tuple(tensor.shape), spec)
                value = self._convert(raw_name, tensor, spec)
            mod.set_weight(attr, value)
            if name not in loaded:
                nbytes += value.nbytes
            loaded.add(name)
        missing = [n for n in slots if n not in loaded]
        if not missing:
            self._post_load()
        if missing:
            more = f" (and {len(missing) - 5} more)" if len(missing) > 5 else ""
            raise G906Error(
                f"the checkpoint lacks tensor {missing[0]}" + (f"; also missing: {', '.join(missing[1:5])}{more}" if len(missing) > 1 else ""),
                hint="the files are incomplete or belong to a different model",
            )
        return {"weight_bytes": nbytes, "quantized_tensors": nquant, "mtp_tensors": nmtp,
                "mtp_kept": len(self.mtp_weights)}

    def _post_load(self) -> None:
        """Stack projections that share an input into one matmul (q/k/v; the four GDN input
        projections; gate/up) where their weights allow it."""
        for mod in self.modules():
            hook = getattr(mod, "post_load", None)
            if callable(hook):
                hook()
        if self.device.type == "cpu":         # the CPU matmul reads dense weights: dequantize once, here
            from g906.engine.cpu_weights import dequantize_for_cpu

            dequantize_for_cpu(self, skip=[] if self.lm_head is None else [self.model.embed_tokens.weight])

    # ---------------------------------------------------------------- cache

    def bind_cache(self, cache: ModelCache) -> None:
        """Point every layer at its cache tensors (full attention: k/v; linear: conv/ssm)."""
        self.cache = cache
        for i, layer in enumerate(self.model.layers):
            if layer.layer_type == "full_attention":
                layer.self_attn.k_cache = cache.k_cache[i]
                layer.self_attn.v_cache = cache.v_cache[i]
            else:
                layer.linear_attn.conv_state = cache.conv_state[i]
                layer.linear_attn.ssm_state = cache.ssm_state[i]

    # ---------------------------------------------------------------- compute

    @torch.inference_mode()
    def forward(self, input_ids: torch.Tensor, positions: torch.Tensor, ctx: ForwardContext) -> torch.Tensor:
        return self.model(input_ids, positions, ctx)

    @torch.inference_mode()
    def embed(self, input_ids: torch.Tensor) -> torch.Tensor:
        """The token embeddings (the MTP block shares them)."""
        return self.model.embed_tokens(input_ids)

    @torch.inference_mode()
    def rollback_linear_state(self, keep: torch.Tensor, snaps: torch.Tensor | None = None) -> None:
        """After a forward with ctx.keep_linear_inputs (a speculative verify step): end each
        sequence's linear-attention state after its first keep[i] tokens of that step. Full
        attention needs nothing: the KV of rejected positions lies beyond the sequence's length
        and is overwritten by the next step. snaps: [S, 3] rows (i, n, slot), the state of
        sequence i after n of its tokens copied into slot (prefix-cache snapshots of accepted
        positions; GatedDeltaNet.rollback)."""
        for layer in self.model.layers:
            if layer.layer_type == "linear_attention":
                layer.linear_attn.rollback(keep, snaps)

    def linear_attention_layers(self) -> list:
        return [layer.linear_attn for layer in self.model.layers if layer.layer_type == "linear_attention"]

    @torch.inference_mode()
    def snapshot_linear_state(self, snaps: list[tuple[int, int, int]], at: list[int]) -> None:
        """rollback_linear_state's snaps (row, n, slot) alone, before a rollback_linear_state_padded;
        at[j]: the index of snaps[j]'s row among the step's kept rows (ForwardContext.kept_rows)."""
        for la in self.linear_attention_layers():
            la.snapshot(snaps, at)

    @torch.inference_mode()
    def rollback_linear_state_padded(self, cu_keep: torch.Tensor, has_init: torch.Tensor) -> None:
        """rollback_linear_state with static shapes, for a graph (GatedDeltaNet.rollback_padded):
        cu_keep [B+1] int32, row i keeps the step's tokens cu_seqlens[i] .. cu_keep[i + 1]."""
        for la in self.linear_attention_layers():
            la.rollback_padded(cu_keep, has_init)

    @torch.inference_mode()
    def compute_logits(self, hidden: torch.Tensor) -> torch.Tensor:
        w = self.model.embed_tokens.weight if self.lm_head is None else self.lm_head.weight
        return ops.linear(hidden, w).float()
