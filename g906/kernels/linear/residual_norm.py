"""The RMSNorm between two decode projections, done by the two GEMVs (no kernel of its own).

Between a layer's output projection (y) and the next input projection sits
`h = y + residual; x = h / rms(h) * w`. Split over the two GEMVs:
- the producer ends with the add and the weight on the columns it owns: it stores h (the new
  residual stream), hn = h * w, and its program's sum of h * h per token (`add_norm_store`;
  partial sums [T, programs]);
- the consumer streams hn as its activations and scales each token's sums by 1 / rms(h) at the
  end, from those partial sums (`rms_partials`, `rms_scale`: a few hundred floats per token,
  loaded before its loop; reading h beside the activations instead would add instructions
  to the loop).
The product is the same as the separate kernel's up to rounding: hn * (1 / rms) is not rounded
to the activation dtype before the multiply. Used by the dense (fp16/fp32) decode GEMV, and on
CUDA by the packed K-quant GEMVs (kernel.linear_fuses_norm), which load these operands after
their loop instead (registers).

add_norm = (residual, norm_weight, zero_centred) and rms_of = (partial sums, eps) are the
host-side arguments of kernel.linear and friends; reference.py says what they compute.
"""

from __future__ import annotations

import torch
import triton
import triton.language as tl

from .._triton_util import empty, next_pow2


@triton.jit
def add_norm_load(tt, nn, T, N, r_ptr, sr, nw_ptr, ZC: tl.constexpr):
    """(residual [BT, BN], weight [BN]) fp32 for add_norm_store, loaded before the GEMV's loop
    so that their latency hides behind it (after it, it would be one more memory round trip)."""
    nm = nn < N
    m = (tt < T)[:, None] & nm[None, :]
    r = tl.load(r_ptr + tt.to(tl.int64)[:, None] * sr + nn[None, :], mask=m, other=0.0)
    w = tl.load(nw_ptr + nn, mask=nm, other=0.0).to(tl.float32)
    if ZC:
        w = w + 1.0
    return r.to(tl.float32), w


@triton.jit
def add_norm_store(y, r, w, tt, nn, T, N, h_ptr, hn_ptr, sh, ss_ptr):
    """y fp32 [BT, BN] = outputs of tokens tt, columns nn (program_id(0) of num_programs(0)
    along N); r, w from add_norm_load. Stores h = y + r (y rounded to the output dtype first,
    as separate ops would), hn = h * w and ss[t, program] = sum of h * h over its columns."""
    dt = h_ptr.dtype.element_ty
    tm = tt < T
    m = tm[:, None] & (nn < N)[None, :]
    t64 = tt.to(tl.int64)[:, None]
    h = (y.to(dt).to(tl.float32) + r).to(dt)
    tl.store(h_ptr + t64 * sh + nn[None, :], h, mask=m)
    hf = tl.where(m, h.to(tl.float32), 0.0)
    tl.store(hn_ptr + t64 * sh + nn[None, :], (hf * w[None, :]).to(dt), mask=m)
    tl.store(ss_ptr + tt * tl.num_programs(0) + tl.program_id(0), tl.sum(hf * hf, axis=1),
             mask=tm)


@triton.jit
def rms_partials(ss_ptr, P, tt, T, BLOCK_T: tl.constexpr, BLOCK_P: tl.constexpr):
    """The P (<= BLOCK_P) partial sums of squares of tokens tt (ss [T, P], contiguous), loaded
    before the GEMV's loop and reduced after it (rms_scale): the latency hides behind it."""
    pp = tl.arange(0, BLOCK_P)
    m = (tt < T)[:, None] & (pp < P)[None, :]
    return tl.load(ss_ptr + tt[:, None] * P + pp[None, :], mask=m, other=0.0)


@triton.jit
def rms_scale(partials, K, eps):
    """1 / rms of rows of K columns from rms_partials' [BT, BLOCK_P] partial sums."""
    return 1.0 / tl.sqrt(tl.sum(partials, axis=1) / K + eps)


def _add_norm_args(add_norm, out, programs):
    """(hn, residual, its row stride, norm weight, partial sums [T, programs], ADD_NORM) for a
    GEMV of `programs` programs along N whose out is h."""
    if add_norm is None:
        return out, out, 0, out, out, 0
    residual, nw, zero_centred = add_norm
    assert residual.shape == out.shape and residual.stride(-1) == 1 and nw.numel() == out.shape[1]
    ss = empty((out.shape[0], programs), torch.float32, out.device)
    return (empty(out.shape, out.dtype, out.device), residual, residual.stride(0), nw, ss,
            2 if zero_centred else 1)


def _rms_in_registers(x, rms_of):
    """rms_of, or None with x scaled first (reference.rms_in) where its partial sums are too
    many to hold in registers through the GEMV's loop (rms_partials)."""
    if rms_of is not None and next_pow2(x.shape[0]) * next_pow2(rms_of[0].shape[1]) > 4096:
        from .reference import rms_in

        return rms_in(x, rms_of), None
    return x, rms_of


def _rms_of_args(rms_of, x):
    """(partial sums [T, P], P, eps) for a GEMV whose activations are hn (residual_norm.py)."""
    if rms_of is None:
        return x, 1, 0.0
    ss, eps = rms_of
    assert ss.dim() == 2 and ss.shape[0] == x.shape[0] and ss.is_contiguous()
    return ss, ss.shape[1], float(eps)


def _around(fn, x, weight, add_norm, rms_of, **kw):
    """fn(x, weight) with add_norm / rms_of computed outside it (reference.py's definition):
    calls whose kernel cannot take them in."""
    from .reference import add_norm_out, rms_in

    return add_norm_out(fn(rms_in(x, rms_of), weight, **kw), add_norm)
