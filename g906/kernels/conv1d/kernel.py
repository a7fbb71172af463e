"""Triton kernels for the causal depthwise conv1d + SiLU.

The state of a sequence is a ring of its last inputs (reference.py: token t in column t % K).
Prefill: programs tile (tokens, channels) of the flat varlen batch; each token finds its
sequence through a seq_idx vector (searchsorted on cu_seqlens, no host sync) and reads taps
before the chunk's start from the slot's ring (or zeros). A second kernel then writes each
sequence's last K-1 new inputs into their ring columns.
"""

from __future__ import annotations

import torch
import triton
import triton.language as tl

from .._triton_util import empty, empty_like, next_pow2, step_memo
from ..pdl import pdl_args, pdl_start


@triton.jit(do_not_specialize=["T"])
def _conv_prefill_kernel(x_ptr, w_ptr, cu_ptr, sid_ptr, st_ptr, slot_ptr, init_ptr, ctx_ptr,
                         out_ptr, T, C, sx_t, so_t, sw_c, ss_s, ss_c, K: tl.constexpr,
                         BLOCK_T: tl.constexpr, BLOCK_C: tl.constexpr):
    tt = tl.program_id(0) * BLOCK_T + tl.arange(0, BLOCK_T)
    cc = tl.program_id(1) * BLOCK_C + tl.arange(0, BLOCK_C)
    tmask = tt < T
    cmask = cc < C
    sid = tl.load(sid_ptr + tt, mask=tmask, other=0)
    start = tl.load(cu_ptr + sid, mask=tmask, other=0)
    slot = tl.load(slot_ptr + sid, mask=tmask, other=0).to(tl.int64)
    init = tl.load(init_ptr + sid, mask=tmask, other=0) != 0
    first = tl.load(ctx_ptr + sid, mask=tmask, other=0)     # the chunk's first token's index
    p = tt - start                                           # position inside the chunk
    acc = tl.zeros([BLOCK_T, BLOCK_C], tl.float32)
    m2 = tmask[:, None] & cmask[None, :]
    for j in tl.static_range(K):
        w = tl.load(w_ptr + cc * sw_c + j, mask=cmask, other=0.0).to(tl.float32)
        src = p - (K - 1) + j                                # chunk index of this tap's input
        in_chunk = src >= 0
        xv = tl.load(x_ptr + (tt - (K - 1) + j).to(tl.int64)[:, None] * sx_t + cc[None, :],
                     mask=m2 & in_chunk[:, None], other=0.0).to(tl.float32)
        u = first + src                                      # its index in the sequence
        in_ring = (~in_chunk) & init & (u >= 0)
        col = tl.where(in_ring, u, 0) % K
        sv = tl.load(st_ptr + slot[:, None] * ss_s + cc[None, :] * ss_c + col[:, None],
                     mask=m2 & in_ring[:, None], other=0.0).to(tl.float32)
        acc += (xv + sv) * w[None, :]
    y = acc / (1.0 + tl.exp(-acc))
    tl.store(out_ptr + tt.to(tl.int64)[:, None] * so_t + cc[None, :], y.to(out_ptr.dtype.element_ty),
             mask=m2)


@triton.jit
def _conv_state_kernel(x_ptr, cu_ptr, st_ptr, slot_ptr, ctx_ptr, C, sx_t, ss_s, ss_c,
                       K: tl.constexpr, BLOCK_K: tl.constexpr, BLOCK_C: tl.constexpr):
    b = tl.program_id(0)
    cc = tl.program_id(1) * BLOCK_C + tl.arange(0, BLOCK_C)
    cmask = cc < C
    start = tl.load(cu_ptr + b)
    L = tl.load(cu_ptr + b + 1) - start
    slot = tl.load(slot_ptr + b).to(tl.int64)
    first = tl.load(ctx_ptr + b)
    i = tl.arange(0, BLOCK_K)
    src = L - (K - 1) + i                                    # chunk index of the i-th last input
    m = (i < (K - 1)) & (src >= 0)
    m2 = cmask[None, :] & m[:, None]
    xv = tl.load(x_ptr + (start + src).to(tl.int64)[:, None] * sx_t + cc[None, :], mask=m2,
                 other=0.0)
    col = (first + tl.where(m, src, 0)) % K
    tl.store(st_ptr + slot * ss_s + cc[None, :] * ss_c + col[:, None],
             xv.to(st_ptr.dtype.element_ty), mask=m2)


