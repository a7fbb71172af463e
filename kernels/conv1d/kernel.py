"""Triton kernels for the causal depthwise conv1d + SiLU.

Prefill: programs tile (tokens, channels) of the flat varlen batch; each token finds its
sequence through a seq_idx vector (searchsorted on cu_seqlens, no host sync) and reads taps
before the sequence start from the slot's saved state (or zeros). A second kernel then
writes each sequence's last K-1 inputs back into its state slot.
"""

from __future__ import annotations

import torch
import triton
import triton.language as tl

from .._triton_util import empty, empty_like, next_pow2, step_memo
from ..pdl import pdl_args, pdl_start


@triton.jit(do_not_specialize=["T"])
def _conv_prefill_kernel(x_ptr, w_ptr, cu_ptr, sid_ptr, st_ptr, slot_ptr, init_ptr, out_ptr, T, C,
                         sx_t, so_t, sw_c, ss_s, ss_c, K: tl.constexpr, BLOCK_T: tl.constexpr,
                         BLOCK_C: tl.constexpr):
    tt = tl.program_id(0) * BLOCK_T + tl.arange(0, BLOCK_T)
    cc = tl.program_id(1) * BLOCK_C + tl.arange(0, BLOCK_C)
    tmask = tt < T
    cmask = cc < C
    sid = tl.load(sid_ptr + tt, mask=tmask, other=0)
    start = tl.load(cu_ptr + sid, mask=tmask, other=0)
    slot = tl.load(slot_ptr + sid, mask=tmask, other=0).to(tl.int64)
    init = tl.load(init_ptr + sid, mask=tmask, other=0) != 0
    p = tt - start                                           # position inside the sequence
    acc = tl.zeros([BLOCK_T, BLOCK_C], tl.float32)
    m2 = tmask[:, None] & cmask[None, :]
    for j in tl.static_range(K):
        w = tl.load(w_ptr + cc * sw_c + j, mask=cmask, other=0.0).to(tl.float32)
        src = p - (K - 1) + j                                # local index of this tap's input
        in_seq = src >= 0
        xv = tl.load(x_ptr + (tt - (K - 1) + j).to(tl.int64)[:, None] * sx_t + cc[None, :],
                     mask=m2 & in_seq[:, None], other=0.0).to(tl.float32)
        sidx = tl.where(in_seq, 0, src + (K - 1))            # index in the saved state
        sv = tl.load(st_ptr + slot[:, None] * ss_s + cc[None, :] * ss_c + sidx[:, None],
                     mask=m2 & (~in_seq)[:, None] & init[:, None], other=0.0).to(tl.float32)
        acc += (xv + sv) * w[None, :]
    y = acc / (1.0 + tl.exp(-acc))
    tl.store(out_ptr + tt.to(tl.int64)[:, None] * so_t + cc[None, :], y.to(out_ptr.dtype.element_ty),
             mask=m2)


@triton.jit
def _conv_state_kernel(x_ptr, cu_ptr, st_ptr, slot_ptr, init_ptr, C, sx_t, ss_s, ss_c,
                       K: tl.constexpr, BLOCK_K: tl.constexpr, BLOCK_C: tl.constexpr):
    b = tl.program_id(0)
    cc = tl.program_id(1) * BLOCK_C + tl.arange(0, BLOCK_C)
    cmask = cc < C
    start = tl.load(cu_ptr + b)
    L = tl.load(cu_ptr + b + 1) - start
    slot = tl.load(slot_ptr + b).to(tl.int64)
    init = tl.load(init_ptr + b) != 0
    i = tl.arange(0, BLOCK_K)
    imask = i < (K - 1)
    src = L - (K - 1) + i                                    # local index of new state entry i
    in_seq = src >= 0
    m2 = cmask[None, :] & imask[:, None]
    xv = tl.load(x_ptr + (start + src).to(tl.int64)[:, None] * sx_t + cc[None, :],
                 mask=m2 & in_seq[:, None], other=0.0)
    old_idx = tl.where(in_seq, 0, L + i)
    sp = st_ptr + slot * ss_s + cc[None, :] * ss_c
    ov = tl.load(sp + old_idx[:, None], mask=m2 & (~in_seq)[:, None] & init, other=0.0)
    new = tl.where(in_seq[:, None], xv.to(st_ptr.dtype.element_ty), ov)
    tl.debug_barrier()
    tl.store(sp + i[:, None], new, mask=m2)


