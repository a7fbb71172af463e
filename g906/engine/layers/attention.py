"""Gated full attention (Qwen3.5): q_proj yields [q | gate] per head, per-head q/k RMSNorm
(zero-centred), partial rotary, GQA over the paged KV cache, output * sigmoid(gate) (fused into the
attention op), o_proj."""

from __future__ import annotations

import torch
from torch import nn

from g906.engine.context import ForwardContext
from g906.engine.layers import ops
from g906.engine.layers.linear import FusedProjections, Linear
from g906.engine.layers.norms import AddNorm, RMSNorm


class Attention(nn.Module):
    def __init__(self, hidden_size: int, num_heads: int, num_kv_heads: int, head_dim: int, eps: float):
        super().__init__()
        self.num_heads = num_heads
        self.num_kv_heads = num_kv_heads
        self.head_dim = head_dim
        self.scale = head_dim**-0.5
        self.q_proj = Linear(hidden_size, num_heads * head_dim * 2)
        self.k_proj = Linear(hidden_size, num_kv_heads * head_dim)
        self.v_proj = Linear(hidden_size, num_kv_heads * head_dim)
        self.o_proj = Linear(num_heads * head_dim, hidden_size)
        self.q_norm = RMSNorm(head_dim, eps)
        self.k_norm = RMSNorm(head_dim, eps)
        self.qkv = FusedProjections([self.q_proj, self.k_proj, self.v_proj])
        self.k_cache: torch.Tensor | None = None   # [num_blocks, block_size, Hkv, D], set by bind_cache
        self.v_cache: torch.Tensor | None = None

    def post_load(self) -> None:
        self.qkv.fuse()

    def forward(self, x, positions: torch.Tensor, rotary, ctx: ForwardContext, then: AddNorm | None = None):
        """x: a tensor or a NormedInput; then: as Linear.forward's."""
        h, hk, d = self.num_heads, self.num_kv_heads, self.head_dim
        qg, k, v = self.qkv(x)
        t = qg.shape[0]
        qg = qg.view(t, h, 2 * d)
        gate = qg[..., d:]
        v = v.reshape(t, hk, d)
        fused = getattr(rotary, "norm_and_rotate", None)     # not the multimodal steps' M-RoPE
        stored = fused is not None and self.k_cache is not None
        if fused is not None:                 # q: a strided view, read in place
            store = (v, self.k_cache, self.v_cache, ctx.slot_mapping) if stored else None
            q, k = fused(qg[..., :d], k.reshape(t, hk, d), self.q_norm, self.k_norm, positions, store)
        else:
            q = self.q_norm(qg[..., :d])
            k = self.k_norm(k.reshape(t, hk, d))
            rotary(q, k, positions)
        if self.k_cache is None:
            # No cache bound (e.g. a memory-profiling run): fresh sequences only; this step's
            # k/v serve as a paged cache with one token per block.
            k_cache, v_cache = k.view(t, 1, hk, d), v.view(t, 1, hk, d)
            cu = ctx.cu_seqlens_q.long()
            lens = cu[1:] - cu[:-1]
            cols = torch.arange(int(lens.max()) if t else 0, device=qg.device)
            block_tables = (cu[:-1, None] + cols[None, :]).clamp(max=max(t - 1, 0)).to(torch.int32)
            return self.o_proj(
                ops.prefill_attention(q, k_cache, v_cache, block_tables, ctx.cu_seqlens_q, lens.to(torch.int32),
                                      self.scale, gate=gate).reshape(t, h * d), then
            )
        if not stored:
            ops.store_kv(k, v, self.k_cache, self.v_cache, ctx.slot_mapping)
        if ctx.is_prefill:
            o = ops.prefill_attention(
                q, self.k_cache, self.v_cache, ctx.block_tables, ctx.cu_seqlens_q, ctx.seq_lens, self.scale,
                gate=gate, max_seqlen_q=ctx.max_seqlen_q,
            )
        else:
            o = ops.paged_decode_attention(
                q, self.k_cache, self.v_cache, ctx.block_tables, ctx.seq_lens, self.scale, gate=gate
            )
        return self.o_proj(o.reshape(t, h * d), then)