def _token_seq(cu_seqlens, T):
    """The sequence of every token (int32, on the device)."""
    tok = torch.arange(T, device=cu_seqlens.device, dtype=cu_seqlens.dtype)
    return torch.searchsorted(cu_seqlens[1:].contiguous(), tok, right=True).to(torch.int32)


def causal_conv1d_prefill(x, weight, cu_seqlens, conv_states, state_slots, has_initial_state,
                          context_lens):
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
            x, weight, cu_seqlens, sid, conv_states, state_slots, init, context_lens, out, T, C,
            x.stride(0), out.stride(0), weight.stride(0), conv_states.stride(0),
            conv_states.stride(1), K=K, BLOCK_T=BLOCK_T, BLOCK_C=BLOCK_C, num_warps=4)
    if B > 0:
        BLOCK_C = 256
        _conv_state_kernel[(B, triton.cdiv(C, BLOCK_C))](
            x, cu_seqlens, conv_states, state_slots, context_lens, C, x.stride(0),
            conv_states.stride(0), conv_states.stride(1), K=K, BLOCK_K=next_pow2(K - 1),
            BLOCK_C=BLOCK_C, num_warps=4)
    return out


@triton.jit
def conv_taps(wp, rp, cmask, t, K: tl.constexpr):
    """The conv step of one new token (sequence index t) for a vector of channels, without
    the token itself: (sum of the K-1 earlier inputs times their weights, the weight of the
    new input), fp32. wp / rp point at the channels' weight rows [K] and rings [K]. Reads no
    input of this step, so a kernel may call it before its PDL wait."""
    acc = tl.zeros(cmask.shape, tl.float32)
    for i in tl.static_range(K - 1):                   # oldest tap first: token t - (K-1) + i
        s = tl.load(rp + (t + 1 + i) % K, mask=cmask & (t - (K - 1) + i >= 0), other=0.0)
        acc += s.to(tl.float32) * tl.load(wp + i, mask=cmask, other=0.0).to(tl.float32)
    return acc, tl.load(wp + (K - 1), mask=cmask, other=0.0).to(tl.float32)


@triton.jit
def conv_finish(x, taps, w_new, rp, cmask, t, write, K: tl.constexpr):
    """silu(conv) from conv_taps' two values and the new inputs x (loaded); writes x into
    ring column t % K where `write` (the ring's other columns are the ones read)."""
    acc = taps + x.to(tl.float32) * w_new
    tl.store(rp + t % K, x.to(rp.dtype.element_ty), mask=cmask & write)
    return acc / (1.0 + tl.exp(-acc))


@triton.jit
def _conv_decode_kernel(x_ptr, w_ptr, st_ptr, slot_ptr, len_ptr, out_ptr, C, sx_b, so_b, sw_c,
                        ss_s, ss_c, K: tl.constexpr, BLOCK_C: tl.constexpr,
                        PDL: tl.constexpr = False):
    """One step per (sequence, channel block)."""
    pdl_start(PDL)
    b = tl.program_id(0)
    cc = tl.program_id(1) * BLOCK_C + tl.arange(0, BLOCK_C)
    cmask = cc < C
    slot = tl.load(slot_ptr + b).to(tl.int64)
    t = tl.load(len_ptr + b) - 1
    rp = st_ptr + slot * ss_s + cc * ss_c
    taps, w_new = conv_taps(w_ptr + cc * sw_c, rp, cmask, t, K)
    x = tl.load(x_ptr + b.to(tl.int64) * sx_b + cc, mask=cmask, other=0.0)
    y = conv_finish(x, taps, w_new, rp, cmask, t, True, K)
    tl.store(out_ptr + b.to(tl.int64) * so_b + cc, y.to(out_ptr.dtype.element_ty), mask=cmask)


def causal_conv1d_decode(x, weight, conv_states, state_slots, seq_lens):
    B, C = x.shape
    K = weight.shape[1]
    out = empty_like(x)
    if B == 0:
        return out
    assert x.stride(1) == 1 and weight.stride(1) == 1 and conv_states.stride(2) == 1
    BLOCK_C = 256
    _conv_decode_kernel[(B, triton.cdiv(C, BLOCK_C))](
        x, weight, conv_states, state_slots, seq_lens, out, C, x.stride(0), out.stride(0),
        weight.stride(0), conv_states.stride(0), conv_states.stride(1), K=K, BLOCK_C=BLOCK_C,
        num_warps=4, **pdl_args(x.device))
    return out
