"""The checkpoint's multi-token-prediction (MTP) block, run as a drafter.

At position i it reads the target's final hidden state h_i and the next token x_{i+1}:

    x = fc([pre_fc_norm_embedding(embed(x_{i+1})) | pre_fc_norm_hidden(h_i)])
    x = decoder layer (gated full attention + SwiGLU MLP, its own KV cache)
    out_i = norm(x)          logits = the target's LM head (shared) on out_i

out_i predicts x_{i+2}. Drafting k tokens continues autoregressively from out_i: the next
position reads (out_i, the draft just made), as vLLM does for k > 1 (one MTP layer, reused).

Its KV cache lives beside the target's, paged by the same block tables: the MTP position i is
written when the target has computed position i, so the two caches cover the same tokens;
positions written while drafting are overwritten by the next catch-up. Embedding and LM head
are the target's (model.embed / model.compute_logits), tensor-parallel when the target is; the
block itself is small and runs whole on rank 0."""

from __future__ import annotations

import dataclasses

import torch
from torch import nn

from g906.arch.config import ModelConfig
from g906.engine.context import ForwardContext
from g906.engine.layers import ops
from g906.engine.layers.base import WeightHolder, check_shape
from g906.engine.layers.linear import Linear
from g906.engine.layers.norms import RMSNorm
from g906.engine.layers.rotary import RotaryEmbedding
from g906.engine.models.qwen35 import DecoderLayer
from g906.engine.weights import QuantizedTensor, is_quantized
from g906.errors import G906Error


class MTPBlock(nn.Module):
    """Module names mirror the checkpoint's mtp.* names (mtp.fc.weight, mtp.layers.0.self_attn...)."""

    def __init__(self, config: ModelConfig, *, dtype: torch.dtype, device, max_positions: int):
        super().__init__()
        if config.num_mtp_layers < 1:
            raise G906Error("this model has no MTP block")
        H, eps = config.hidden_size, config.rms_norm_eps
        one = dataclasses.replace(config, num_hidden_layers=1, layer_types=["full_attention"])
        self.config = config
        self.dtype = dtype
        self.device = torch.device(device)
        self.fc = Linear(2 * H, H)
        self.pre_fc_norm_embedding = RMSNorm(H, eps)
        self.pre_fc_norm_hidden = RMSNorm(H, eps)
        self.layers = nn.ModuleList([DecoderLayer(one, 0) for _ in range(config.num_mtp_layers)])
        self.norm = RMSNorm(H, eps)
        self.rotary = RotaryEmbedding(config.rotary_dim, config.rope_theta, max_positions, self.device)

    # -- weights ---------------------------------------------------------------------------------
    def load(self, weights: dict[str, torch.Tensor | QuantizedTensor]) -> None:
        """The model's kept mtp.* tensors (HF names and conventions), checked like the target's."""
        slots = {}
        for mod_name, mod in self.named_modules():
            if isinstance(mod, WeightHolder):
                for attr, spec in mod.weight_specs().items():
                    slots[f"mtp.{mod_name}.{attr}"] = (mod, attr, spec)
        seen = set()
        for name, t in weights.items():
            slot = slots.get(name)
            if slot is None:
                raise G906Error(f"unexpected MTP tensor {name} in the checkpoint",
                                hint="the MTP block does not match this model's config")
            mod, attr, spec = slot
            check_shape(name, tuple(t.shape), spec)
            if is_quantized(t):       # GGUF blocks, int4/int8 groups, stacked experts of either
                value = t if spec.quantizable else ops.dequantize_weight(t, spec.dtype or self.dtype).reshape(spec.shape)
                value = value.to(self.device)
            else:
                value = t.to(self.device, spec.dtype or self.dtype)
                if tuple(value.shape) != tuple(spec.shape):
                    value = value.reshape(spec.shape)
                value = value.contiguous()
            mod.set_weight(attr, value)
            seen.add(name)
        missing = sorted(n for n in slots if n not in seen)
        if missing:
            raise G906Error(f"the checkpoint's MTP block lacks tensor {missing[0]}"
                            + (f" (and {len(missing) - 1} more)" if len(missing) > 1 else ""),
                            hint="speculative decoding with method \"mtp\" needs the whole block")
        for mod in self.modules():
            hook = getattr(mod, "post_load", None)
            if callable(hook):
                hook()

    def bind_cache(self, num_blocks: int, block_size: int) -> int:
        """Allocate the block's paged KV cache (same blocks as the target's); returns its bytes."""
        c = self.config
        n = 0
        for layer in self.layers:
            shape = (num_blocks, block_size, c.num_key_value_heads, c.head_dim)
            layer.self_attn.k_cache = torch.zeros(shape, dtype=self.dtype, device=self.device)
            layer.self_attn.v_cache = torch.zeros(shape, dtype=self.dtype, device=self.device)
            n += 2 * layer.self_attn.k_cache.numel() * layer.self_attn.k_cache.element_size()
        return n

    # -- compute ---------------------------------------------------------------------------------
    @torch.inference_mode()
    def forward(self, embeds: torch.Tensor, hidden: torch.Tensor, positions: torch.Tensor,
                ctx: ForwardContext, step: int = 0) -> torch.Tensor:
        """embeds: the target's embeddings of the next tokens [T, H]; hidden: the target's (or
        this block's previous) final hidden states [T, H]. Returns the normed output [T, H]."""
        e = self.pre_fc_norm_embedding(embeds)
        h = self.pre_fc_norm_hidden(hidden.to(e.dtype))
        x = self.fc(torch.cat([e, h], dim=-1))
        layer = self.layers[step % len(self.layers)]
        x, residual = layer(x, None, positions, self.rotary, ctx)
        x, _ = self.norm(x, residual)
        return x


def mtp_kv_bytes_per_block(config: ModelConfig, block_size: int, itemsize: int) -> int:
    """KV bytes one block of the MTP block's cache takes (for the cache budget)."""
    return config.num_mtp_layers * 2 * block_size * config.num_key_value_heads * config.head_dim * itemsize
