"""Plain-PyTorch reference ops used by the model layers.

Each function here has the name and calling convention of the matching op in
g906.kernels.ops (the kernels engineer's registry: Triton kernel or PyTorch reference per
device). The layers call them through this module only, so switching the model onto the
registry is a change of the import in g906/engine/layers/*.py.

Conventions: a step is a flat batch of T tokens from B sequences (see ForwardContext).
Paged KV caches are [num_blocks, block_size, num_kv_heads, head_dim]; linear-attention state
slots are conv_states [S, conv_dim, K-1] (model dtype) and ssm_states [S, Hv, Dk, Dv] (fp32).
"""

from __future__ import annotations

import torch
import torch.nn.functional as F

from g906.engine.weights import QuantizedTensor
from g906.errors import G906Error

# --------------------------------------------------------------------------------------------
# dense / quantized matmul


def dequantize_weight(w: QuantizedTensor, dtype: torch.dtype) -> torch.Tensor:
    """A QuantizedTensor as a dense [rows, cols] tensor of `dtype`."""
    try:
        from g906.engine.quant.dequant import dequantize
    except ImportError as exc:  # pragma: no cover - until the GGUF engineer's module lands
        raise G906Error(
            f"cannot compute with {w.qtype} weights: g906.engine.quant.dequant is unavailable ({exc})"
        ) from None
    return dequantize(w.data, w.qtype, w.shape).to(dtype)


def linear(x: torch.Tensor, weight: torch.Tensor | QuantizedTensor, bias: torch.Tensor | None = None) -> torch.Tensor:
    """y = x @ weight^T (+ bias); a QuantizedTensor is dequantized on the fly."""
    if isinstance(weight, QuantizedTensor):
        weight = dequantize_weight(weight, x.dtype)
    return F.linear(x, weight, bias)


# --------------------------------------------------------------------------------------------
# norms and activations


def rms_norm(
    x: torch.Tensor,
    weight: torch.Tensor,
    eps: float,
    residual: torch.Tensor | None = None,
    zero_centred: bool = False,
) -> torch.Tensor | tuple[torch.Tensor, torch.Tensor]:
    """RMSNorm over the last dim, computed in fp32, cast back to x.dtype.

    zero_centred: the weight is applied as (1 + weight) (Qwen3.5's HF checkpoints).
    residual: when given, x = x + residual first, and (normed, x + residual) is returned
    (the sum is the next residual stream)."""
    if residual is not None:
        x = x + residual
        new_residual = x
    xf = x.float()
    out = xf * torch.rsqrt(xf.pow(2).mean(-1, keepdim=True) + eps)
    w = weight.float()
    if zero_centred:
        w = w + 1.0
    out = (out * w).to(x.dtype)
    if residual is not None:
        return out, new_residual
    return out


def gated_rms_norm(x: torch.Tensor, z: torch.Tensor, weight: torch.Tensor, eps: float) -> torch.Tensor:
    """RMSNorm(x) * weight (plain weight) * silu(z), over the last dim; fp32 math."""
    xf = x.float()
    out = xf * torch.rsqrt(xf.pow(2).mean(-1, keepdim=True) + eps)
    out = out * weight.float() * F.silu(z.float())
    return out.to(x.dtype)


def silu_and_mul(x: torch.Tensor) -> torch.Tensor:
    """silu(x[..., :n]) * x[..., n:] for x of width 2n."""
    gate, up = x.chunk(2, dim=-1)
    return F.silu(gate) * up


# --------------------------------------------------------------------------------------------
# rotary


def rotary_cos_sin(positions: torch.Tensor, rotary_dim: int, theta: float) -> tuple[torch.Tensor, torch.Tensor]:
    """cos, sin [T, rotary_dim // 2] (fp32) for integer positions [T]."""
    inv_freq = 1.0 / (
        theta ** (torch.arange(0, rotary_dim, 2, dtype=torch.float32, device=positions.device) / rotary_dim)
    )
    freqs = positions.to(torch.float32)[:, None] * inv_freq[None, :]
    return freqs.cos(), freqs.sin()


