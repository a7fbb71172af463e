"""PyTorch references for the gated delta rule.

Per value head h (key head kh(h): "grouped" -> h // (Hv/Hk), "tiled" -> h % Hk), per token:
    q, k = l2norm(q), l2norm(k) (eps 1e-6);  q *= Dk**-0.5
    beta = sigmoid(b);  g = -exp(A_log) * softplus(a + dt_bias)
    S = exp(g) S;  S += k (beta (v - S^T k))^T;  o = S^T q
with the state S [Dk, Dv] in fp32.  `gated_delta_rule_prefill` uses a chunked formulation (a
triangular solve per chunk, then a scan over chunks), which equals the recurrence
`gated_delta_rule_recurrent` up to rounding.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F

from ..conv1d.reference import causal_conv1d_decode
from ..norm.reference import gated_rms_norm


def kv_head_index(hv: int, hk: int, order: str, device=None) -> torch.Tensor:
    """Key head of each value head: 'grouped' j // (Hv/Hk) (HF), 'tiled' j % Hk (llama.cpp GGUF)."""
    j = torch.arange(hv, device=device)
    if order == "grouped":
        return j // (hv // hk)
    if order == "tiled":
        return j % hk
    raise ValueError(f"v_head_order must be 'grouped' or 'tiled', not {order!r}")


def _l2norm(x, eps=1e-6):
    return x * torch.rsqrt((x * x).sum(-1, keepdim=True) + eps)


def _prep(q, k, v, a, b, A_log, dt_bias, v_head_order):
    """fp32 per-v-head q, k (normalised, q scaled), v, g, beta: [..., Hv, *]."""
    hk, hv = k.shape[-2], v.shape[-2]
    idx = kv_head_index(hv, hk, v_head_order, q.device)
    qf = _l2norm(q.float()).index_select(-2, idx) * (q.shape[-1] ** -0.5)
    kf = _l2norm(k.float()).index_select(-2, idx)
    g = -torch.exp(A_log.float()) * F.softplus(a.float() + dt_bias.float())
    beta = torch.sigmoid(b.float())
    return qf, kf, v.float(), g, beta


def gated_delta_rule_decode(q, k, v, a, b, A_log, dt_bias, ssm_states, state_slots, *,
                            v_head_order="grouped"):
    qf, kf, vf, g, beta = _prep(q, k, v, a, b, A_log, dt_bias, v_head_order)  # [B, Hv, *]
    slots = state_slots.long()
    S = ssm_states[slots].float() * torch.exp(g)[..., None, None]            # [B, Hv, Dk, Dv]
    kv_mem = torch.einsum("bhkv,bhk->bhv", S, kf)
    delta = (vf - kv_mem) * beta[..., None]
    S = S + kf[..., :, None] * delta[..., None, :]
    o = torch.einsum("bhkv,bhk->bhv", S, qf)
    ssm_states[slots] = S.to(ssm_states.dtype)
    return o.to(v.dtype)


def conv_gated_delta_rule_decode(qkv, conv_weight, conv_states, seq_lens, a, b, A_log, dt_bias,
                                 ssm_states, state_slots, *, num_k_heads, head_k_dim,
                                 v_head_order="grouped", gated_norm=None):
    """The conv1d decode step on the raw projection qkv [B, 2 Hk Dk + Hv Dv] ([q | k | v]
    channels), then gated_delta_rule_decode on its output split into heads; gated_norm =
    (z, weight, eps): then gated_rms_norm(o, z, weight, eps)."""
    B = qkv.shape[0]
    key_dim = num_k_heads * head_k_dim
    y = causal_conv1d_decode(qkv, conv_weight, conv_states, state_slots, seq_lens)
    q, k, v = y.split([key_dim, key_dim, y.shape[1] - 2 * key_dim], dim=-1)
    shape = (B, num_k_heads, head_k_dim)
    o = gated_delta_rule_decode(q.reshape(shape), k.reshape(shape), v.reshape(B, a.shape[1], -1),
                                a, b, A_log, dt_bias, ssm_states, state_slots,
                                v_head_order=v_head_order)
    return o if gated_norm is None else gated_rms_norm(o, *gated_norm)


