"""Token/expert pairs grouped by expert for the grouped GEMM (kernel.py).

Pair p = t * k + j is token t's j-th chosen expert. The pairs of each expert are listed together,
each expert's run padded to whole tiles of block_m rows, so one GEMM tile reads one expert's
weights; padding entries hold num_pairs (masked out by the kernel)."""

from __future__ import annotations

import torch


def sort_by_expert(topk_ids: torch.Tensor, num_experts: int, block_m: int):
    """(sorted_pairs int32 [tiles * block_m], tile_expert int32 [tiles]) for topk_ids [T, k]."""
    flat = topk_ids.reshape(-1).long()
    n = flat.numel()
    dev = flat.device
    order = torch.argsort(flat, stable=True)
    counts = torch.bincount(flat, minlength=num_experts)
    tiles = (counts + block_m - 1) // block_m
    tile_start = torch.cumsum(tiles, 0) - tiles                       # first tile of each expert
    n_tiles = int(tiles.sum())
    tile_expert = torch.repeat_interleave(torch.arange(num_experts, device=dev), tiles)
    # slot of each sorted pair: its expert's first row + its rank within the expert
    sorted_e = flat[order]
    first = torch.cumsum(counts, 0) - counts
    rank = torch.arange(n, device=dev) - first[sorted_e]
    slot = tile_start[sorted_e] * block_m + rank
    sorted_pairs = torch.full((n_tiles * block_m,), n, dtype=torch.int32, device=dev)
    sorted_pairs[slot] = order.to(torch.int32)
    return sorted_pairs, tile_expert.to(torch.int32)
