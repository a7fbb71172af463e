"""Triton kernels for the gated delta rule (see reference.py for the maths).

Decode: one program per (sequence, value head, block of value columns); the state columns
of a value head evolve independently, so the [Dk, BLOCK_V] state tile is loaded once, updated
and stored (fp32) and the output block computed in the same pass.

Prefill: a first kernel inverts, for every chunk of C tokens of every sequence and every value
head in parallel, the unit lower-triangular system (I + A) with A = tril(beta k k^T * decay, -1)
by forward substitution (T = (I + A)^-1, fp32 in a scratch buffer); then one program per
(sequence, value head, block of value columns) scans the sequence chunk by chunk:
    U = T (beta V), W = T (beta K e^gc), V' = U - W S,
    O = (Q e^gc) S + tril(Q K^T * decay) V',  S = e^gc_last S + (K e^(gc_last - gc))^T V'.
All matrix products are fp32 (input_precision="ieee").
"""

from __future__ import annotations

import torch
import triton
import triton.language as tl

from .._triton_util import next_pow2, empty


@triton.jit
def _key_head(h, Hk, Hv, GROUPED: tl.constexpr):
    """Key head of value head h: grouped (HF) h // (Hv/Hk), tiled (llama.cpp GGUF) h % Hk —
    the same mapping as reference.kv_head_index."""
    if GROUPED:
        return h // (Hv // Hk)
    else:
        return h % Hk


@triton.jit
def _softplus(x):
    return tl.where(x > 20.0, x, tl.log(1.0 + tl.exp(tl.minimum(x, 20.0))))


@triton.jit
def _gdn_decode_kernel(q_ptr, k_ptr, v_ptr, a_ptr, b_ptr, alog_ptr, dtb_ptr, st_ptr, slot_ptr,
                       o_ptr, Hk, Hv, DK, DV, sq_b, sq_h, sk_b, sk_h, sv_b, sv_h, sa_b, sb_b,
                       ss_s, ss_h, ss_k, so_b, so_h, q_scale,
                       GROUPED: tl.constexpr, BLOCK_K: tl.constexpr, BLOCK_V: tl.constexpr):
    bi = tl.program_id(0)
    h = tl.program_id(1)
    vb = tl.program_id(2)
    kh = _key_head(h, Hk, Hv, GROUPED)
    b64 = bi.to(tl.int64)
    kk = tl.arange(0, BLOCK_K)
    kmask = kk < DK
    vv = vb * BLOCK_V + tl.arange(0, BLOCK_V)
    vmask = vv < DV
    q = tl.load(q_ptr + b64 * sq_b + kh * sq_h + kk, mask=kmask, other=0.0).to(tl.float32)
    k = tl.load(k_ptr + b64 * sk_b + kh * sk_h + kk, mask=kmask, other=0.0).to(tl.float32)
    q = q / tl.sqrt(tl.sum(q * q, axis=0) + 1e-6) * q_scale
    k = k / tl.sqrt(tl.sum(k * k, axis=0) + 1e-6)
    a = tl.load(a_ptr + b64 * sa_b + h).to(tl.float32)
    bb = tl.load(b_ptr + b64 * sb_b + h).to(tl.float32)
    A = tl.load(alog_ptr + h).to(tl.float32)
    dtb = tl.load(dtb_ptr + h).to(tl.float32)
    decay = tl.exp(-tl.exp(A) * _softplus(a + dtb))
    beta = 1.0 / (1.0 + tl.exp(-bb))
    v = tl.load(v_ptr + b64 * sv_b + h * sv_h + vv, mask=vmask, other=0.0).to(tl.float32)
    slot = tl.load(slot_ptr + bi).to(tl.int64)
    sp = st_ptr + slot * ss_s + h * ss_h + kk[:, None] * ss_k + vv[None, :]
    m2 = kmask[:, None] & vmask[None, :]
    S = tl.load(sp, mask=m2, other=0.0) * decay
    kv = tl.sum(S * k[:, None], axis=0)
    delta = (v - kv) * beta
    S = S + k[:, None] * delta[None, :]
    o = tl.sum(S * q[:, None], axis=0)
    tl.store(sp, S, mask=m2)
    tl.store(o_ptr + b64 * so_b + h * so_h + vv, o.to(o_ptr.dtype.element_ty), mask=vmask)


