"""PyTorch reference of the group-quantized matmul: unpack, dequantize, multiply (float32)."""

from __future__ import annotations

import torch

from .weight import GroupQuantWeight


def unpack_rows(words: torch.Tensor, bits: int) -> torch.Tensor:
    """int32 words [..., W] -> int64 values [..., W * 32 // bits], value i of a word in its bits
    [i * bits, (i + 1) * bits) (the K-packed order of GroupQuantWeight)."""
    per = 32 // bits
    shifts = torch.arange(per, device=words.device, dtype=torch.int64) * bits
    v = (words.to(torch.int64)[..., None] >> shifts) & ((1 << bits) - 1)
    return v.reshape(*words.shape[:-1], words.shape[-1] * per)


def pack_rows(values: torch.Tensor, bits: int) -> torch.Tensor:
    """Inverse of unpack_rows: values in [0, 2 ** bits) [..., K] (K a multiple of 32 // bits)
    -> int32 words [..., K * bits // 32]."""
    per = 32 // bits
    v = values.to(torch.int64).reshape(*values.shape[:-1], values.shape[-1] // per, per)
    shifts = torch.arange(per, device=values.device, dtype=torch.int64) * bits
    word = (v << shifts).sum(-1)
    return torch.where(word >= 1 << 31, word - (1 << 32), word).to(torch.int32)


def dequantize(w: GroupQuantWeight, *, input_order: bool = False) -> torch.Tensor:
    """float32 [N, K]: (q - z) * s per group, in the weight's column order, or in the input
    features' order (input_order: an act-order weight's columns put back)."""
    N, K = w.shape
    q = unpack_rows(w.qweight, w.bits)[:, :K]
    gid = torch.arange(K, device=q.device) // w.group_size
    s = w.scales.float()[:, gid]
    z = (w.zeros.to(torch.int64)[:, gid] if w.zeros is not None
         else torch.full((), 1 << (w.bits - 1), dtype=torch.int64, device=q.device))
    out = (q - z).float() * s
    if input_order and w.perm is not None:
        full = torch.empty_like(out)
        full[:, w.perm] = out
        return full
    return out


def permute_input(x: torch.Tensor, w: GroupQuantWeight) -> torch.Tensor:
    """The activations in the weight's column order (act-order weights): a gather of x, once
    per call, so the matmul's loop over the weight never gathers."""
    return x if w.perm is None else x.index_select(-1, w.perm)


def group_quant_matmul(x: torch.Tensor, w: GroupQuantWeight) -> torch.Tensor:
    """x [T, K] @ dequantize(w)^T -> [T, N] in x's dtype (float32 math)."""
    xp = permute_input(x, w)
    return (xp.float() @ dequantize(w).t()).to(x.dtype)
