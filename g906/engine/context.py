"""The per-step batch description that every layer reads (nano-vllm style).

A step runs a flat batch of T new tokens from B sequences. Prefill steps may mix sequences
that start fresh with ones that continue (chunked prefill); decode steps have one token per
sequence. The cache tensors themselves are bound to the layers once (see g906/engine/cache.py);
this object only says where each token goes."""

from __future__ import annotations

from dataclasses import dataclass

import torch


@dataclass
class ForwardContext:
    is_prefill: bool
    cu_seqlens_q: torch.Tensor      # int32 [B+1]: token offsets of each sequence in the flat batch
    seq_lens: torch.Tensor          # int32 [B]: each sequence's total length after this step
    context_lens: torch.Tensor      # int32 [B]: tokens already cached before this step (seq_lens - new)
    slot_mapping: torch.Tensor      # int64 [T]: KV-cache slot (block * block_size + offset) of each new token
    block_tables: torch.Tensor      # int32 [B, max_blocks]: KV block ids per sequence (-1 padded)
    state_slots: torch.Tensor       # int32 [B]: linear-attention state slot of each sequence
    has_initial_state: torch.Tensor  # bool [B]: whether the linear-attention state carries from an earlier step
    max_seqlen_q: int
    max_seqlen_k: int
    # multimodal rotary positions ([3, T]) when images are present; None for text-only steps
    mrope_positions: torch.Tensor | None = None
    # image embeddings written over the image-pad tokens: flat token indices [K] (int64) and the
    # rows [K, hidden] (g906/engine/vision); None when the step holds no image token
    mm_embed_index: torch.Tensor | None = None
    mm_embeds: torch.Tensor | None = None

    @property
    def num_seqs(self) -> int:
        return int(self.seq_lens.shape[0])