def gated_delta_rule_decode(q, k, v, a, b, A_log, dt_bias, ssm_states, state_slots, *,
                            v_head_order="grouped", block_v=None, num_warps=4):
    B, Hk, DK = k.shape
    Hv, DV = v.shape[1], v.shape[2]
    o = empty((B, Hv, DV), v.dtype, v.device)
    if B == 0:
        return o
    assert ssm_states.dtype == torch.float32 and ssm_states.stride(3) == 1
    for t in (q, k, v):
        assert t.stride(-1) == 1
    assert a.stride(-1) == 1 and b.stride(-1) == 1
    BLOCK_K = next_pow2(DK)
    BLOCK_V = block_v or min(next_pow2(DV), 32 if B * Hv >= 256 else 16)
    _gdn_decode_kernel[(B, Hv, triton.cdiv(DV, BLOCK_V))](
        q, k, v, a, b, A_log, dt_bias, ssm_states, state_slots, o, Hk, Hv, DK, DV,
        q.stride(0), q.stride(1), k.stride(0), k.stride(1), v.stride(0), v.stride(1),
        a.stride(0), b.stride(0), ssm_states.stride(0), ssm_states.stride(1),
        ssm_states.stride(2), o.stride(0), o.stride(1), DK ** -0.5,
        GROUPED=v_head_order == "grouped", BLOCK_K=BLOCK_K, BLOCK_V=BLOCK_V, num_warps=num_warps)
    return o


@triton.jit
def _gdn_chunk_prep_kernel(k_ptr, a_ptr, b_ptr, alog_ptr, dtb_ptr, cu_ptr, cseq_ptr, cfirst_ptr,
                           tm_ptr, B, Hk, Hv, DK, sk_t, sk_h, sa_t, sb_t,
                           GROUPED: tl.constexpr, C: tl.constexpr, BLOCK_K: tl.constexpr):
    """T = (I + tril(beta k k^T * decay, -1))^-1 for one chunk and value head (all chunks of
    all sequences in parallel), by forward substitution."""
    ci = tl.program_id(0)
    h = tl.program_id(1)
    bi = tl.load(cseq_ptr + ci)
    if bi >= B:
        return
    kh = _key_head(h, Hk, Hv, GROUPED)
    j = ci - tl.load(cfirst_ptr + bi)
    seq0 = tl.load(cu_ptr + bi)
    L = tl.load(cu_ptr + bi + 1) - seq0
    c = tl.arange(0, C)
    rows = j * C + c
    rmask = rows < L
    t = (seq0 + rows).to(tl.int64)
    kk = tl.arange(0, BLOCK_K)
    Kc = tl.load(k_ptr + t[:, None] * sk_t + kh * sk_h + kk[None, :],
                 mask=rmask[:, None] & (kk < DK)[None, :], other=0.0).to(tl.float32)
    Kc = Kc / tl.sqrt(tl.sum(Kc * Kc, axis=1) + 1e-6)[:, None]
    A = tl.load(alog_ptr + h).to(tl.float32)
    dtb = tl.load(dtb_ptr + h).to(tl.float32)
    a = tl.load(a_ptr + t * sa_t + h, mask=rmask, other=0.0).to(tl.float32)
    bb = tl.load(b_ptr + t * sb_t + h, mask=rmask, other=0.0).to(tl.float32)
    g = tl.where(rmask, -tl.exp(A) * _softplus(a + dtb), 0.0)
    beta = tl.where(rmask, 1.0 / (1.0 + tl.exp(-bb)), 0.0)
    gc = tl.cumsum(g, axis=0)
    strict = c[:, None] > c[None, :]
    decay = tl.exp(tl.where(strict, gc[:, None] - gc[None, :], float("-inf")))
    KK = tl.dot(Kc, tl.trans(Kc), input_precision="ieee")
    Am = tl.where(strict, beta[:, None] * KK * decay, 0.0)
    Tm = (c[:, None] == c[None, :]).to(tl.float32)
    for i in range(1, C):
        a_row = tl.sum(tl.where(c[:, None] == i, Am, 0.0), axis=0)      # Am[i, :]
        new = tl.sum(a_row[:, None] * Tm, axis=0)                        # Am[i, :] @ T
        Tm = tl.where(c[:, None] == i, (c[None, :] == i).to(tl.float32) - new[None, :], Tm)
    base = (ci.to(tl.int64) * Hv + h) * C * C
    tl.store(tm_ptr + base + c[:, None] * C + c[None, :], Tm)