def rotary_(q: torch.Tensor, k: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor) -> None:
    """In-place NeoX-style (rotate-half) rotary on the first 2*cos.shape[-1] dims of each head.

    q [T, Hq, D], k [T, Hk, D]; cos/sin [T, R/2] (fp32)."""
    half = cos.shape[-1]
    c = cos[:, None, :]
    s = sin[:, None, :]
    for t in (q, k):
        x1 = t[..., :half].float()
        x2 = t[..., half : 2 * half].float()
        o1 = x1 * c - x2 * s
        o2 = x2 * c + x1 * s
        t[..., :half] = o1.to(t.dtype)
        t[..., half : 2 * half] = o2.to(t.dtype)


# --------------------------------------------------------------------------------------------
# full attention over the paged KV cache


def store_kv(
    k: torch.Tensor, v: torch.Tensor, k_cache: torch.Tensor, v_cache: torch.Tensor, slot_mapping: torch.Tensor
) -> None:
    """Write k/v [T, Hk, D] at flat slots (block * block_size + offset); slots < 0 are skipped."""
    nb, bs = k_cache.shape[:2]
    kc = k_cache.view(nb * bs, *k_cache.shape[2:])
    vc = v_cache.view(nb * bs, *v_cache.shape[2:])
    slots = slot_mapping.to(torch.long)
    keep = slots >= 0
    if not bool(keep.all()):
        slots, k, v = slots[keep], k[keep], v[keep]
    kc.index_copy_(0, slots, k.to(kc.dtype))
    vc.index_copy_(0, slots, v.to(vc.dtype))


def _gather_kv(cache: torch.Tensor, block_table: torch.Tensor, length: int) -> torch.Tensor:
    bs = cache.shape[1]
    nblk = (length + bs - 1) // bs
    blocks = block_table[:nblk].to(torch.long)
    return cache.index_select(0, blocks).reshape(nblk * bs, *cache.shape[2:])[:length]