def _token_seq(cu_seqlens, T):
    """The sequence of every token (int32, on the device)."""
    tok = torch.arange(T, device=cu_seqlens.device, dtype=cu_seqlens.dtype)
    return torch.searchsorted(cu_seqlens[1:].contiguous(), tok, right=True).to(torch.int32)


def causal_conv1d_prefill(x, weight, cu_seqlens, conv_states, state_slots, has_initial_state):
    T, C = x.shape
    K = weight.shape[1]
    B = state_slots.shape[0]
    assert x.stride(1) == 1 and weight.stride(1) == 1 and conv_states.stride(2) == 1
    out = empty((T, C), x.dtype, x.device)
    init = step_memo("conv.init", (has_initial_state,), None, lambda: has_initial_state.to(torch.int32))
    if T > 0:
        sid = step_memo("conv.sid", (cu_seqlens,), T, lambda: _token_seq(cu_seqlens, T))
        BLOCK_T, BLOCK_C = 16, 128
        _conv_prefill_kernel[(triton.cdiv(T, BLOCK_T), triton.cdiv(C, BLOCK_C))](
            x, weight, cu_seqlens, sid, conv_states, state_slots, init, out, T, C, x.stride(0),
            out.stride(0), weight.stride(0), conv_states.stride(0), conv_states.stride(1),
            K=K, BLOCK_T=BLOCK_T, BLOCK_C=BLOCK_C, num_warps=4)
    if B > 0:
        BLOCK_C = 256
        _conv_state_kernel[(B, triton.cdiv(C, BLOCK_C))](
            x, cu_seqlens, conv_states, state_slots, init, C, x.stride(0), conv_states.stride(0),
            conv_states.stride(1), K=K, BLOCK_K=next_pow2(K - 1), BLOCK_C=BLOCK_C, num_warps=4)
    return out


@triton.jit
def _conv_decode_kernel(x_ptr, w_ptr, st_ptr, slot_ptr, out_ptr, C, sx_b, so_b, sw_c, ss_s, ss_c,
                        K: tl.constexpr, BLOCK_C: tl.constexpr, PDL: tl.constexpr = False):
    """One step per (sequence, channel block). The K-1 saved inputs are loaded tap by tap as
    [BLOCK_C] vectors of one layout, so the thread that reads a channel's taps is the one that
    writes them back shifted: one memory round trip, no barrier between reads and writes."""
    pdl_start(PDL)
    b = tl.program_id(0)
    cc = tl.program_id(1) * BLOCK_C + tl.arange(0, BLOCK_C)
    cmask = cc < C
    slot = tl.load(slot_ptr + b).to(tl.int64)
    sp = st_ptr + slot * ss_s + cc * ss_c
    wp = w_ptr + cc * sw_c
    x = tl.load(x_ptr + b.to(tl.int64) * sx_b + cc, mask=cmask, other=0.0)
    acc = x.to(tl.float32) * tl.load(wp + (K - 1), mask=cmask, other=0.0).to(tl.float32)
    for i in tl.static_range(K - 1):                   # oldest first
        s = tl.load(sp + i, mask=cmask, other=0.0)
        acc += s.to(tl.float32) * tl.load(wp + i, mask=cmask, other=0.0).to(tl.float32)
        if i > 0:
            tl.store(sp + (i - 1), s, mask=cmask)          # shift: new[i-1] = old[i]
    if K > 1:
        tl.store(sp + (K - 2), x.to(st_ptr.dtype.element_ty), mask=cmask)
    y = acc / (1.0 + tl.exp(-acc))
    tl.store(out_ptr + b.to(tl.int64) * so_b + cc, y.to(out_ptr.dtype.element_ty), mask=cmask)


def causal_conv1d_decode(x, weight, conv_states, state_slots):
    B, C = x.shape
    K = weight.shape[1]
    out = empty_like(x)
    if B == 0:
        return out
    assert x.stride(1) == 1 and weight.stride(1) == 1 and conv_states.stride(2) == 1
    BLOCK_C = 256
    _conv_decode_kernel[(B, triton.cdiv(C, BLOCK_C))](
        x, weight, conv_states, state_slots, out, C, x.stride(0), out.stride(0), weight.stride(0),
        conv_states.stride(0), conv_states.stride(1), K=K, BLOCK_C=BLOCK_C, num_warps=4,
        **pdl_args(x.device))
    return out
