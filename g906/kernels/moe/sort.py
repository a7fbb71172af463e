"""Token/expert pairs grouped by expert for the grouped GEMM (kernel.py).

Pair p = t * k + j is token t's j-th chosen expert. The pairs of each expert are listed together,
each expert's run padded to whole tiles of block_m rows, so one GEMM tile reads one expert's
weights; padding entries hold num_pairs (masked out by the kernel). The number of tiles depends
on the routing, so the arrays are sized for the most tiles the call can need and unused tiles
carry expert -1 (the kernel skips them): nothing is read back to the host, and a CUDA graph can
capture the call."""

from __future__ import annotations

import torch


def max_tiles(num_pairs: int, num_experts: int, block_m: int) -> int:
    """The most tiles num_pairs pairs over num_experts experts can fill."""
    return num_pairs // block_m + min(num_experts, num_pairs)


def sort_by_expert(topk_ids: torch.Tensor, num_experts: int, block_m: int):
    """(sorted_pairs int32 [tiles * block_m], tile_expert int32 [tiles]) for topk_ids [T, k],
    tiles = max_tiles(T * k, num_experts, block_m); tile_expert -1 marks an unused tile."""
    flat = topk_ids.reshape(-1).long()
    n = flat.numel()
    dev = flat.device
    n_tiles = max_tiles(n, num_experts, block_m)
    order = torch.argsort(flat, stable=True)
    # a scatter-add, not torch.bincount: bincount reads the largest id back to the host to size
    # its output, which a CUDA graph capture (the prefill graphs) refuses
    counts = torch.zeros(num_experts, dtype=torch.long, device=dev).scatter_add_(0, flat, torch.ones_like(flat))
    tiles = (counts + block_m - 1) // block_m
    tiles_end = torch.cumsum(tiles, 0)                               # one past each expert's last tile
    tile_start = tiles_end - tiles
    # expert of each tile: the first expert whose tiles end after it (num_experts: unused)
    tile_expert = torch.searchsorted(tiles_end, torch.arange(n_tiles, device=dev), right=True)
    tile_expert = torch.where(tile_expert < num_experts, tile_expert, torch.full_like(tile_expert, -1))
    # slot of each sorted pair: its expert's first row + its rank within the expert
    sorted_e = flat[order]
    first = torch.cumsum(counts, 0) - counts
    rank = torch.arange(n, device=dev) - first[sorted_e]
    slot = tile_start[sorted_e] * block_m + rank
    sorted_pairs = torch.full((n_tiles * block_m,), n, dtype=torch.int32, device=dev)
    sorted_pairs[slot] = order.to(torch.int32)
    return sorted_pairs, tile_expert.to(torch.int32)
