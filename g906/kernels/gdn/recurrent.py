"""The gated delta rule token by token over a varlen batch of short sequences.

A speculative verify step runs 1 + k tokens a sequence (k <= 8), and its rollback replays the
accepted ones. The chunked prefill (kernel.py) would pad every such sequence to a whole chunk
(16-64 rows of Gram matrices and triangular inverses through fp32 scratch, in two launches);
here one program per (sequence, value head, block of value columns) loads its [Dk, BLOCK_V]
state tile once, applies each token's update in registers as the decode kernel does for one
token, writes each token's output and stores the tile once: a decode step's memory traffic
whatever the number of tokens. The maths is reference.gated_delta_rule_recurrent's."""

from __future__ import annotations

import torch
import triton
import triton.language as tl

from .._triton_util import empty, next_pow2, step_memo
from .kernel import _key_head, _softplus, check_layout


@triton.jit
def _gdn_recurrent_kernel(q_ptr, k_ptr, v_ptr, a_ptr, b_ptr, alog_ptr, dtb_ptr, cu_ptr, st_ptr, slot_ptr,
                          init_ptr, o_ptr, Hk, Hv, DK, DV, sq_t, sq_h, sk_t, sk_h, sv_t, sv_h, sa_t, sb_t,
                          ss_s, ss_h, ss_k, so_t, so_h, q_scale,
                          GROUPED: tl.constexpr, BLOCK_K: tl.constexpr, BLOCK_V: tl.constexpr):
    bi = tl.program_id(0)
    h = tl.program_id(1)
    vb = tl.program_id(2)
    kh = _key_head(h, Hk, Hv, GROUPED)
    kk = tl.arange(0, BLOCK_K)
    kmask = kk < DK
    vv = vb * BLOCK_V + tl.arange(0, BLOCK_V)
    vmask = vv < DV
    m2 = kmask[:, None] & vmask[None, :]
    start = tl.load(cu_ptr + bi)
    end = tl.load(cu_ptr + bi + 1)
    slot = tl.load(slot_ptr + bi).to(tl.int64)
    sp = st_ptr + slot * ss_s + h * ss_h + kk[:, None] * ss_k + vv[None, :]
    carried = tl.load(init_ptr + bi) != 0
    S = tl.load(sp, mask=m2 & carried, other=0.0)
    neg_a = -tl.exp(tl.load(alog_ptr + h).to(tl.float32))
    dtb = tl.load(dtb_ptr + h).to(tl.float32)
    first = start.to(tl.int64)
    for i in range(0, end - start):
        t64 = first + i
        q = tl.load(q_ptr + t64 * sq_t + kh * sq_h + kk, mask=kmask, other=0.0).to(tl.float32)
        k = tl.load(k_ptr + t64 * sk_t + kh * sk_h + kk, mask=kmask, other=0.0).to(tl.float32)
        v = tl.load(v_ptr + t64 * sv_t + h * sv_h + vv, mask=vmask, other=0.0).to(tl.float32)
        a = tl.load(a_ptr + t64 * sa_t + h).to(tl.float32)
        bb = tl.load(b_ptr + t64 * sb_t + h).to(tl.float32)
        q = q / tl.sqrt(tl.sum(q * q, axis=0) + 1e-6) * q_scale
        k = k / tl.sqrt(tl.sum(k * k, axis=0) + 1e-6)
        S = S * tl.exp(neg_a * _softplus(a + dtb))
        delta = (v - tl.sum(S * k[:, None], axis=0)) * (1.0 / (1.0 + tl.exp(-bb)))
        S = S + k[:, None] * delta[None, :]
        o = tl.sum(S * q[:, None], axis=0)
        tl.store(o_ptr + t64 * so_t + h * so_h + vv, o.to(o_ptr.dtype.element_ty), mask=vmask)
    tl.store(sp, S, mask=m2)


def gated_delta_rule_recurrent(q, k, v, a, b, A_log, dt_bias, cu_seqlens, ssm_states, state_slots,
                               has_initial_state, *, v_head_order="grouped", block_v=None, num_warps=4):
    """gated_delta_rule_prefill's contract (every sequence's final state written back, from
    zeros where it has no initial state), computed token by token: for short sequences."""
    T, Hk, DK = k.shape
    Hv, DV = v.shape[1], v.shape[2]
    B = state_slots.shape[0]
    o = empty((T, Hv, DV), v.dtype, v.device)
    if B == 0:
        return o
    check_layout(q, k, v, a, b, ssm_states)
    BLOCK_K = next_pow2(DK)
    BLOCK_V = block_v or min(next_pow2(DV), 32 if B * Hv >= 256 else 16)
    init = step_memo("gdn.init", (has_initial_state,), None, lambda: has_initial_state.to(torch.int32))
    _gdn_recurrent_kernel[(B, Hv, triton.cdiv(DV, BLOCK_V))](
        q, k, v, a, b, A_log, dt_bias, cu_seqlens, ssm_states, state_slots, init, o, Hk, Hv, DK, DV,
        q.stride(0), q.stride(1), k.stride(0), k.stride(1), v.stride(0), v.stride(1), a.stride(0), b.stride(0),
        ssm_states.stride(0), ssm_states.stride(1), ssm_states.stride(2), o.stride(0), o.stride(1), DK ** -0.5,
        GROUPED=v_head_order == "grouped", BLOCK_K=BLOCK_K, BLOCK_V=BLOCK_V, num_warps=num_warps)
    return o
