"""packed_matmul: the product with a repacked weight (PackedQuant), on the path that fits.

T <= 16 off tensor cores: the packed GEMV (packed_gemv.py); prefill on CUDA: the weights
dequantized for the vendor GEMM; else the tiled dequant-GEMM (packed_gemm.py).
"""

from __future__ import annotations

import functools

import torch
import triton

from .. import registry
from .._triton_util import empty, next_pow2
from ..pdl import pdl_args
from . import packed_config
from .packed_config import (_launch_regs, _pq_args, _pq_loop_flags, _pq_pairs, _pq_rows,
                            _pq_splits, _pq_takes_dot, _whole_row_blocks, warp_size)
from .packed_fields import PQ_E, PQ_QTYPES
from .packed_gemm import _pq_dequant_matmul, _pq_gemm
from .packed_gemv import _pq_gemv_kernel
from .residual_norm import _add_norm_args, _around, _rms_in_registers, _rms_of_args


def packed_matmul(x, pw, *, silu=False, glu=False, add_norm=None, rms_of=None, **cfg):
    """x [T, K] @ dequant(pw)^T -> [T, N] for a PackedQuant pw (GEMV for T <= 16).
    silu: x is [T, 2K] = [gate | up] and the product is with silu(gate) * up (applied on load
    by the GEMV; other paths run the silu-mul first).
    glu: pw is [gate; up] (N = 2I rows) and the result [T, I] is silu(x @ gate^T) * (x @ up^T),
    computed by the GEMV's epilogue (one split of K), else by a silu-mul after the product.
    add_norm, rms_of: as linear's, inside the GEMV (one split of K), else around the product."""
    T = x.shape[0]
    K = pw.shape[1]
    N = pw.shape[0]
    assert x.stride(1) == 1 and x.shape[1] == (2 * K if silu else K) and K % 256 == 0
    assert not (glu and add_norm is not None)
    qt = pw.qtype
    QT, E = PQ_QTYPES[qt], PQ_E[qt]
    dot = cfg.pop("DOT", None)
    if dot is None:
        dot = _pq_takes_dot(x)
    gemv = 0 < T <= 16 and not dot
    if gemv:
        # looked up in its module at each call: benchmarks/engine.py --gemv-config replaces it
        c = packed_config._pq_gemv_config(T, N, K, qt, x.device)
        c.update(cfg)
        c["PAIRS"] = _pq_pairs(x, qt, c, "PAIRS" in cfg, glu)
        c["BLOCK_N"] = _pq_rows(qt, c, "BLOCK_N" in cfg)
        if pw.row_pairs:   # whole stored pairs a program; GLU: a gate pair and its up pair
            unit = 4 if glu else 2
            c["BLOCK_N"] = triton.cdiv(c["BLOCK_N"], unit) * unit
        BN, warps, split = c["BLOCK_N"], c["num_warps"], c["SPLIT"]
        H = c.get("H") or warp_size(x.device) * warps
        KW = K // E
        kw_len, split = _pq_splits(KW, split)
        # the silu of GLU, the residual add and the 1 / rms need whole sums; GLU pairs rows
        whole = glu or add_norm is not None or rms_of is not None
        # (row-paired GLU: an odd number of gate rows would put a pair across gate and up)
        gemv = (not (glu and (BN % 2 or (pw.row_pairs and (N // 2) % 2)))
                and (split == 1 or not whole))
    if not gemv and (add_norm is not None or rms_of is not None):
        return _around(functools.partial(packed_matmul, silu=silu, glu=glu, DOT=dot), x, pw,
                       add_norm, rms_of, **cfg)
    out = empty((T, N // 2 if glu else N), x.dtype, x.device)
    if T == 0:
        return out
    if not gemv and (silu or glu):   # the silu-mul as its own op, before or after
        if silu:
            return packed_matmul(registry.dispatch("silu_and_mul", x), pw, DOT=dot, **cfg)
        return registry.dispatch("silu_and_mul", packed_matmul(x, pw, DOT=dot, **cfg))
    if gemv:
        x, rms_of = _rms_in_registers(x, rms_of)
        qs, qh, a, b = _pq_args(pw)
        bt = c["BLOCK_T"]
        pdl = pdl_args(x.device)
        # the peeled first iteration pays only before a PDL wait (cfg may force it: tests)
        preload = cfg["PRELOAD"] if "PRELOAD" in cfg else c["PRELOAD"] and bool(pdl)
        even, prefetch, preload = _pq_loop_flags(KW, kw_len, H, c.get("PREFETCH"), preload, qt)
        if split == 1:
            dst, so_split = out, 0
        else:
            dst = torch.empty((split, T, N), dtype=torch.float32, device=x.device)
            so_split = T * N
        hn, r, sr, anw, ss_out, zc = _add_norm_args(add_norm, out, triton.cdiv(N, BN))
        ss_in, p_in, eps_in = _rms_of_args(rms_of, x)
        _pq_gemv_kernel[(triton.cdiv(N, BN), split, triton.cdiv(T, bt))](
            x, qs, qh, a, b, dst, N, T, KW, x.stride(0), qs.stride(0), qh.stride(0),
            a.stride(0), b.stride(0), dst.stride(-2), so_split, kw_len, 0x3F800000,
            r, sr, hn, anw, ss_out, ss_in, p_in, eps_in,
            QT=QT, E=E, H=H, BLOCK_N=BN, BLOCK_T=bt, EVEN=even, PREFETCH=prefetch,
            PAIRS=c["PAIRS"], SILU=silu, WSPLIT=c["WSPLIT"], ONE_IMM=c["ONE_IMM"], CVT=c["CVT"],
            TOKEN_BLOCKS=T > bt, num_warps=warps, PRELOAD=preload, GLU=glu, ADD_NORM=zc,
            RMS_IN=rms_of is not None, BLOCK_P=next_pow2(p_in), **pdl,
            EVEN_N=_whole_row_blocks(N, BN, glu), ROWPAIRED=pw.row_pairs,
            **_launch_regs(x.device, zc, glu, QT, c["PAIRS"], preload))
        if split > 1:
            torch.sum(dst, 0, out=out) if out.dtype == torch.float32 else out.copy_(dst.sum(0))
        return (out, hn, ss_out) if add_norm is not None else out
    if T > 16 and x.device.type == "cuda" and x.dtype != torch.float32 and not cfg:
        return _pq_dequant_matmul(x, pw, out)
    return _pq_gemm(x, pw, out, **cfg)
