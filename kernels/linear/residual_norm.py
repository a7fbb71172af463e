"""The RMSNorm between two decode projections, done by the two GEMVs (no kernel of its own).

Between a layer's output projection (y) and the next input projection sits
`h = y + residual; x = h / rms(h) * w`. Split over the two GEMVs:
- the producer ends with the add and the weight on the columns it owns: it stores h (the new
  residual stream), hn = h * w, and adds its program's sum of h * h per token into one
  accumulator per token (`add_norm_store`);
- the consumer streams hn as its activations and scales each token's sums by 1 / rms(h) at the
  end, from that accumulator (`rms_total`, loaded before its loop; `rms_scale`).
The accumulator is an int64 in fixed point (SS_FRAC_BITS fractional bits), added atomically:
integer sums do not depend on the order the programs finish in, so the result is the same on
every run (graph replays and eager steps alike), and the consumer reads one value per token
whatever the producer's grid (partial sums per program, read by every consumer program, cost
the 9B more than the faster 4-row GEMVs saved: docs/PERF.md E15). It must start at zero: the
caller passes zeroed accumulators (the model zeroes one buffer for all the norms of a step)
or the GEMV allocates a zeroed one. Range: sums of squares below 2^(63 - SS_FRAC_BITS) ~ 5e11
per token (an RMS of ~1e4 over 4096 columns), resolution 2^-SS_FRAC_BITS per program.
The product is the same as the separate kernel's up to rounding: hn * (1 / rms) is not rounded
to the activation dtype before the multiply. Used by the dense (fp16/fp32) decode GEMV; the
quantized GEMVs measured no gain from it (kernel.linear_fuses_norm).

add_norm = (residual, norm_weight, zero_centred[, sums]) and rms_of = (sums, eps) are the
host-side arguments of kernel.linear and friends; reference.py says what they compute.
"""

from __future__ import annotations

import triton
import triton.language as tl

from . import reference as _ref


@triton.jit
def add_norm_load(tt, nn, T, N, r_ptr, sr, nw_ptr, ZC: tl.constexpr):
    """(residual [BT, BN], weight [BN]) fp32 for add_norm_store, loaded before the GEMV's loop
    so that their latency hides behind it (after it, it was one more memory round trip)."""
    nm = nn < N
    m = (tt < T)[:, None] & nm[None, :]
    r = tl.load(r_ptr + tt.to(tl.int64)[:, None] * sr + nn[None, :], mask=m, other=0.0)
    w = tl.load(nw_ptr + nn, mask=nm, other=0.0).to(tl.float32)
    if ZC:
        w = w + 1.0
    return r.to(tl.float32), w


SS_FRAC_BITS = _ref.SS_FRAC_BITS           # the kernels below spell out 2^24
assert SS_FRAC_BITS == 24


@triton.jit
def add_norm_store(y, r, w, tt, nn, T, N, h_ptr, hn_ptr, sh, ss_ptr):
    """y fp32 [BT, BN] = outputs of tokens tt, columns nn; r, w from add_norm_load. Stores
    h = y + r (y rounded to the output dtype first, as separate ops would), hn = h * w, and
    adds the sum of h * h over its columns to ss[t] (int64 fixed point, see above)."""
    dt = h_ptr.dtype.element_ty
    tm = tt < T
    m = tm[:, None] & (nn < N)[None, :]
    t64 = tt.to(tl.int64)[:, None]
    h = (y.to(dt).to(tl.float32) + r).to(dt)
    tl.store(h_ptr + t64 * sh + nn[None, :], h, mask=m)
    hf = tl.where(m, h.to(tl.float32), 0.0)
    tl.store(hn_ptr + t64 * sh + nn[None, :], (hf * w[None, :]).to(dt), mask=m)
    part = tl.sum(hf * hf, axis=1) * 16777216.0              # 2^SS_FRAC_BITS (exact in fp32)
    tl.atomic_add(ss_ptr + tt, (part + 0.5).to(tl.int64), mask=tm, sem="relaxed")


@triton.jit
def rms_total(ss_ptr, tt, T):
    """Tokens tt's sums of squares (fp32) from their accumulators ss [T] (int64 fixed point),
    loaded before the GEMV's loop so the latency hides behind it."""
    return tl.load(ss_ptr + tt, mask=tt < T, other=0).to(tl.float32) * (1.0 / 16777216.0)


@triton.jit
def rms_scale(total, K, eps):
    """1 / rms of rows of K columns from their sums of squares (rms_total)."""
    return 1.0 / tl.sqrt(total / K + eps)
