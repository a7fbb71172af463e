"""Triton kernels for the gated delta rule (see reference.py for the maths).

Decode: one program per (sequence, value head, block of value columns); the state columns
of a value head evolve independently, so the [Dk, BLOCK_V] state tile is loaded once, updated
and stored (fp32) and the output block computed in the same pass.

Prefill, two phases (C-token chunks, C in {16, 32, 64}, per value head):
  1. fully parallel over (chunk, value head): Gram matrices k k^T, q k^T of the chunk, then
     Tinv = (I + A)^-1 for A = strictly-lower(beta k k^T * decay) by blocked inversion (16 x 16
     diagonal blocks by forward substitution, the blocks below by small products), and
     P = lower(q k^T * decay); Tinv, P and per-token factors go to fp32 scratch.
  2. one program per (sequence, value head, block of value columns) scans the chunks:
     V' = Tinv (beta V - (beta e^gc K) S),  O = (Q e^gc) S + P V',
     S = e^gc_last S + (K e^(gc_last - gc))^T V'.
All matrix products are fp32 (input_precision="ieee").
"""

from __future__ import annotations

import torch
import triton
import triton.language as tl

from .._triton_util import arrival_counters, empty, is_rocm, next_pow2, num_sms, step_memo
from ..conv1d.kernel import conv_finish, conv_taps
from ..pdl import pdl_args, pdl_start


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
                       cw_ptr, cst_ptr, len_ptr, KEY_DIM, scw_c, scs_s, scs_c,
                       z_ptr, nw_ptr, cnt_ptr, sz_b, sz_h, eps,
                       GROUPED: tl.constexpr, BLOCK_K: tl.constexpr, BLOCK_V: tl.constexpr,
                       CONV: tl.constexpr = False, CONV_K: tl.constexpr = 4,
                       NORM: tl.constexpr = False, BLOCK_D: tl.constexpr = 1,
                       PDL: tl.constexpr = False):
    """CONV: q, k, v are the raw projection (channels [q | k | v] of the conv1d) and the
    program first applies the conv step to its channels (conv1d/kernel.py: conv_taps,
    conv_finish). The q/k channels of a key head are shared by the programs of its value
    heads: all compute their conv from the ring, one of them writes the new input (the ring
    column it writes is one nobody reads in this step).
    NORM: the output is the gated RMSNorm of the head's o, norm(o) * w * silu(z) (as
    norm/kernel.py's gated_rms_norm), applied by the last of the head's programs to store its
    columns: each adds 64 / (programs per head) to the head's arrival counter (cnt_ptr), so a
    call advances it by exactly 64 and needs no reset (arrival_counters)."""
    bi = tl.program_id(0)
    h = tl.program_id(1)
    vb = tl.program_id(2)
    kh = _key_head(h, Hk, Hv, GROUPED)
    b64 = bi.to(tl.int64)
    kk = tl.arange(0, BLOCK_K)
    kmask = kk < DK
    vv = vb * BLOCK_V + tl.arange(0, BLOCK_V)
    vmask = vv < DV
    # before the PDL wait, what the kernel before (the input projection) does not write: the
    # slot and length (uploaded before the step), the state, the parameters and the conv
    # taps. The state leads: in the compiled code each load placed after a reduction waited
    # for it, one memory round trip after another
    slot = tl.load(slot_ptr + bi).to(tl.int64)
    sp = st_ptr + slot * ss_s + h * ss_h + kk[:, None] * ss_k + vv[None, :]
    m2 = kmask[:, None] & vmask[None, :]
    S = tl.load(sp, mask=m2, other=0.0)
    A = tl.load(alog_ptr + h).to(tl.float32)
    dtb = tl.load(dtb_ptr + h).to(tl.float32)
    if CONV:
        t = tl.load(len_ptr + bi) - 1
        qc = kh * DK + kk                             # conv channels of this program's q, k, v
        kc = KEY_DIM + qc
        vc = 2 * KEY_DIM + h * DV + vv
        ring = cst_ptr + slot * scs_s
        tq, wq = conv_taps(cw_ptr + qc * scw_c, ring + qc * scs_c, kmask, t, CONV_K)
        tk, wk = conv_taps(cw_ptr + kc * scw_c, ring + kc * scs_c, kmask, t, CONV_K)
        tv, wv = conv_taps(cw_ptr + vc * scw_c, ring + vc * scs_c, vmask, t, CONV_K)
    pdl_start(PDL)
    q = tl.load(q_ptr + b64 * sq_b + kh * sq_h + kk, mask=kmask, other=0.0)
    k = tl.load(k_ptr + b64 * sk_b + kh * sk_h + kk, mask=kmask, other=0.0)
    v = tl.load(v_ptr + b64 * sv_b + h * sv_h + vv, mask=vmask, other=0.0)
    if NORM:  # loaded by every program with the inputs, used by the head's last
        dd = tl.arange(0, BLOCK_D)
        dm = dd < DV
        zg = tl.load(z_ptr + b64 * sz_b + h * sz_h + dd, mask=dm, other=0.0).to(tl.float32)
        nw = tl.load(nw_ptr + dd, mask=dm, other=0.0).to(tl.float32)
    a = tl.load(a_ptr + b64 * sa_b + h).to(tl.float32)
    bb = tl.load(b_ptr + b64 * sb_b + h).to(tl.float32)
    if CONV:
        dt = q.dtype                                  # rounded as the separate conv op stores it
        writer = vb == 0
        if GROUPED:
            writer = writer & (h % (Hv // Hk) == 0)
        else:
            writer = writer & (h < Hk)
        q = conv_finish(q, tq, wq, ring + qc * scs_c, kmask, t, writer, CONV_K).to(dt)
        k = conv_finish(k, tk, wk, ring + kc * scs_c, kmask, t, writer, CONV_K).to(dt)
        v = conv_finish(v, tv, wv, ring + vc * scs_c, vmask, t, True, CONV_K).to(dt)
    q = q.to(tl.float32)
    k = k.to(tl.float32)
    v = v.to(tl.float32)
    q = q / tl.sqrt(tl.sum(q * q, axis=0) + 1e-6) * q_scale
    k = k / tl.sqrt(tl.sum(k * k, axis=0) + 1e-6)
    decay = tl.exp(-tl.exp(A) * _softplus(a + dtb))
    beta = 1.0 / (1.0 + tl.exp(-bb))
    S = S * decay
    kv = tl.sum(S * k[:, None], axis=0)
    delta = (v - kv) * beta
    S = S + k[:, None] * delta[None, :]
    o = tl.sum(S * q[:, None], axis=0)
    tl.store(sp, S, mask=m2)
    orow = o_ptr + b64 * so_b + h * so_h
    tl.store(orow + vv, o.to(o_ptr.dtype.element_ty), mask=vmask)
    if NORM:
        inc = 64 // tl.num_programs(2)
        tl.debug_barrier()          # all the program's stores before its arrival (release)
        arrived = tl.atomic_add(cnt_ptr + bi * Hv + h, inc, sem="acq_rel", scope="gpu") + inc
        if (arrived & 63) == 0:     # the head's last program (also once the int32 wraps)
            x = tl.load(orow + dd, mask=dm, other=0.0, cache_modifier=".cg").to(tl.float32)
            rstd = 1.0 / tl.sqrt(tl.sum(x * x, axis=0) / DV + eps)
            y = x * rstd * nw * (zg / (1.0 + tl.exp(-zg)))
            tl.store(orow + dd, y.to(o_ptr.dtype.element_ty), mask=dm)


def check_layout(q, k, v, a, b, ssm_states) -> None:
    """What the delta-rule kernels index by: fp32 states and unit strides along the last axis."""
    assert ssm_states.dtype == torch.float32 and ssm_states.stride(3) == 1
    for t in (q, k, v, a, b):
        assert t.stride(-1) == 1


def gated_delta_rule_decode(q, k, v, a, b, A_log, dt_bias, ssm_states, state_slots, *,
                            v_head_order="grouped", block_v=None, num_warps=4):
    return _decode(q, k, v, a, b, A_log, dt_bias, ssm_states, state_slots, v_head_order,
                   block_v, num_warps, None, None)


def _decode(q, k, v, a, b, A_log, dt_bias, ssm_states, state_slots, v_head_order, block_v,
            num_warps, conv, gated_norm):
    """conv = (conv_weight, conv_states, seq_lens, key_dim): q, k, v are views of the raw
    projection and the conv step runs in the same kernel (conv_gated_delta_rule_decode).
    gated_norm = (z [B, Hv, Dv], weight [Dv], eps): the output is gated_rms_norm(o, z, ...)."""
    B, Hk, DK = k.shape
    Hv, DV = v.shape[1], v.shape[2]
    o = empty((B, Hv, DV), v.dtype, v.device)
    if B == 0:
        return o
    check_layout(q, k, v, a, b, ssm_states)
    BLOCK_K = next_pow2(DK)
    BLOCK_V = block_v or min(next_pow2(DV), 32 if B * Hv >= 256 else 16)
    n_vb = triton.cdiv(DV, BLOCK_V)
    if conv is None:
        conv_args, kw = (ssm_states, ssm_states, state_slots, 0, 0, 0, 0), {}
    else:
        cw, cst, lens, key_dim = conv
        assert cw.stride(1) == 1 and cst.stride(2) == 1
        conv_args = (cw, cst, lens, key_dim, cw.stride(0), cst.stride(0), cst.stride(1))
        kw = dict(CONV=True, CONV_K=cw.shape[1])
    if gated_norm is None:
        norm_args = (ssm_states, ssm_states, state_slots, 0, 0, 0.0)
    else:
        z, nw, eps = gated_norm
        assert z.shape == (B, Hv, DV) and z.stride(-1) == 1 and nw.numel() == DV
        assert 64 % n_vb == 0, "the arrival counter needs programs per head dividing 64"
        norm_args = (z, nw, arrival_counters(v.device, B * Hv), z.stride(0), z.stride(1),
                     float(eps))
        kw.update(NORM=True, BLOCK_D=next_pow2(DV))
    _gdn_decode_kernel[(B, Hv, n_vb)](
        q, k, v, a, b, A_log, dt_bias, ssm_states, state_slots, o, Hk, Hv, DK, DV,
        q.stride(0), q.stride(1), k.stride(0), k.stride(1), v.stride(0), v.stride(1),
        a.stride(0), b.stride(0), ssm_states.stride(0), ssm_states.stride(1),
        ssm_states.stride(2), o.stride(0), o.stride(1), DK ** -0.5, *conv_args, *norm_args,
        GROUPED=v_head_order == "grouped", BLOCK_K=BLOCK_K, BLOCK_V=BLOCK_V, num_warps=num_warps,
        **kw, **pdl_args(q.device))
    return o


def conv_gated_delta_rule_decode(qkv, conv_weight, conv_states, seq_lens, a, b, A_log, dt_bias,
                                 ssm_states, state_slots, *, num_k_heads, head_k_dim,
                                 v_head_order="grouped", gated_norm=None, block_v=None,
                                 num_warps=4):
    B = qkv.shape[0]
    key_dim = num_k_heads * head_k_dim
    Hv = a.shape[1]
    q, k, v = qkv.split([key_dim, key_dim, qkv.shape[1] - 2 * key_dim], dim=-1)
    return _decode(q.view(B, num_k_heads, head_k_dim), k.view(B, num_k_heads, head_k_dim),
                   v.view(B, Hv, -1), a, b, A_log, dt_bias, ssm_states, state_slots, v_head_order,
                   block_v, num_warps, (conv_weight, conv_states, seq_lens, key_dim), gated_norm)


@triton.jit
def _rows(ptr, t, stride_t, off, cols, rmask, cmask):
    """fp32 tile [len(t), len(cols)] of rows t (masked rows/cols read as 0)."""
    return tl.load(ptr + t[:, None] * stride_t + off + cols[None, :],
                   mask=rmask[:, None] & cmask[None, :], other=0.0).to(tl.float32)


@triton.jit
def _add_column_block(acc, base, rhs, r, C, ms, L: tl.constexpr, NB: tl.constexpr,
                      PREC: tl.constexpr):
    """acc[j] += M[j, L] @ rhs for the row blocks j >= L of the lower-triangular C x C matrix M
    whose rows start at `base` (16 x 16 blocks, masked rows ms[j])."""
    out = ()
    for j in tl.static_range(NB):
        if j >= L:
            m = _rows(base, j * 16 + r, C, L * 16, r, ms[j], r < 16)
            out += (acc[j] + tl.dot(m, rhs, input_precision=PREC),)
        else:
            out += (acc[j],)
    return out


@triton.jit
def _block(X, i, j, NB: tl.constexpr):
    """16 x 16 block (i, j) of a [16 NB, 16 NB] register tile (masked sums: tiles can't be sliced)."""
    nb = tl.arange(0, NB)
    Xi = tl.sum(tl.where((nb == i)[:, None, None], tl.reshape(X, (NB, 16, 16 * NB)), 0.0), axis=0)
    return tl.sum(tl.where((nb == j)[None, :, None], tl.reshape(Xi, (16, NB, 16)), 0.0), axis=1)


@triton.jit(do_not_specialize=["B", "T"])
def _gdn_chunk_kernel(q_ptr, k_ptr, a_ptr, b_ptr, alog_ptr, dtb_ptr, cu_ptr, cseq_ptr, cfirst_ptr,
                      t_ptr, p_ptr, f_ptr, B, T, Hk, Hv, DK, sq_t, sq_h, sk_t, sk_h, sa_t, sb_t,
                      q_scale, GROUPED: tl.constexpr, C: tl.constexpr, BLOCK_K: tl.constexpr):
    """Phase 1, one program per (chunk slot, value head). Per token row i of the chunk it writes
    row i of Tinv = (I + A)^-1 (A = strictly-lower(beta_i Kn_i.Kn_j e^(gc_i - gc_j))), row i of
    P = lower(Qn_i.Kn_j e^(gc_i - gc_j)), and the row factors phase 2 applies to raw q/k/v rows:
    f = (e^gc/|q| * Dk^-0.5, e^(gc_last - gc)/|k|, beta e^gc/|k|, beta, e^gc_last)."""
    NB: tl.constexpr = C // 16
    ci = tl.program_id(0)
    h = tl.program_id(1)
    bi = tl.load(cseq_ptr + ci)
    if bi >= B:
        return
    kh = _key_head(h, Hk, Hv, GROUPED)
    seq0 = tl.load(cu_ptr + bi)
    L = tl.load(cu_ptr + bi + 1) - seq0
    c = tl.arange(0, C)
    row0 = (ci - tl.load(cfirst_ptr + bi)) * C               # first row of the chunk in its sequence
    rows = row0 + c
    m = rows < L
    t = (seq0 + rows).to(tl.int64)
    a = tl.load(a_ptr + t * sa_t + h, mask=m, other=0.0).to(tl.float32)
    bb = tl.load(b_ptr + t * sb_t + h, mask=m, other=0.0).to(tl.float32)
    negA = -tl.exp(tl.load(alog_ptr + h).to(tl.float32))
    g = tl.where(m, negA * _softplus(a + tl.load(dtb_ptr + h).to(tl.float32)), 0.0)
    beta = tl.where(m, 1.0 / (1.0 + tl.exp(-bb)), 0.0)
    gc = tl.cumsum(g, axis=0)
    gl = tl.sum(g, axis=0)                                  # gc of the last row
    # raw Gram matrices k k^T, q k^T and the row norms, 16 key columns at a time (small dots)
    G = tl.zeros((C, C), tl.float32)
    H = tl.zeros((C, C), tl.float32)
    ssk = tl.zeros((C,), tl.float32)
    ssq = tl.zeros((C,), tl.float32)
    r = tl.arange(0, 16)
    for d in range(0, BLOCK_K, 16):
        kd = _rows(k_ptr, t, sk_t, kh * sk_h + d, r, m, d + r < DK)
        qd = _rows(q_ptr, t, sq_t, kh * sq_h + d, r, m, d + r < DK)
        G += tl.dot(kd, tl.trans(kd), input_precision="ieee")
        H += tl.dot(qd, tl.trans(kd), input_precision="ieee")
        ssk += tl.sum(kd * kd, axis=1)
        ssq += tl.sum(qd * qd, axis=1)
    rk = 1.0 / tl.sqrt(ssk + 1e-6)
    rq = 1.0 / tl.sqrt(ssq + 1e-6)
    dec = tl.exp(tl.where(c[:, None] >= c[None, :], gc[:, None] - gc[None, :], float("-inf")))
    hi = h * T + t                                          # scratch row of each token
    P = H * (rq * q_scale)[:, None] * (rk[None, :] * dec)
    tl.store(p_ptr + hi[:, None] * C + c[None, :], P, mask=m[:, None])
    A = tl.where(c[:, None] > c[None, :], G * (beta * rk)[:, None] * (rk[None, :] * dec), 0.0)
    f = f_ptr + hi
    tl.store(f, rq * q_scale * tl.exp(gc), mask=m)
    tl.store(f + Hv * T, rk * tl.exp(gl - gc), mask=m)
    tl.store(f + 2 * Hv * T, rk * beta * tl.exp(gc), mask=m)
    tl.store(f + 3 * Hv * T, beta, mask=m)
    tl.store(f + 4 * Hv * T, tl.zeros((C,), tl.float32) + tl.exp(gl), mask=m)
    # blocked inversion of the unit lower-triangular I + A, in 16 x 16 blocks (flat tuple index
    # i(i+1)/2 + j for block (i, j), j <= i); first the diagonal blocks by forward substitution:
    # row s of the inverse = e_s - A_ii[s, :] @ inverse (rows < s final), NB blocks interleaved
    As = ()
    for i in tl.static_range(NB):
        for j in tl.static_range(i + 1):
            As += (_block(A, i, j, NB),)
    eye = (r[:, None] == r[None, :]).to(tl.float32)
    Ds = ()
    for i in tl.static_range(NB):
        Ds += (eye,)
    for s in tl.static_range(1, 16):
        sel = r[:, None] == s
        nd = ()
        for i in tl.static_range(NB):
            arow = tl.sum(tl.where(sel, As[i * (i + 1) // 2 + i], 0.0), axis=0)
            new = tl.sum(arow[:, None] * Ds[i], axis=0)
            nd += (tl.where(sel, eye - new[None, :], Ds[i]),)
        Ds = nd
    # then the blocks below the diagonal, T_ij = -D_i sum_{k=j}^{i-1} A_ik T_kj; store row blocks
    Ts = ()
    for i in tl.static_range(NB):
        ri = row0 + i * 16 + r
        tp = t_ptr + (h * T + seq0 + ri).to(tl.int64)[:, None] * C
        mi = (ri < L)[:, None]
        for j in tl.static_range(i + 1):
            if j == i:
                Tij = Ds[i]
            else:
                acc = tl.zeros((16, 16), tl.float32)
                for k in tl.static_range(j, i):
                    acc += tl.dot(As[i * (i + 1) // 2 + k], Ts[k * (k + 1) // 2 + j],
                                  input_precision="ieee")
                Tij = -tl.dot(Ds[i], acc, input_precision="ieee")
            Ts += (Tij,)
            tl.store(tp + j * 16 + r[None, :], Tij, mask=mi)


@triton.jit(do_not_specialize=["T"])
def _gdn_scan_kernel(q_ptr, k_ptr, v_ptr, t_ptr, p_ptr, f_ptr, cu_ptr, st_ptr, slot_ptr, init_ptr,
                     o_ptr, T, Hk, Hv, DK, DV, sq_t, sq_h, sk_t, sk_h, sv_t, sv_h, ss_s, ss_h,
                     ss_k, so_t, so_h, GROUPED: tl.constexpr, C: tl.constexpr,
                     BLOCK_K: tl.constexpr, BLOCK_V: tl.constexpr, PREC: tl.constexpr):
    """Phase 2, one program per (sequence, value head, BLOCK_V value columns), chunk by chunk:
    V' = Tinv (beta V - (beta e^gc Kn) S),  O = (Qn e^gc) S + P V',
    S = e^gc_last S + (Kn e^(gc_last - gc))^T V'.
    Tiling: Triton's fp32 FMA dot keeps, per thread, its operand rows/columns over the whole
    contraction in registers (a [64, 128] x [128, 32] dot alone spills), so every product is a
    16 x 16 x BV dot: S is a tuple of Dk/16 [16, BV] tiles, X, V', O tuples of C/16, and the
    q/k/v/Tinv/P operands are [16, 16] tiles loaded right before use. Live, 4 warps: S + X + V'
    + O = (8 + 3 x 4) x 16 BV / 128 fp32 regs/thread (40 at BV=16) plus one dot's operands.
    Work per chunk (C=64, Dk=128): 64 + 10 + 10 + 32 dots = 116 x 256 BV FMA (0.48M at BV=16);
    9B at 512 tokens: 32 heads x 8 value blocks = 256 programs x 8 chunks."""
    NB: tl.constexpr = C // 16
    NK: tl.constexpr = BLOCK_K // 16
    bi = tl.program_id(0)
    h = tl.program_id(1)
    vb = tl.program_id(2)
    kh = _key_head(h, Hk, Hv, GROUPED)
    start = tl.load(cu_ptr + bi)
    L = tl.load(cu_ptr + bi + 1) - start
    slot = tl.load(slot_ptr + bi).to(tl.int64)
    has_init = tl.load(init_ptr + bi) != 0
    r = tl.arange(0, 16)
    vv = vb * BLOCK_V + tl.arange(0, BLOCK_V)
    vm = vv < DV
    sp = st_ptr + slot * ss_s + h * ss_h + vv[None, :]
    S = ()
    for i in tl.static_range(NK):
        ks = i * 16 + r
        S += (tl.load(sp + ks[:, None] * ss_k, mask=(ks < DK)[:, None] & vm[None, :] & has_init,
                      other=0.0),)
    for c0 in range(0, L, C):
        # per-chunk base pointers (64-bit), then small 32-bit offsets within the chunk
        t0 = (start + c0).to(tl.int64)
        qc = q_ptr + t0 * sq_t + kh * sq_h
        kc = k_ptr + t0 * sk_t + kh * sk_h
        vc = v_ptr + t0 * sv_t + h * sv_h
        sc = h * T + t0                                       # scratch row of the chunk's first token
        tc = t_ptr + sc * C
        pc = p_ptr + sc * C
        fc = f_ptr + sc
        egl = tl.load(fc + 4 * Hv * T)
        ms = ()
        X = ()
        O = ()
        Vn = ()
        for j in tl.static_range(NB):
            rj = j * 16 + r
            rm = c0 + rj < L
            fbeta = tl.load(fc + 3 * Hv * T + rj, mask=rm, other=0.0)
            ms += (rm,)
            X += (_rows(vc, rj, sv_t, 0, vv, rm, vm) * fbeta[:, None],)
            O += (tl.zeros((16, BLOCK_V), tl.float32),)
            Vn += (tl.zeros((16, BLOCK_V), tl.float32),)
        # X = beta V - (beta e^gc Kn) S and O = (Qn e^gc) S, key tile by key tile
        for i in tl.static_range(NK):
            ks = i * 16 + r
            km = ks < DK
            nx = ()
            no = ()
            for j in tl.static_range(NB):
                rj = j * 16 + r
                fq = tl.load(fc + rj, mask=ms[j], other=0.0)
                fb = tl.load(fc + 2 * Hv * T + rj, mask=ms[j], other=0.0)
                Kb = _rows(kc, rj, sk_t, 0, ks, ms[j], km) * fb[:, None]
                Qg = _rows(qc, rj, sq_t, 0, ks, ms[j], km) * fq[:, None]
                nx += (X[j] - tl.dot(Kb, S[i], input_precision=PREC),)
                no += (O[j] + tl.dot(Qg, S[i], input_precision=PREC),)
            X = nx
            O = no
        ns = ()
        for i in tl.static_range(NK):
            ns += (S[i] * egl,)
        S = ns
        # by column block l: V'_j += Tinv_jl X_l (V'_l is then final), O_j += P_jl V'_l (O_l is
        # then final), S += Kd_l^T V'_l
        for l in tl.static_range(NB):
            rl = l * 16 + r
            Vn = _add_column_block(Vn, tc, X[l], r, C, ms, l, NB, PREC)
            O = _add_column_block(O, pc, Vn[l], r, C, ms, l, NB, PREC)
            tl.store(o_ptr + (t0 + rl)[:, None] * so_t + h * so_h + vv[None, :],
                     O[l].to(o_ptr.dtype.element_ty), mask=ms[l][:, None] & vm[None, :])
            fk = tl.load(fc + Hv * T + rl, mask=ms[l], other=0.0)
            ns = ()
            for i in tl.static_range(NK):
                ks = i * 16 + r
                Kt = tl.load(kc + rl[None, :] * sk_t + ks[:, None],
                             mask=(ks < DK)[:, None] & ms[l][None, :], other=0.0).to(tl.float32)
                ns += (S[i] + tl.dot(Kt * fk[None, :], Vn[l], input_precision=PREC),)
            S = ns
    for i in tl.static_range(NK):
        ks = i * 16 + r
        tl.store(sp + ks[:, None] * ss_k, S[i], mask=(ks < DK)[:, None] & vm[None, :])


# Phase-2 dot precision: "ieee" (fp32 FMA) everywhere. "tf32" would be a CUDA-only option; it is
# not used (not verified against the GPU tests' tolerance; "tf32x3" spills more than ieee here).
_SCAN_PRECISION = "ieee"


def _chunk_map(cu_seqlens, C, max_chunks):
    """(sequence of every chunk slot, first chunk of each sequence), int32, on the device."""
    lens = (cu_seqlens[1:] - cu_seqlens[:-1]).to(torch.int64)
    nch = (lens + C - 1) // C
    ccum = torch.cumsum(nch, 0)
    cfirst = (ccum - nch).to(torch.int32)
    cseq = torch.searchsorted(ccum, torch.arange(max_chunks, device=cu_seqlens.device), right=True)
    return cseq.to(torch.int32), cfirst


def gated_delta_rule_prefill(q, k, v, a, b, A_log, dt_bias, cu_seqlens, ssm_states, state_slots,
                             has_initial_state, *, v_head_order="grouped", chunk_size=64,
                             block_v=None, num_warps=4, num_stages=None):
    T, Hk, DK = k.shape
    Hv, DV = v.shape[1], v.shape[2]
    B = state_slots.shape[0]
    o = empty((T, Hv, DV), v.dtype, v.device)
    if B == 0:
        return o
    check_layout(q, k, v, a, b, ssm_states)
    C = max(16, next_pow2(chunk_size))
    assert C <= 64, "chunk_size must be at most 64"
    BLOCK_K = max(16, next_pow2(DK))
    if block_v is None:  # 32 value columns per program once one sequence fills the device
        # twice; not from the batch size, so a new batch never compiles another variant
        block_v = 32 if Hv * triton.cdiv(DV, 32) >= 2 * num_sms(v.device) else 16
    BLOCK_V = max(16, min(block_v, next_pow2(DV)))
    grouped = v_head_order == "grouped"
    init = step_memo("gdn.init", (has_initial_state,), None, lambda: has_initial_state.to(torch.int32))
    # phase-1 outputs per value head and token: Tinv and P rows, 5 row factors
    tinv = torch.empty((Hv, T, C), dtype=torch.float32, device=v.device)
    p = torch.empty((Hv, T, C), dtype=torch.float32, device=v.device)
    f = torch.empty((5, Hv, T), dtype=torch.float32, device=v.device)
    if T > 0:
        # chunk bookkeeping on the device (no host sync): chunks per sequence, first chunk index
        # of each sequence, and the sequence of every chunk slot (slots past the total get B)
        max_chunks = triton.cdiv(T, C) + B
        cseq, cfirst = step_memo("gdn.chunks", (cu_seqlens,), (T, C, B),
                                 lambda: _chunk_map(cu_seqlens, C, max_chunks))
        _gdn_chunk_kernel[(max_chunks, Hv)](
            q, k, a, b, A_log, dt_bias, cu_seqlens, cseq, cfirst, tinv, p, f, B, T, Hk, Hv, DK,
            q.stride(0), q.stride(1), k.stride(0), k.stride(1), a.stride(0), b.stride(0),
            DK ** -0.5, GROUPED=grouped, C=C, BLOCK_K=BLOCK_K, num_warps=4, num_stages=1)
    if num_stages is None:  # the next chunk's loads in flight during this one's math (CUDA;
        # ROCm keeps one stage)
        num_stages = 1 if is_rocm() else 2
    _gdn_scan_kernel[(B, Hv, triton.cdiv(DV, BLOCK_V))](
        q, k, v, tinv, p, f, cu_seqlens, ssm_states, state_slots, init, o, T, Hk, Hv, DK, DV,
        q.stride(0), q.stride(1), k.stride(0), k.stride(1), v.stride(0), v.stride(1),
        ssm_states.stride(0), ssm_states.stride(1), ssm_states.stride(2), o.stride(0),
        o.stride(1), GROUPED=grouped, C=C, BLOCK_K=BLOCK_K, BLOCK_V=BLOCK_V,
        PREC=_SCAN_PRECISION, num_warps=num_warps, num_stages=num_stages)
    return o