@triton.jit
def _gdn_prefill_kernel(q_ptr, k_ptr, v_ptr, a_ptr, b_ptr, alog_ptr, dtb_ptr, cu_ptr, st_ptr,
                        slot_ptr, init_ptr, o_ptr, tm_ptr, cfirst_ptr, Hk, Hv, DK, DV, sq_t, sq_h,
                        sk_t, sk_h, sv_t,
                        sv_h, sa_t, sb_t, ss_s, ss_h, ss_k, so_t, so_h, q_scale,
                        GROUPED: tl.constexpr, C: tl.constexpr, BLOCK_K: tl.constexpr,
                        BLOCK_V: tl.constexpr):
    bi = tl.program_id(0)
    h = tl.program_id(1)
    vb = tl.program_id(2)
    kh = _key_head(h, Hk, Hv, GROUPED)
    start = tl.load(cu_ptr + bi)
    L = tl.load(cu_ptr + bi + 1) - start
    slot = tl.load(slot_ptr + bi).to(tl.int64)
    has_init = tl.load(init_ptr + bi) != 0
    kk = tl.arange(0, BLOCK_K)
    kmask = kk < DK
    vv = vb * BLOCK_V + tl.arange(0, BLOCK_V)
    vmask = vv < DV
    m_kv = kmask[:, None] & vmask[None, :]
    sp = st_ptr + slot * ss_s + h * ss_h + kk[:, None] * ss_k + vv[None, :]
    S = tl.load(sp, mask=m_kv & has_init, other=0.0)
    A = tl.load(alog_ptr + h).to(tl.float32)
    dtb = tl.load(dtb_ptr + h).to(tl.float32)
    negA = -tl.exp(A)
    c = tl.arange(0, C)
    lower = c[:, None] >= c[None, :]
    chunk0 = tl.load(cfirst_ptr + bi)
    for c0 in range(0, L, C):
        rows = c0 + c
        rmask = rows < L
        t = (start + rows).to(tl.int64)
        m_ck = rmask[:, None] & kmask[None, :]
        Kc = tl.load(k_ptr + t[:, None] * sk_t + kh * sk_h + kk[None, :], mask=m_ck,
                     other=0.0).to(tl.float32)
        Qc = tl.load(q_ptr + t[:, None] * sq_t + kh * sq_h + kk[None, :], mask=m_ck,
                     other=0.0).to(tl.float32)
        Kc = Kc / tl.sqrt(tl.sum(Kc * Kc, axis=1) + 1e-6)[:, None]
        Qc = Qc / tl.sqrt(tl.sum(Qc * Qc, axis=1) + 1e-6)[:, None] * q_scale
        Vc = tl.load(v_ptr + t[:, None] * sv_t + h * sv_h + vv[None, :],
                     mask=rmask[:, None] & vmask[None, :], other=0.0).to(tl.float32)
        a = tl.load(a_ptr + t * sa_t + h, mask=rmask, other=0.0).to(tl.float32)
        bb = tl.load(b_ptr + t * sb_t + h, mask=rmask, other=0.0).to(tl.float32)
        g = tl.where(rmask, negA * _softplus(a + dtb), 0.0)
        beta = tl.where(rmask, 1.0 / (1.0 + tl.exp(-bb)), 0.0)
        gc = tl.cumsum(g, axis=0)
        decay = tl.exp(tl.where(lower, gc[:, None] - gc[None, :], float("-inf")))
        tbase = ((chunk0 + c0 // C).to(tl.int64) * Hv + h) * C * C
        Tm = tl.load(tm_ptr + tbase + c[:, None] * C + c[None, :])         # from the prep kernel
        U = tl.dot(Tm, Vc * beta[:, None], input_precision="ieee")
        W = tl.dot(Tm, Kc * (beta * tl.exp(gc))[:, None], input_precision="ieee")
        Vn = U - tl.dot(W, S, input_precision="ieee")
        QK = tl.dot(Qc, tl.trans(Kc), input_precision="ieee") * decay
        O = tl.dot(Qc * tl.exp(gc)[:, None], S, input_precision="ieee") + \
            tl.dot(QK, Vn, input_precision="ieee")
        tl.store(o_ptr + t[:, None] * so_t + h * so_h + vv[None, :], O.to(o_ptr.dtype.element_ty),
                 mask=rmask[:, None] & vmask[None, :])
        g_last = tl.sum(tl.where(c == C - 1, gc, 0.0), axis=0)
        Kd = Kc * tl.exp(g_last - gc)[:, None]
        S = S * tl.exp(g_last) + tl.dot(tl.trans(Kd), Vn, input_precision="ieee")
    tl.store(sp, S, mask=m_kv)


def gated_delta_rule_prefill(q, k, v, a, b, A_log, dt_bias, cu_seqlens, ssm_states, state_slots,
                             has_initial_state, *, v_head_order="grouped", chunk_size=64):
    T, Hk, DK = k.shape
    Hv, DV = v.shape[1], v.shape[2]
    B = state_slots.shape[0]
    o = empty((T, Hv, DV), v.dtype, v.device)
    if B == 0:
        return o
    assert ssm_states.dtype == torch.float32 and ssm_states.stride(3) == 1
    for t in (q, k, v):
        assert t.stride(-1) == 1
    assert a.stride(-1) == 1 and b.stride(-1) == 1
    BLOCK_K = max(16, next_pow2(DK))
    BLOCK_V = max(16, min(next_pow2(DV), 64))
    C = max(16, next_pow2(chunk_size))
    init = has_initial_state.to(torch.int32)
    # chunk bookkeeping on the device (no host sync): chunks per sequence, first chunk index of
    # each sequence, and the sequence of every chunk slot (slots past the total get B)
    lens = (cu_seqlens[1:] - cu_seqlens[:-1]).to(torch.int64)
    nch = (lens + C - 1) // C
    ccum = torch.cumsum(nch, 0)
    cfirst = (ccum - nch).to(torch.int32)
    max_chunks = triton.cdiv(T, C) + B
    cseq = torch.searchsorted(ccum, torch.arange(max_chunks, device=v.device), right=True)
    cseq = cseq.to(torch.int32)
    tm = torch.empty((max_chunks, Hv, C, C), dtype=torch.float32, device=v.device)
    if T > 0:
        _gdn_chunk_prep_kernel[(max_chunks, Hv)](
            k, a, b, A_log, dt_bias, cu_seqlens, cseq, cfirst, tm, B, Hk, Hv, DK, k.stride(0),
            k.stride(1), a.stride(0), b.stride(0), GROUPED=v_head_order == "grouped", C=C,
            BLOCK_K=BLOCK_K, num_warps=4)
    _gdn_prefill_kernel[(B, Hv, triton.cdiv(DV, BLOCK_V))](
        q, k, v, a, b, A_log, dt_bias, cu_seqlens, ssm_states, state_slots, init, o, tm, cfirst,
        Hk, Hv, DK,
        DV, q.stride(0), q.stride(1), k.stride(0), k.stride(1), v.stride(0), v.stride(1),
        a.stride(0), b.stride(0), ssm_states.stride(0), ssm_states.stride(1),
        ssm_states.stride(2), o.stride(0), o.stride(1), DK ** -0.5,
        GROUPED=v_head_order == "grouped", C=C, BLOCK_K=BLOCK_K, BLOCK_V=BLOCK_V, num_warps=8)
    return o
