"""PyTorch references for the causal depthwise conv1d + SiLU.

conv_states[slot] is a ring of the sequence's last inputs ([C, K]): the input of token t (its
index in the sequence) sits in column t % K. A step at token t reads the K-1 columns of tokens
t-K+1 .. t-1 (those >= 0; earlier taps are zero) and writes column t % K, which held token t-K:
no column is both read and written in one step, so a decode kernel whose programs share
channels can read and update the ring without ordering them."""

from __future__ import annotations

import torch
import torch.nn.functional as F


def _earlier_inputs(rings, t):
    """[B, C, K-1] fp32: the inputs of tokens t-K+1 .. t-1 from rings [B, C, K] (t [B], int64),
    oldest first, zero for tokens < 0."""
    B, C, K = rings.shape
    tok = t[:, None] - (K - 1) + torch.arange(K - 1, device=rings.device)     # [B, K-1]
    taps = rings.gather(2, (tok % K)[:, None, :].expand(B, C, K - 1)).float()
    return torch.where((tok >= 0)[:, None, :], taps, 0.0)


def causal_conv1d_prefill(x, weight, cu_seqlens, conv_states, state_slots, has_initial_state,
                          context_lens):
    """context_lens[b]: the index of sequence b's first new token (tokens already cached)."""
    T, C = x.shape
    K = weight.shape[1]
    out = torch.empty_like(x)
    cu = cu_seqlens.tolist()
    w = weight.float()
    for b in range(len(cu) - 1):
        s, e = cu[b], cu[b + 1]
        slot = int(state_slots[b])
        start = int(context_lens[b])
        if bool(has_initial_state[b]):
            first = torch.tensor([start], device=x.device)
            init = _earlier_inputs(conv_states[slot][None], first)[0]     # [C, K-1]
        else:
            init = torch.zeros(C, K - 1, device=x.device, dtype=torch.float32)
        seq = torch.cat([init, x[s:e].float().t()], dim=1)        # [C, K-1+L]
        if e > s:
            y = F.conv1d(seq[None], w[:, None, :], groups=C)[0]    # [C, L]
            out[s:e] = F.silu(y).t().to(x.dtype)
        for p in range(max(s, e - (K - 1)), e):                    # the last K-1 new inputs
            conv_states[slot, :, (start + p - s) % K] = x[p].to(conv_states.dtype)
    return out


def causal_conv1d_decode(x, weight, conv_states, state_slots, seq_lens):
    """One new token per sequence, at index seq_lens[b] - 1: x [B, C] -> [B, C]."""
    K = weight.shape[1]
    slots = state_slots.long()
    t = seq_lens.long() - 1
    seq = torch.cat([_earlier_inputs(conv_states[slots], t), x.float()[:, :, None]], dim=2)
    y = (seq * weight.float()[None]).sum(-1)
    conv_states[slots, :, t % K] = x.to(conv_states.dtype)
    return F.silu(y).to(x.dtype)
