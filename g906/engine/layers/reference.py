"""Plain-PyTorch reference ops of the model, written independently of g906.kernels.

Each function has the name and calling convention of the matching op in g906.kernels.ops, so
g906/engine/layers/ops.py can point the layers at either set with one import line. Tests run
the model on both and compare (a second opinion on the kernels' own references).

Conventions: a step is a flat batch of T tokens from B sequences (see ForwardContext).
Paged KV caches are [num_blocks, block_size, num_kv_heads, head_dim]; linear-attention state
slots are conv_states [S, conv_dim, K] (model dtype; a ring: token t's input in column t % K)
and ssm_states [S, Hv, Dk, Dv] (fp32).
"""

from __future__ import annotations

import torch
import torch.nn.functional as F

from g906.engine.weights import QuantizedTensor
from g906.kernels.int4.weight import is_group_quant
from g906.kernels.gdn.reference import kv_head_index  # one definition of the head mapping

# --------------------------------------------------------------------------------------------
# dense / quantized matmul


def dequantize_weight(w, dtype: torch.dtype) -> torch.Tensor:
    """A QuantizedTensor or GroupQuantWeight as a dense [rows, cols] tensor of `dtype`."""
    from g906.engine.quant.dequant import dequantize

    if is_group_quant(w):
        from g906.kernels.int4.reference import dequantize as gq_dequantize

        return gq_dequantize(w, input_order=True).to(dtype)

    return dequantize(w.data, w.qtype, w.shape).to(dtype)


def embedding(weight: QuantizedTensor, ids: torch.Tensor, dtype: torch.dtype) -> torch.Tensor:
    """Rows ids of a quantized embedding table, dequantized to `dtype`."""
    return dequantize_weight(weight.select_rows(ids), dtype)


def linear(x: torch.Tensor, weight: torch.Tensor | QuantizedTensor) -> torch.Tensor:
    """y = x @ weight^T; a QuantizedTensor is dequantized on the fly."""
    if isinstance(weight, QuantizedTensor) or is_group_quant(weight):
        weight = dequantize_weight(weight, x.dtype)
    return F.linear(x, weight)


def linear_pair(x: torch.Tensor, w0, w1) -> tuple[torch.Tensor, torch.Tensor]:
    return linear(x, w0), linear(x, w1)


def linear_fuses_norm(x, weight) -> bool:
    """This module computes each RMSNorm on its own (no add_norm / rms_of in its linear)."""
    return False


# --------------------------------------------------------------------------------------------
# norms and activations


def rms_norm(x, weight, eps, *, residual=None, zero_centred=False):
    """RMSNorm over the last dim, fp32 math, output in x.dtype.

    zero_centred: the weight is applied as (1 + weight) (Qwen3.5's HF checkpoints).
    residual: when given, h = x + residual (rounded to x.dtype, as a separate add would be) is
    normalised and (normed, h) is returned; h is the next residual stream."""
    dtype = x.dtype
    if residual is not None:
        h = x + residual
        new_residual = h
    else:
        h = x
    hf = h.float()
    w = weight.float()
    if zero_centred:
        w = w + 1.0
    out = (hf * torch.rsqrt(hf.pow(2).mean(-1, keepdim=True) + eps) * w).to(dtype)
    if residual is not None:
        return out, new_residual
    return out


def gated_rms_norm(x, z, weight, eps):
    """RMSNorm(x) * weight (plain weight) * silu(z), over the last dim; fp32 math."""
    xf = x.float()
    out = xf * torch.rsqrt(xf.pow(2).mean(-1, keepdim=True) + eps)
    return (out * weight.float() * F.silu(z.float())).to(x.dtype)


def silu_and_mul(x):
    """silu(x[..., :n]) * x[..., n:] for x of width 2n."""
    gate, up = x.chunk(2, dim=-1)
    return F.silu(gate) * up


def silu_mul_linear(x, weight):
    """linear(silu_and_mul(x), weight): the MLP's down projection (a fused kernel on GPUs)."""
    return linear(silu_and_mul(x), weight)


