"""The per-step batch description that every layer reads (nano-vllm style).

A step runs a flat batch of T new tokens from B sequences. Prefill steps may mix sequences
that start fresh with ones that continue (chunked prefill); decode steps have one token per
sequence. The cache tensors themselves are bound to the layers once (see g906/engine/cache.py);
this object only says where each token goes."""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np
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
    # a speculative verify step (g906/engine/spec): each linear-attention layer keeps its
    # sequences' states from before the step and the step's inputs, so that rollback_linear_state
    # can end them at the last accepted token
    keep_linear_inputs: bool = False
    # with keep_linear_inputs: the rows (int64) whose states before the step are kept; None: all
    # (a padded verify step keeps its sequences' rows, not its filler rows')
    kept_rows: torch.Tensor | None = None

    @property
    def num_seqs(self) -> int:
        return int(self.seq_lens.shape[0])


def write_step_rows(seqs, chunks, block_size: int, ids, pos, slots, cu, seq_lens, ctx_lens, tables,
                    state_slots, has_init) -> int:
    """Write a step's flat-batch inputs into host arrays (numpy views, long enough): per token
    its id, position and KV slot; per sequence its token offsets (cu[i + 1]), total and cached
    lengths, block table row (tables[i, :blocks]), state slot and whether its state carries.
    Sequence i contributes chunks[i] tokens from its first uncached one. Returns the token count."""
    off = 0
    for i, (s, n) in enumerate(zip(seqs, chunks)):
        start = s.num_cached_tokens
        ids[off:off + n] = s.token_ids[start:start + n]
        p = np.arange(start, start + n)
        pos[off:off + n] = p
        table = np.asarray(s.block_table, dtype=np.int64)
        tables[i, : len(table)] = table
        slots[off:off + n] = table[p // block_size] * block_size + p % block_size
        off += n
        cu[i + 1] = off
        seq_lens[i] = start + n
        ctx_lens[i] = start
        state_slots[i] = s.state_slot
        has_init[i] = start > 0
    return off
