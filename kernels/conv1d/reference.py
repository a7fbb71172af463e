"""PyTorch references for the causal depthwise conv1d + SiLU.

conv_states[slot] holds the last K-1 inputs of a sequence, oldest first ([C, K-1])."""

from __future__ import annotations

import torch
import torch.nn.functional as F


def causal_conv1d_prefill(x, weight, cu_seqlens, conv_states, state_slots, has_initial_state):
    T, C = x.shape
    K = weight.shape[1]
    out = torch.empty_like(x)
    cu = cu_seqlens.tolist()
    w = weight.float()
    for b in range(len(cu) - 1):
        s, e = cu[b], cu[b + 1]
        slot = int(state_slots[b])
        if bool(has_initial_state[b]):
            init = conv_states[slot].float()                       # [C, K-1]
        else:
            init = torch.zeros(C, K - 1, device=x.device, dtype=torch.float32)
        seq = torch.cat([init, x[s:e].float().t()], dim=1)        # [C, K-1+L]
        if e > s:
            y = F.conv1d(seq[None], w[:, None, :], groups=C)[0]    # [C, L]
            out[s:e] = F.silu(y).t().to(x.dtype)
        conv_states[slot] = seq[:, seq.shape[1] - (K - 1):].to(conv_states.dtype)
    return out


def causal_conv1d_decode(x, weight, conv_states, state_slots):
    slots = state_slots.long()
    st = conv_states[slots].float()                                # [B, C, K-1]
    seq = torch.cat([st, x.float()[:, :, None]], dim=2)            # [B, C, K]
    y = (seq * weight.float()[None]).sum(-1)
    conv_states[slots] = seq[:, :, 1:].to(conv_states.dtype)
    return F.silu(y).to(x.dtype)
