"""Dense skinny GEMM for decode (T <= 16 rows, fp16/fp32 weights [N, K]).

Each program owns BLOCK_N output features and streams their weight rows once, for all T input
rows. The op that produced the activations (silu-mul, gated RMSNorm) can be applied on load
(_gemv_input), and the RMSNorm between two projections split over them (residual_norm.py).
"""

from __future__ import annotations

import functools

import torch
import triton
import triton.language as tl

from .._triton_util import empty, is_rocm, next_pow2
from ..pdl import pdl_args, pdl_start
from .residual_norm import (_add_norm_args, _rms_in_registers, _rms_of_args, add_norm_load,
                            add_norm_store, rms_partials, rms_scale)


# weight bytes to keep in flight over the whole device per K step (enough to hide the latency)
INFLIGHT_BYTES = 3 << 20
# dense decode GEMVs up to this many weights (0.8B's projections: <= 8.4M; 9B's: >= 16.8M)
# take the short-row config (_gemv_config_cached)
SMALL_GEMV_ELEMENTS = 12 << 20


@triton.jit
def _load_silu_mul(x_ptr, p, m, K):
    """silu(x[p]) * x[p + K] (rows hold [gate | up], K apart), fp32 math rounded to x's dtype like
    the silu-mul kernel's output: the MLP's down projection fed without that kernel."""
    g = tl.load(p, mask=m, other=0.0).to(tl.float32)
    u = tl.load(p + K, mask=m, other=0.0).to(tl.float32)
    return (g / (1.0 + tl.exp(-g)) * u).to(x_ptr.dtype.element_ty)