def linear_glu(x, weight):
    """silu_and_mul(linear(x, weight)), weight = [gate; up]: the MLP's gate/up projection and
    its SwiGLU (one GEMV kernel at decode on GPUs)."""
    return silu_and_mul(linear(x, weight))


def gated_norm_linear(o, z, norm_weight, eps, weight):
    """linear(gated_rms_norm(o, z, ...) over the heads' last dim, flattened to [T, H * D])."""
    return linear(gated_rms_norm(o, z, norm_weight, eps).flatten(1), weight)


# --------------------------------------------------------------------------------------------
# rotary


def qk_norm_rotary(q, k, q_weight, k_weight, eps, positions, cos_sin_cache, rot_dim, *, zero_centred=False,
                   kv_store=None):
    """Per-head RMSNorm of q and k, then rotary_ on the results (new tensors); kv_store = (v, k_cache,
    v_cache, slot_mapping): then store_kv of the new k and v."""
    q = rms_norm(q, q_weight, eps, zero_centred=zero_centred).contiguous()
    k = rms_norm(k, k_weight, eps, zero_centred=zero_centred).contiguous()
    rotary_(q, k, positions, cos_sin_cache, rot_dim)
    if kv_store is not None:
        v, k_cache, v_cache, slot_mapping = kv_store
        store_kv(k, v, k_cache, v_cache, slot_mapping)
    return q, k


def make_cos_sin_cache(max_pos, rot_dim, base=10_000_000.0, device=None, dtype=torch.float32):
    """Rows [cos(p * inv_freq) | sin(p * inv_freq)] for p < max_pos; inv_freq_i = base^(-2i/rot_dim)."""
    inv = 1.0 / (base ** (torch.arange(0, rot_dim, 2, dtype=torch.float64) / rot_dim))
    ang = torch.arange(max_pos, dtype=torch.float64)[:, None] * inv[None, :]
    return torch.cat([ang.cos(), ang.sin()], dim=-1).to(device=device, dtype=dtype)


def rotary_(q, k, positions, cos_sin_cache, rot_dim):
    """In-place NeoX-style (rotate-half) rotary on the first rot_dim dims of each head.
    q [T, Hq, D], k [T, Hk, D], positions [T], cos_sin_cache [max_pos, rot_dim]."""
    half = rot_dim // 2
    cs = cos_sin_cache.index_select(0, positions.long()).float()
    cos = cs[:, None, :half]
    sin = cs[:, None, half:rot_dim]
    for t in (q, k):
        x1 = t[..., :half].float()
        x2 = t[..., half:rot_dim].float()
        o1 = x1 * cos - x2 * sin
        o2 = x2 * cos + x1 * sin
        t[..., :half] = o1.to(t.dtype)
        t[..., half:rot_dim] = o2.to(t.dtype)
    return q, k


# --------------------------------------------------------------------------------------------
# full attention over the paged KV cache


def store_kv(k, v, k_cache, v_cache, slot_mapping):
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


def _gather_kv(cache, block_table, length):
    bs = cache.shape[1]
    nblk = (length + bs - 1) // bs
    blocks = block_table[:nblk].to(torch.long)
    return cache.index_select(0, blocks).reshape(nblk * bs, *cache.shape[2:])[:length]


