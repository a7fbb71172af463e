"""What the routed-expert kernels over every weight storage share (kernel.py: dense and GGUF
blocks; int4.py: int4/int8 groups): the decode/prefill boundary, the tile product, a grouped
tile's pairs and columns, and the host side around the launches (the flattened routing, the
summing of a token's k rows)."""

from __future__ import annotations

from typing import NamedTuple

import torch
import triton
import triton.language as tl

from .._triton_util import empty

GEMV_MAX_TOKENS = 16       # up to this many tokens a call runs the routed GEMV, above the grouped GEMM


@triton.jit
def _dot_t(a, b, acc, FP32: tl.constexpr):
    """acc + a [M, K] @ b [N, K]^T (fp32 inputs: IEEE products; else b in a's dtype)."""
    if FP32:
        return acc + tl.dot(a, tl.trans(b), input_precision="ieee")
    return acc + tl.dot(a, tl.trans(b.to(a.dtype)))


@triton.jit
def _tile_pairs(pairs_ptr, pm, num_pairs, BLOCK_M: tl.constexpr):
    """The BLOCK_M pairs of grouped tile pm: which are real (a tile's tail past its expert's last
    pair is padding) and their indices, clamped to 0 where not (int64 for the offsets)."""
    rows = tl.load(pairs_ptr + pm * BLOCK_M + tl.arange(0, BLOCK_M))
    valid = rows < num_pairs
    return valid, tl.where(valid, rows, 0).to(tl.int64)


@triton.jit
def _tile_cols(N, BLOCK_N: tl.constexpr):
    """This program's BLOCK_N output columns (axis 1), their mask and the clamped int64 indices."""
    nn = tl.program_id(1) * BLOCK_N + tl.arange(0, BLOCK_N)
    nmask = nn < N
    return nn, nmask, tl.where(nmask, nn, 0).to(tl.int64)


class Routing(NamedTuple):
    """A routed-experts call's shapes, its output and the routing flattened by pair (p = t * k + j)."""
    T: int
    H: int
    k: int
    E: int
    inter: int
    y: torch.Tensor           # [T, H], x's dtype: the decode kernels' output
    ids: torch.Tensor         # [T * k] int32 expert of each pair
    tw: torch.Tensor          # [T * k] fp32 routing weight of each pair


def routing(x, w_gate_up, topk_ids, topk_weights) -> Routing:
    T, H = x.shape
    k = topk_ids.shape[1]
    E, two_i, _ = w_gate_up.shape
    y = empty((T, H), x.dtype, x.device)
    if T == 0:
        return Routing(T, H, k, E, two_i // 2, y, None, None)
    ids = topk_ids.reshape(-1).to(torch.int32).contiguous()
    tw = topk_weights.reshape(-1).to(torch.float32).contiguous()
    return Routing(T, H, k, E, two_i // 2, y, ids, tw)


def sum_pairs(out: torch.Tensor, r: Routing, dtype) -> torch.Tensor:
    """The grouped down GEMM's fp32 rows [T * k, H] summed over each token's k experts, in dtype."""
    return out.view(r.T, r.k, r.H).sum(dim=1).to(dtype)