def gated_delta_rule_recurrent(q, k, v, a, b, A_log, dt_bias, cu_seqlens, ssm_states,
                               state_slots, has_initial_state, *, v_head_order="grouped"):
    """Token-by-token recurrence over a flat varlen batch (the ground truth; slow)."""
    qf, kf, vf, g, beta = _prep(q, k, v, a, b, A_log, dt_bias, v_head_order)  # [T, Hv, *]
    out = torch.empty(v.shape, dtype=torch.float32, device=v.device)
    cu = cu_seqlens.tolist()
    hv, dk, dv = v.shape[1], k.shape[2], v.shape[2]
    for s_i in range(len(cu) - 1):
        slot = int(state_slots[s_i])
        S = (ssm_states[slot].float().clone() if bool(has_initial_state[s_i])
             else torch.zeros(hv, dk, dv, device=v.device))
        for t in range(cu[s_i], cu[s_i + 1]):
            S = S * torch.exp(g[t])[:, None, None]
            kv_mem = torch.einsum("hkv,hk->hv", S, kf[t])
            delta = (vf[t] - kv_mem) * beta[t][:, None]
            S = S + kf[t][:, :, None] * delta[:, None, :]
            out[t] = torch.einsum("hkv,hk->hv", S, qf[t])
        ssm_states[slot] = S.to(ssm_states.dtype)
    return out.to(v.dtype)


def _chunked_one(qf, kf, vf, g, beta, S, chunk_size):
    """One sequence: qf, kf [L, H, Dk], vf [L, H, Dv], g, beta [L, H], S [H, Dk, Dv] (fp32)."""
    L = qf.shape[0]
    C = chunk_size
    pad = (-L) % C
    def to_chunks(x):
        x = x.transpose(0, 1)                                       # [H, L, ...]
        if pad:
            x = F.pad(x, (0, 0, 0, pad) if x.dim() == 3 else (0, pad))
        return x.reshape(x.shape[0], -1, C, *x.shape[2:])           # [H, N, C, ...]
    q_, k_, v_, g_, b_ = (to_chunks(t) for t in (qf, kf, vf, g, beta))
    gc = g_.cumsum(-1)                                              # [H, N, C]
    diff = gc[..., :, None] - gc[..., None, :]                      # [H, N, C, C]
    lower = torch.ones(C, C, dtype=torch.bool, device=qf.device).tril()
    decay = torch.where(lower, diff, torch.full_like(diff, float("-inf"))).exp()
    kk = k_ @ k_.transpose(-1, -2)
    A = (b_[..., :, None] * kk * decay).tril(-1)
    eye = torch.eye(C, device=qf.device)
    rhs = torch.cat([v_ * b_[..., None], k_ * (b_ * gc.exp())[..., None]], dim=-1)
    X = torch.linalg.solve_triangular(A + eye, rhs, upper=False, unitriangular=True)
    dv = vf.shape[-1]
    U, W = X[..., :dv], X[..., dv:]
    qk = (q_ @ k_.transpose(-1, -2)) * decay                         # includes the diagonal
    q_dec = q_ * gc.exp()[..., None]
    k_dec = k_ * (gc[..., -1:] - gc).exp()[..., None]
    last = gc[..., -1].exp()                                        # [H, N]
    out = torch.empty_like(v_)
    for n in range(q_.shape[1]):
        v_new = U[:, n] - W[:, n] @ S
        out[:, n] = q_dec[:, n] @ S + qk[:, n] @ v_new
        S = S * last[:, n, None, None] + k_dec[:, n].transpose(-1, -2) @ v_new
    out = out.reshape(out.shape[0], -1, dv)[:, :L].transpose(0, 1)
    return out, S


def gated_delta_rule_prefill(q, k, v, a, b, A_log, dt_bias, cu_seqlens, ssm_states, state_slots,
                             has_initial_state, *, v_head_order="grouped", chunk_size=64):
    qf, kf, vf, g, beta = _prep(q, k, v, a, b, A_log, dt_bias, v_head_order)
    out = torch.empty(v.shape, dtype=torch.float32, device=v.device)
    cu = cu_seqlens.tolist()
    hv, dk, dv = v.shape[1], k.shape[2], v.shape[2]
    for s_i in range(len(cu) - 1):
        s, e = cu[s_i], cu[s_i + 1]
        slot = int(state_slots[s_i])
        S = (ssm_states[slot].float().clone() if bool(has_initial_state[s_i])
             else torch.zeros(hv, dk, dv, device=v.device))
        if e > s:
            o, S = _chunked_one(qf[s:e], kf[s:e], vf[s:e], g[s:e], beta[s:e], S, chunk_size)
            out[s:e] = o
        ssm_states[slot] = S.to(ssm_states.dtype)
    return out.to(v.dtype)