def _attend(q, k, v, scale, q_offset):
    """q [Lq, H, D] at positions q_offset.., k/v [Lk, Hk, D]; causal; fp32 math -> fp32."""
    lq, h, _ = q.shape
    hk = k.shape[1]
    if hk != h:
        k = k.repeat_interleave(h // hk, dim=1)
        v = v.repeat_interleave(h // hk, dim=1)
    scores = torch.einsum("qhd,khd->hqk", q.float(), k.float()) * scale
    qpos = torch.arange(lq, device=q.device)[:, None] + q_offset
    kpos = torch.arange(k.shape[0], device=q.device)[None, :]
    scores = scores.masked_fill(kpos > qpos, float("-inf"))
    return torch.einsum("hqk,khd->qhd", torch.softmax(scores, dim=-1), v.float())


def prefill_attention(q, k_cache, v_cache, block_tables, cu_seqlens_q, seq_lens, scale, *,
                      gate=None, max_seqlen_q=None):
    """Causal attention for a flat batch of new tokens q [T, H, D] whose keys/values (earlier
    context and this step's tokens, already stored with store_kv) live in the paged cache.
    Sequence b owns q rows cu_seqlens_q[b]:cu_seqlens_q[b+1], its last tokens of seq_lens[b].
    gate [T, H, D]: output multiplied by sigmoid(gate). Returns [T, H, D] in q.dtype."""
    out = torch.empty_like(q)
    cu = cu_seqlens_q.tolist()
    lens = seq_lens.tolist()
    for b in range(len(lens)):
        s, e = cu[b], cu[b + 1]
        if e == s:
            continue
        kb = _gather_kv(k_cache, block_tables[b], lens[b])
        vb = _gather_kv(v_cache, block_tables[b], lens[b])
        o = _attend(q[s:e], kb, vb, scale, lens[b] - (e - s))
        if gate is not None:
            o = o * torch.sigmoid(gate[s:e].float())
        out[s:e] = o.to(q.dtype)
    return out


def paged_decode_attention(q, k_cache, v_cache, block_tables, seq_lens, scale, *, gate=None):
    """One query token per sequence: q [B, H, D] attends to the first seq_lens[b] cached tokens
    of its block table (the current token included). gate as in prefill_attention."""
    out = torch.empty_like(q)
    lens = seq_lens.tolist()
    for b in range(q.shape[0]):
        kb = _gather_kv(k_cache, block_tables[b], lens[b])
        vb = _gather_kv(v_cache, block_tables[b], lens[b])
        o = _attend(q[b : b + 1], kb, vb, scale, lens[b] - 1)[0]
        if gate is not None:
            o = o * torch.sigmoid(gate[b].float())
        out[b] = o.to(q.dtype)
    return out


# --------------------------------------------------------------------------------------------
# Gated DeltaNet: causal depthwise conv1d (+ SiLU)


def _ring_inputs(ring, tokens):
    """[C, len(tokens)] fp32: the saved inputs of these sequence indices (zeros before 0); the
    ring [C, K] keeps the input of token t in column t % K."""
    kw = ring.shape[1]
    cols = torch.tensor([t % kw for t in tokens], dtype=torch.long, device=ring.device)
    keep = torch.tensor([t >= 0 for t in tokens], device=ring.device)
    return torch.where(keep[None, :], ring.index_select(1, cols).float(), 0.0)


def causal_conv1d_prefill(x, weight, cu_seqlens, conv_states, state_slots, has_initial_state,
                          context_lens):
    """Causal depthwise conv + SiLU over each sequence of the flat batch x [T, C], weight [C, K].
    Sequence b's new tokens start at its index context_lens[b]; with has_initial_state it
    continues from the inputs saved in conv_states[slot] (a ring [C, K], token t in column
    t % K), else from zeros. Its new inputs are saved in their columns."""
    c, kw = weight.shape
    out = torch.empty_like(x)
    cu = cu_seqlens.tolist()
    w = weight.float()[:, None, :]
    for b in range(len(cu) - 1):
        s, e = cu[b], cu[b + 1]
        slot, first = int(state_slots[b]), int(context_lens[b])
        ring = conv_states[slot]
        earlier = list(range(first - (kw - 1), first))
        if bool(has_initial_state[b]):
            prev = _ring_inputs(ring, earlier)
        else:
            prev = torch.zeros(c, kw - 1, dtype=torch.float32, device=x.device)
        full = torch.cat([prev, x[s:e].float().t()], dim=1)  # [C, K-1+L]
        if e > s:
            out[s:e] = F.silu(F.conv1d(full[None], w, groups=c)[0]).t().to(x.dtype)
        for j in range(max(0, e - s - (kw - 1)), e - s):      # the last K-1 new inputs
            ring[:, (first + j) % kw] = x[s + j].to(conv_states.dtype)
    return out


def causal_conv1d_decode(x, weight, conv_states, state_slots, seq_lens):
    """One new token per sequence, sequence index seq_lens[b] - 1: x [B, C]."""
    kw = weight.shape[1]
    out = torch.empty_like(x)
    for b in range(x.shape[0]):
        slot, t = int(state_slots[b]), int(seq_lens[b]) - 1
        ring = conv_states[slot]
        full = torch.cat([_ring_inputs(ring, range(t - kw + 1, t)), x[b].float()[:, None]], dim=1)
        out[b] = F.silu((full * weight.float()).sum(-1)).to(x.dtype)
        ring[:, t % kw] = x[b].to(conv_states.dtype)
    return out


def conv_gated_delta_rule_decode(qkv, conv_weight, conv_states, seq_lens, a, b, A_log, dt_bias,
                                 ssm_states, state_slots, *, num_k_heads, head_k_dim,
                                 v_head_order="grouped", gated_norm=None):
    """causal_conv1d_decode on the raw [q | k | v] projection, then the recurrent step (and
    gated_rms_norm(o, *gated_norm) when given)."""
    y = causal_conv1d_decode(qkv, conv_weight, conv_states, state_slots, seq_lens)
    kd = num_k_heads * head_k_dim
    n = qkv.shape[0]
    q = y[:, :kd].reshape(n, num_k_heads, head_k_dim)
    k = y[:, kd:2 * kd].reshape(n, num_k_heads, head_k_dim)
    v = y[:, 2 * kd:].reshape(n, a.shape[1], -1)
    o = gated_delta_rule_decode(q, k, v, a, b, A_log, dt_bias, ssm_states, state_slots,
                                v_head_order=v_head_order)
    return o if gated_norm is None else gated_rms_norm(o, *gated_norm)


# --------------------------------------------------------------------------------------------
# Gated DeltaNet: the gated delta rule


def _l2norm(x, eps=1e-6):
    return x * torch.rsqrt((x * x).sum(-1, keepdim=True) + eps)


def _prepare(q, k, v, a, b, A_log, dt_bias, order):
    hk, hv = k.shape[-2], v.shape[-2]
    idx = kv_head_index(hv, hk, order, q.device)
    qf = _l2norm(q.float()).index_select(-2, idx) * (q.shape[-1] ** -0.5)
    kf = _l2norm(k.float()).index_select(-2, idx)
    g = -torch.exp(A_log.float()) * F.softplus(a.float() + dt_bias.float())
    beta = torch.sigmoid(b.float())
    return qf, kf, v.float(), g, beta


def _delta_rule_chunked(q, k, v, g, beta, state, chunk):
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

    cg = g.cumsum(-1)
    diff = cg[..., :, None] - cg[..., None, :]
    lower_incl = torch.ones(chunk, chunk, dtype=torch.bool, device=q.device).tril()
    decay = torch.where(lower_incl, diff, torch.full_like(diff, float("-inf"))).exp()
    a = (beta[..., :, None] * (k @ k.transpose(-1, -2)) * decay).tril(-1)
    tri = a + torch.eye(chunk, dtype=a.dtype, device=a.device)
    rhs = torch.cat([beta[..., None] * v, (beta * cg.exp())[..., None] * k], dim=-1)
    sol = torch.linalg.solve_triangular(tri, rhs, upper=False, unitriangular=True)
    w_v, w_k = sol[..., :dv], sol[..., dv:]
    qk = (q @ k.transpose(-1, -2)) * decay
    q_dec = q * cg.exp()[..., None]
    k_end = k * (cg[..., -1:] - cg).exp()[..., None]
    end_decay = cg[..., -1].exp()

    out = torch.empty(h, n, chunk, dv, dtype=torch.float32, device=q.device)
    s = state
    for i in range(n):
        u = w_v[:, i] - w_k[:, i] @ s
        out[:, i] = q_dec[:, i] @ s + qk[:, i] @ u
        s = s * end_decay[:, i, None, None] + k_end[:, i].transpose(-1, -2) @ u
    return out.reshape(h, n * chunk, dv)[:, :length], s


def gated_delta_rule_prefill(q, k, v, a, b, A_log, dt_bias, cu_seqlens, ssm_states, state_slots,
                             has_initial_state, *, v_head_order="grouped", chunk_size=64):
    """Chunked gated delta rule over each sequence of a flat batch.

    q/k [T, Hk, Dk] (raw: L2-normalised here, q scaled by Dk^-0.5), v [T, Hv, Dv], a/b [T, Hv]
    (beta = sigmoid(b), g = -exp(A_log) * softplus(a + dt_bias)). A sequence with
    has_initial_state starts from ssm_states[slot] ([Hv, Dk, Dv] fp32), else from zeros; its
    final state is written back. Returns o [T, Hv, Dv] in v.dtype; fp32 math."""
    qf, kf, vf, g, beta = _prepare(q, k, v, a, b, A_log, dt_bias, v_head_order)
    hv, dk, dv = v.shape[1], k.shape[2], v.shape[2]
    out = torch.empty(v.shape, dtype=v.dtype, device=v.device)
    cu = cu_seqlens.tolist()
    for i in range(len(cu) - 1):
        s, e = cu[i], cu[i + 1]
        slot = int(state_slots[i])
        if bool(has_initial_state[i]):
            state = ssm_states[slot].float()
        else:
            state = torch.zeros(hv, dk, dv, dtype=torch.float32, device=v.device)
        if e > s:
            o, state = _delta_rule_chunked(
                qf[s:e].transpose(0, 1), kf[s:e].transpose(0, 1), vf[s:e].transpose(0, 1),
                g[s:e].t(), beta[s:e].t(), state, chunk_size,
            )
            out[s:e] = o.transpose(0, 1).to(v.dtype)
        ssm_states[slot] = state.to(ssm_states.dtype)
    return out


def gated_delta_rule_recurrent(q, k, v, a, b, A_log, dt_bias, cu_seqlens, ssm_states, state_slots,
                               has_initial_state, *, v_head_order="grouped"):
    """gated_delta_rule_prefill's result, one position at a time across all the sequences that
    reach it (for batches of short sequences)."""
    qf, kf, vf, g, beta = _prepare(q, k, v, a, b, A_log, dt_bias, v_head_order)
    cu = cu_seqlens.tolist()
    lens = [e - s for s, e in zip(cu, cu[1:])]
    slots = state_slots.to(torch.long)
    carried = has_initial_state.to(torch.bool).view(-1, 1, 1, 1)
    states = torch.where(carried, ssm_states[slots].float(), torch.zeros((), device=v.device))
    out = torch.empty(v.shape, dtype=torch.float32, device=v.device)
    for j in range(max(lens, default=0)):
        live = [i for i, n in enumerate(lens) if n > j]
        seq = torch.tensor(live, dtype=torch.long, device=v.device)
        row = torch.tensor([cu[i] + j for i in live], dtype=torch.long, device=v.device)
        s = states[seq] * g[row].exp()[..., None, None]
        u = (vf[row] - torch.einsum("bhkv,bhk->bhv", s, kf[row])) * beta[row][..., None]
        s = s + kf[row][..., :, None] * u[..., None, :]
        out[row] = torch.einsum("bhkv,bhk->bhv", s, qf[row])
        states[seq] = s
    ssm_states[slots] = states.to(ssm_states.dtype)
    return out.to(v.dtype)


def gated_delta_rule_decode(q, k, v, a, b, A_log, dt_bias, ssm_states, state_slots, *,
                            v_head_order="grouped"):
    """One recurrent step per sequence: q/k [B, Hk, Dk], v [B, Hv, Dv], a/b [B, Hv];
    ssm_states[slot] is read and updated in place. Returns o [B, Hv, Dv] in v.dtype."""
    qf, kf, vf, g, beta = _prepare(q, k, v, a, b, A_log, dt_bias, v_head_order)
    slots = state_slots.to(torch.long)
    s = ssm_states[slots].float() * g.exp()[..., None, None]
    u = (vf - torch.einsum("bhkv,bhk->bhv", s, kf)) * beta[..., None]
    s = s + kf[..., :, None] * u[..., None, :]
    o = torch.einsum("bhkv,bhk->bhv", s, qf)
    ssm_states[slots] = s.to(ssm_states.dtype)
    return o.to(v.dtype)