@triton.jit
def _gemv_input(x_ptr, xrow, ks, xm, K, z_ptr, nw_ptr, tt, sz_t, sz_h, eps,
                PRO: tl.constexpr, G: tl.constexpr, BLOCK_T: tl.constexpr, BLOCK_K: tl.constexpr):
    """The [BLOCK_T, BLOCK_K] activations at columns ks, after the op that fed them (fused here
    so that op needs no kernel of its own; each program recomputes it for its K range, a few
    flops per weight row it streams). PRO 0: x itself. 1: silu(x[:, k]) * x[:, K + k] (rows
    hold [gate | up]). 2: gated RMSNorm per group of G columns (one head): norm(x) * nw *
    silu(z), z [T, K / G, G] with strides (sz_t, sz_h, 1). fp32 math, rounded to x's dtype
    like the separate kernels' outputs."""
    if PRO == 1:
        return _load_silu_mul(x_ptr, xrow + ks[None, :], xm, K)
    if PRO == 2:
        o = tl.reshape(tl.load(xrow + ks[None, :], mask=xm, other=0.0).to(tl.float32),
                       (BLOCK_T, BLOCK_K // G, G))
        r = tl.rsqrt(tl.sum(o * o, axis=2) / G + eps)                     # per (token, head)
        h = tl.reshape(o * r[:, :, None], (BLOCK_T, BLOCK_K))
        zp = z_ptr + tt.to(tl.int64)[:, None] * sz_t + (ks // G)[None, :] * sz_h + (ks % G)[None, :]
        z = tl.load(zp, mask=xm, other=0.0).to(tl.float32)
        nw = tl.load(nw_ptr + ks % G).to(tl.float32)
        return (h * nw[None, :] * (z / (1.0 + tl.exp(-z)))).to(x_ptr.dtype.element_ty)
    return tl.load(xrow + ks[None, :], mask=xm, other=0.0)


@triton.jit
def _gemv_weights(wrow, ks, K, EVEN_K: tl.constexpr):
    if EVEN_K:
        w = tl.load(wrow + ks[None, :])
    else:
        w = tl.load(wrow + ks[None, :], mask=(ks < K)[None, :], other=0.0)
    return w


@triton.jit
def _gemv_step(acc, w, x_ptr, xrow, ks, tmask, K, z_ptr, nw_ptr, tt, sz_t, sz_h, eps,
               PRO: tl.constexpr, G: tl.constexpr, BLOCK_T: tl.constexpr, BLOCK_K: tl.constexpr,
               USE_DOT: tl.constexpr, EVEN_K: tl.constexpr):
    """acc plus the products of one K block: weights w [BLOCK_N, BLOCK_K] at columns ks."""
    if EVEN_K:
        xm = tmask[:, None]
    else:
        xm = tmask[:, None] & (ks < K)[None, :]
    x = _gemv_input(x_ptr, xrow, ks, xm, K, z_ptr, nw_ptr, tt, sz_t, sz_h, eps,
                    PRO, G, BLOCK_T, BLOCK_K)
    if USE_DOT:
        acc += tl.dot(x, tl.trans(w.to(x.dtype)))
    else:
        acc += x.to(tl.float32)[:, None, :] * w.to(tl.float32)[None, :, :]
    return acc


@triton.jit
def _gemv_kernel(x_ptr, w_ptr, out_ptr, N, K, T, sx_t, sw_n, so_t, z_ptr, nw_ptr, sz_t, sz_h, eps,
                 r_ptr, sr, hn_ptr, anw_ptr, ss_out_ptr, ss_in_ptr, P_in, eps_in,
                 BLOCK_N: tl.constexpr, BLOCK_K: tl.constexpr, BLOCK_T: tl.constexpr,
                 USE_DOT: tl.constexpr, EVEN_K: tl.constexpr, PRO: tl.constexpr = 0,
                 G: tl.constexpr = 1, ADD_NORM: tl.constexpr = 0, RMS_IN: tl.constexpr = False,
                 BLOCK_P: tl.constexpr = 1, PDL: tl.constexpr = False):
    """ADD_NORM (1; 2: zero-centred weight): out is h = y + r; hn = h * anw and the partial
    sums of h * h go to hn_ptr, ss_out_ptr (residual_norm.py). RMS_IN: x is such an hn, each
    token's sums are scaled by 1 / rms from its P_in (<= BLOCK_P) partial sums at ss_in_ptr.
    The first K block of weights is loaded before the PDL wait: weights are constants, so
    while the kernel before finishes, the weight stream already runs (no restart of it at
    every kernel boundary of a decode step)."""
    pid = tl.program_id(0)
    nn = pid * BLOCK_N + tl.arange(0, BLOCK_N)
    nmask = nn < N
    nc = tl.where(nmask, nn, 0).to(tl.int64)
    kk = tl.arange(0, BLOCK_K)
    wrow = w_ptr + nc[:, None] * sw_n
    w0 = _gemv_weights(wrow, kk, K, EVEN_K)
    pdl_start(PDL)
    tt = tl.arange(0, BLOCK_T)
    tmask = tt < T
    xrow = x_ptr + tt[:, None] * sx_t
    if ADD_NORM:
        r_an, w_an = add_norm_load(tt, nn, T, N, r_ptr, sr, anw_ptr, ADD_NORM == 2)
    if RMS_IN:
        parts = rms_partials(ss_in_ptr, P_in, tt, T, BLOCK_T, BLOCK_P)
    if USE_DOT:
        acc = tl.zeros([BLOCK_T, BLOCK_N], tl.float32)
    else:
        acc = tl.zeros([BLOCK_T, BLOCK_N, BLOCK_K], tl.float32)
    acc = _gemv_step(acc, w0, x_ptr, xrow, kk, tmask, K, z_ptr, nw_ptr, tt, sz_t, sz_h, eps,
                     PRO, G, BLOCK_T, BLOCK_K, USE_DOT, EVEN_K)
    for k0 in range(BLOCK_K, K, BLOCK_K):
        ks = k0 + kk
        acc = _gemv_step(acc, _gemv_weights(wrow, ks, K, EVEN_K), x_ptr, xrow, ks, tmask, K,
                         z_ptr, nw_ptr, tt, sz_t, sz_h, eps, PRO, G, BLOCK_T, BLOCK_K, USE_DOT,
                         EVEN_K)
    if not USE_DOT:
        acc = tl.sum(acc, axis=2)
    if RMS_IN:
        acc = acc * rms_scale(parts, K, eps_in)[:, None]
    if ADD_NORM:
        add_norm_store(acc, r_an, w_an, tt, nn, T, N, out_ptr, hn_ptr, so_t, ss_out_ptr)
    else:
        tl.store(out_ptr + tt[:, None] * so_t + nn[None, :], acc.to(out_ptr.dtype.element_ty),
                 mask=tmask[:, None] & nmask[None, :])


def _gemv_config(T, N, K, device, dtype):
    return dict(_gemv_config_cached(T, N, K, device, dtype))      # callers update their copy


@functools.lru_cache(maxsize=4096)
def _gemv_config_cached(T, N, K, device, dtype):
    bt = next_pow2(T)
    use_dot = (device.type == "cuda" and not is_rocm() and bt > 4 and dtype == torch.float16)
    if use_dot:  # tensor cores from 8 tokens
        return dict(BLOCK_T=max(16, bt), BLOCK_N=32, BLOCK_K=128, USE_DOT=True, num_warps=4)
    if bt == 1 and N * K <= SMALL_GEMV_ELEMENTS:
        # small weights (the 0.8B's): 4 rows x 1024 columns (2048 for N < 4096) a program step.
        # Not for larger ones, though they too run faster so alone: in decode every GEMV carries
        # the split RMSNorm, whose partial sums grow with the programs on both sides
        # (residual_norm.py)
        block_k = min(next_pow2(K), 1024 if N >= 4096 else 2048)
        block_n = 4
    elif bt == 1:
        # keep about INFLIGHT_BYTES of weights in flight: N * BLOCK_K * elem bytes per K step
        esize = 2 if dtype == torch.float16 else 4
        block_k = next_pow2(max(1, INFLIGHT_BYTES // (N * esize)))
        block_k = max(min(256, next_pow2(K)), min(2048, block_k, next_pow2(K)))
        block_n = max(1, min(16, 4096 // block_k))
    else:
        block_k = 128 if bt <= 2 else 64
        # broadcast path: BLOCK_T * BLOCK_N * BLOCK_K fp32 partial sums in registers
        block_n = max(1, min(16, 4096 // (bt * block_k)))
    return dict(BLOCK_T=bt, BLOCK_N=block_n, BLOCK_K=block_k, USE_DOT=False, num_warps=4)


def dense_gemv(x, weight, *, prologue=None, add_norm=None, rms_of=None, **cfg):
    """x [T, K] @ weight^T for T <= 16. prologue: None, ("silu_mul",) with x [T, 2K] holding
    [gate | up], or ("gated_norm", z, norm_weight, eps) with x [T, K] = heads of G =
    norm_weight.numel() columns and z [T, K/G, G] (see _gemv_input). add_norm, rms_of: the
    RMSNorm split over two GEMVs (residual_norm.py); add_norm returns (h, hn, partial sums)."""
    T = x.shape[0]
    K = weight.shape[1]
    N = weight.shape[0]
    assert weight.stride(1) == 1 and x.stride(1) == 1
    x, rms_of = _rms_in_registers(x, rms_of)
    out = empty((T, N), x.dtype, x.device)
    c = _gemv_config(T, N, K, x.device, x.dtype)
    c.update(cfg)
    pro, G, z, nw, sz_t, sz_h, eps = 0, 1, x, x, 0, 0, 0.0
    if prologue is not None and prologue[0] == "silu_mul":
        assert x.shape[1] == 2 * K
        pro = 1
    elif prologue is not None:
        _, z, nw, eps = prologue
        pro, G = 2, nw.numel()
        assert z.stride(2) == 1 and z.shape[1] * G == K and x.shape[1] == K
        sz_t, sz_h = z.stride(0), z.stride(1)
        if c["BLOCK_K"] % G:           # whole heads per K block
            c["BLOCK_K"] = G
            if not c["USE_DOT"]:
                c["BLOCK_N"] = max(1, min(c["BLOCK_N"], 4096 // (c["BLOCK_T"] * G)))
    else:
        assert x.shape[1] == K
    hn, r, sr, anw, ss_out, zc = _add_norm_args(add_norm, out, triton.cdiv(N, c["BLOCK_N"]))
    ss_in, p_in, eps_in = _rms_of_args(rms_of, x)
    warps = c.pop("num_warps")
    if T > 0:
        _gemv_kernel[(triton.cdiv(N, c["BLOCK_N"]),)](
            x, weight, out, N, K, T, x.stride(0), weight.stride(0), out.stride(0), z, nw, sz_t,
            sz_h, float(eps), r, sr, hn, anw, ss_out, ss_in, p_in, eps_in,
            EVEN_K=K % c["BLOCK_K"] == 0, PRO=pro, G=G, ADD_NORM=zc, RMS_IN=rms_of is not None,
            BLOCK_P=next_pow2(p_in), num_warps=warps, **c, **pdl_args(x.device))
    return (out, hn, ss_out) if add_norm is not None else out
