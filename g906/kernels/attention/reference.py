"""PyTorch references for paged attention (fp32 math, output in q's dtype)."""

from __future__ import annotations

import torch


def _gather_kv(cache, block_table, n):
    bs = cache.shape[1]
    nblk = (n + bs - 1) // bs
    blocks = block_table[:nblk].long()
    return cache[blocks].reshape(nblk * bs, *cache.shape[2:])[:n]  # [n, Hk, D]


def _attend(q, k, v, scale, q_pos):
    """q [M,Hq,D] at absolute positions q_pos [M]; k, v [N,Hk,D]; causal on absolute positions."""
    hq, hk = q.shape[1], k.shape[1]
    g = hq // hk
    qf = q.float().transpose(0, 1)                               # [Hq, M, D]
    kf = k.float().repeat_interleave(g, dim=1).transpose(0, 1)   # [Hq, N, D]
    vf = v.float().repeat_interleave(g, dim=1).transpose(0, 1)
    s = (qf @ kf.transpose(1, 2)) * scale                        # [Hq, M, N]
    kpos = torch.arange(k.shape[0], device=q.device)
    s = s.masked_fill(kpos[None, None, :] > q_pos[None, :, None], float("-inf"))
    p = torch.softmax(s, dim=-1)
    return (p @ vf).transpose(0, 1)                              # [M, Hq, D]


def paged_decode_attention(q, k_cache, v_cache, block_tables, seq_lens, scale, *, gate=None):
    B = q.shape[0]
    out = torch.empty_like(q)
    for b in range(B):
        n = int(seq_lens[b])
        k = _gather_kv(k_cache, block_tables[b], n)
        v = _gather_kv(v_cache, block_tables[b], n)
        pos = torch.tensor([n - 1], device=q.device)
        o = _attend(q[b : b + 1], k, v, scale, pos)[0]
        if gate is not None:
            o = o * torch.sigmoid(gate[b].float())
        out[b] = o.to(q.dtype)
    return out


def prefill_attention(q, k_cache, v_cache, block_tables, cu_seqlens_q, seq_lens, scale, *,
                      gate=None, max_seqlen_q=None):
    out = torch.empty_like(q)
    B = seq_lens.shape[0]
    cu = cu_seqlens_q.tolist()
    for b in range(B):
        s, e = cu[b], cu[b + 1]
        if e == s:
            continue
        n = int(seq_lens[b])
        k = _gather_kv(k_cache, block_tables[b], n)
        v = _gather_kv(v_cache, block_tables[b], n)
        pos = torch.arange(n - (e - s), n, device=q.device)
        o = _attend(q[s:e], k, v, scale, pos)
        if gate is not None:
            o = o * torch.sigmoid(gate[s:e].float())
        out[s:e] = o.to(q.dtype)
    return out