def _attend(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, scale: float, q_offset: int) -> torch.Tensor:
    """q [Lq, H, D] at positions q_offset.., k/v [Lk, Hk, D]; causal; fp32 softmax."""
    lq, h, _ = q.shape
    lk, hk, _ = k.shape
    if hk != h:
        k = k.repeat_interleave(h // hk, dim=1)
        v = v.repeat_interleave(h // hk, dim=1)
    scores = torch.einsum("qhd,khd->hqk", q.float(), k.float()) * scale
    qpos = torch.arange(lq, device=q.device)[:, None] + q_offset
    kpos = torch.arange(lk, device=q.device)[None, :]
    scores = scores.masked_fill(kpos > qpos, float("-inf"))
    probs = torch.softmax(scores, dim=-1)
    return torch.einsum("hqk,khd->qhd", probs, v.float()).to(q.dtype)


def prefill_attention(
    q: torch.Tensor,
    k_cache: torch.Tensor,
    v_cache: torch.Tensor,
    cu_seqlens_q: torch.Tensor,
    seq_lens: torch.Tensor,
    block_tables: torch.Tensor,
    scale: float,
) -> torch.Tensor:
    """Causal attention for a flat batch of new tokens q [T, H, D] whose keys/values (earlier
    context and this step's tokens, already stored with store_kv) live in the paged cache.
    Sequence b owns q rows cu_seqlens_q[b]:cu_seqlens_q[b+1], which are its last tokens of
    seq_lens[b] in total. Returns [T, H, D]."""
    out = torch.empty_like(q)
    cu = cu_seqlens_q.tolist()
    lens = seq_lens.tolist()
    for b in range(len(lens)):
        s, e = cu[b], cu[b + 1]
        if e == s:
            continue
        kb = _gather_kv(k_cache, block_tables[b], lens[b])
        vb = _gather_kv(v_cache, block_tables[b], lens[b])
        out[s:e] = _attend(q[s:e], kb, vb, scale, lens[b] - (e - s))
    return out


def varlen_attention(
    q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, cu_seqlens: torch.Tensor, scale: float
) -> torch.Tensor:
    """Causal attention without a cache (fresh sequences only): q [T, H, D], k/v [T, Hk, D]."""
    out = torch.empty_like(q)
    cu = cu_seqlens.tolist()
    for b in range(len(cu) - 1):
        s, e = cu[b], cu[b + 1]
        if e > s:
            out[s:e] = _attend(q[s:e], k[s:e], v[s:e], scale, 0)
    return out


def paged_decode_attention(
    q: torch.Tensor,
    k_cache: torch.Tensor,
    v_cache: torch.Tensor,
    block_tables: torch.Tensor,
    seq_lens: torch.Tensor,
    scale: float,
) -> torch.Tensor:
    """One query token per sequence: q [B, H, D] attends to the first seq_lens[b] cached
    tokens of its block table (the current token included). Returns [B, H, D]."""
    out = torch.empty_like(q)
    lens = seq_lens.tolist()
    for b in range(q.shape[0]):
        if lens[b] <= 0:
            out[b] = 0
            continue
        kb = _gather_kv(k_cache, block_tables[b], lens[b])
        vb = _gather_kv(v_cache, block_tables[b], lens[b])
        out[b] = _attend(q[b : b + 1], kb, vb, scale, lens[b] - 1)[0]
    return out


# --------------------------------------------------------------------------------------------
# Gated DeltaNet: causal depthwise conv1d


def causal_conv1d_prefill(
    x: torch.Tensor,
    weight: torch.Tensor,
    conv_states: torch.Tensor | None,
    cu_seqlens: torch.Tensor,
    state_slots: torch.Tensor | None,
    has_initial_state: torch.Tensor | None,
    activation: str | None = "silu",
) -> torch.Tensor:
    """Causal depthwise conv over each sequence of the flat batch x [T, C] with weight [C, K].

    A sequence with has_initial_state continues from conv_states[slot] ([C, K-1]: its last K-1
    inputs); otherwise it starts from zeros. The last K-1 inputs of each sequence are written
    back to conv_states[slot] (when conv_states is given). Returns [T, C] in x.dtype."""
    c, kw = weight.shape
    out = torch.empty_like(x)
    cu = cu_seqlens.tolist()
    for b in range(len(cu) - 1):
        s, e = cu[b], cu[b + 1]
        xs = x[s:e].t()  # [C, L]
        if conv_states is not None and has_initial_state is not None and bool(has_initial_state[b]):
            prev = conv_states[int(state_slots[b])].to(x.dtype)
        else:
            prev = x.new_zeros(c, kw - 1)
        full = torch.cat([prev, xs], dim=1)  # [C, K-1+L]
        y = F.conv1d(full.float()[None], weight.float()[:, None, :], groups=c)[0]  # [C, L]
        if activation == "silu":
            y = F.silu(y)
        out[s:e] = y.t().to(x.dtype)
        if conv_states is not None and state_slots is not None:
            conv_states[int(state_slots[b])] = full[:, -(kw - 1) :].to(conv_states.dtype)
    return out


def causal_conv1d_decode(
    x: torch.Tensor,
    weight: torch.Tensor,
    conv_states: torch.Tensor,
    state_slots: torch.Tensor,
    activation: str | None = "silu",
) -> torch.Tensor:
    """One new token per sequence: x [B, C]; conv_states[slot] [C, K-1] is read and shifted
    in place. Returns [B, C]."""
    slots = state_slots.to(torch.long)
    prev = conv_states.index_select(0, slots)  # [B, C, K-1]
    full = torch.cat([prev.to(x.dtype), x[:, :, None]], dim=2)  # [B, C, K]
    y = (full.float() * weight.float()[None]).sum(-1)
    if activation == "silu":
        y = F.silu(y)
    conv_states.index_copy_(0, slots, full[:, :, 1:].to(conv_states.dtype))
    return y.to(x.dtype)


# --------------------------------------------------------------------------------------------
# Gated DeltaNet: the gated delta rule


def _expand_heads(t: torch.Tensor, num_v_heads: int, order: str) -> torch.Tensor:
    """[..., Hk, D] -> [..., Hv, D]: 'grouped' (v head j uses k head j // r) or 'tiled' (j % Hk)."""
    hk = t.shape[-2]
    if hk == num_v_heads:
        return t
    r = num_v_heads // hk
    if order == "grouped":
        return t.repeat_interleave(r, dim=-2)
    if order == "tiled":
        reps = [1] * t.dim()
        reps[-2] = r
        return t.repeat(*reps)
    raise G906Error(f"unknown linear-attention value-head order {order!r}")


def _l2norm(x: torch.Tensor, eps: float = 1e-6) -> torch.Tensor:
    return x * torch.rsqrt((x * x).sum(-1, keepdim=True) + eps)


def _delta_rule_chunked(
    q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, g: torch.Tensor, beta: torch.Tensor,
    state: torch.Tensor, chunk: int,
) -> tuple[torch.Tensor, torch.Tensor]:
    """One sequence, fp32, heads first: q/k [H, L, Dk], v [H, L, Dv], g/beta [H, L],
    state [H, Dk, Dv]. Returns (o [H, L, Dv], final state).

    Within a chunk with cumulative log-decay G_t, the corrections u_t = beta_t (v_t - S_t'^T k_t)
    solve the unit-lower-triangular system (I + A) U = beta V - beta exp(G) K S0 with
    A[t, s] = beta_t exp(G_t - G_s) k_t.k_s (s < t); then
    o_t = exp(G_t) S0^T q_t + sum_{s<=t} exp(G_t - G_s) (q_t.k_s) u_s and
    S_end = exp(G_C) S0 + sum_s exp(G_C - G_s) k_s u_s^T."""
    h, length, dk = k.shape
    dv = v.shape[-1]
    pad = (-length) % chunk
    if pad:
        q, k, v = (F.pad(t, (0, 0, 0, pad)) for t in (q, k, v))
        g, beta = (F.pad(t, (0, pad)) for t in (g, beta))
    n = (length + pad) // chunk
    q = q.reshape(h, n, chunk, dk)
    k = k.reshape(h, n, chunk, dk)
    v = v.reshape(h, n, chunk, dv)
    g = g.reshape(h, n, chunk)
    beta = beta.reshape(h, n, chunk)

    cg = g.cumsum(-1)  # G_t
    diff = cg[..., :, None] - cg[..., None, :]  # G_t - G_s
    lower_incl = torch.ones(chunk, chunk, dtype=torch.bool, device=q.device).tril()
    decay = torch.where(lower_incl, diff, torch.full_like(diff, float("-inf"))).exp()  # s <= t
    kk = k @ k.transpose(-1, -2)
    strict = torch.ones(chunk, chunk, dtype=torch.bool, device=q.device).tril(-1)
    a = (beta[..., :, None] * kk * decay).masked_fill(~strict, 0.0)
    tri = a + torch.eye(chunk, dtype=a.dtype, device=a.device)
    bv = beta[..., None] * v
    bk = (beta * cg.exp())[..., None] * k
    w_v = torch.linalg.solve_triangular(tri, bv, upper=False, unitriangular=True)   # [h,n,C,Dv]
    w_k = torch.linalg.solve_triangular(tri, bk, upper=False, unitriangular=True)   # [h,n,C,Dk]
    qk = (q @ k.transpose(-1, -2)) * decay  # includes the diagonal
    q_dec = q * cg.exp()[..., None]
    k_end = k * (cg[..., -1:] - cg).exp()[..., None]
    end_decay = cg[..., -1].exp()  # [h, n]

    out = torch.empty(h, n, chunk, dv, dtype=torch.float32, device=q.device)
    s = state
    for i in range(n):
        u = w_v[:, i] - w_k[:, i] @ s
        out[:, i] = q_dec[:, i] @ s + qk[:, i] @ u
        s = s * end_decay[:, i, None, None] + k_end[:, i].transpose(-1, -2) @ u
    return out.reshape(h, n * chunk, dv)[:, :length], s


def gated_delta_rule_prefill(
    q: torch.Tensor,
    k: torch.Tensor,
    v: torch.Tensor,
    g: torch.Tensor,
    beta: torch.Tensor,
    ssm_states: torch.Tensor | None,
    cu_seqlens: torch.Tensor,
    state_slots: torch.Tensor | None,
    has_initial_state: torch.Tensor | None,
    head_order: str = "grouped",
    chunk_size: int = 64,
) -> torch.Tensor:
    """Chunked gated delta rule over each sequence of a flat batch.

    q/k [T, Hk, Dk] (raw: L2-normalised here, q also scaled by Dk^-0.5), v [T, Hv, Dv],
    g (log decay, <= 0) and beta [T, Hv]. head_order maps v heads to k heads ('grouped' or
    'tiled'). A sequence with has_initial_state starts from ssm_states[slot] ([Hv, Dk, Dv],
    fp32), else from zeros; its final state is written back when ssm_states is given.
    Returns o [T, Hv, Dv] in v.dtype; all math in fp32."""
    hv, dv = v.shape[1], v.shape[2]
    dk = k.shape[2]
    qf = _l2norm(q.float()) * dk**-0.5
    kf = _l2norm(k.float())
    qf = _expand_heads(qf, hv, head_order)
    kf = _expand_heads(kf, hv, head_order)
    vf, gf, bf = v.float(), g.float(), beta.float()
    out = torch.empty(v.shape, dtype=v.dtype, device=v.device)
    cu = cu_seqlens.tolist()
    for b in range(len(cu) - 1):
        s, e = cu[b], cu[b + 1]
        if e == s:
            continue
        if ssm_states is not None and has_initial_state is not None and bool(has_initial_state[b]):
            init = ssm_states[int(state_slots[b])].float()
        else:
            init = torch.zeros(hv, dk, dv, dtype=torch.float32, device=v.device)
        o, final = _delta_rule_chunked(
            qf[s:e].transpose(0, 1), kf[s:e].transpose(0, 1), vf[s:e].transpose(0, 1),
            gf[s:e].t(), bf[s:e].t(), init, chunk_size,
        )
        out[s:e] = o.transpose(0, 1).to(v.dtype)
        if ssm_states is not None and state_slots is not None:
            ssm_states[int(state_slots[b])] = final.to(ssm_states.dtype)
    return out


def gated_delta_rule_decode(
    q: torch.Tensor,
    k: torch.Tensor,
    v: torch.Tensor,
    g: torch.Tensor,
    beta: torch.Tensor,
    ssm_states: torch.Tensor,
    state_slots: torch.Tensor,
    head_order: str = "grouped",
) -> torch.Tensor:
    """One recurrent step per sequence: q/k [B, Hk, Dk], v [B, Hv, Dv], g/beta [B, Hv];
    ssm_states[slot] is read and updated in place. Returns o [B, Hv, Dv] in v.dtype."""
    hv = v.shape[1]
    dk = k.shape[2]
    qf = _expand_heads(_l2norm(q.float()) * dk**-0.5, hv, head_order)
    kf = _expand_heads(_l2norm(k.float()), hv, head_order)
    slots = state_slots.to(torch.long)
    s = ssm_states.index_select(0, slots).float()  # [B, Hv, Dk, Dv]
    s = s * g.float().exp()[..., None, None]
    pred = torch.einsum("bhkv,bhk->bhv", s, kf)
    u = (v.float() - pred) * beta.float()[..., None]
    s = s + kf[..., :, None] * u[..., None, :]
    o = torch.einsum("bhkv,bhk->bhv", s, qf)
    ssm_states.index_copy_(0, slots, s.to(ssm_states.dtype))
    return o.to(v.dtype)
