"""Prefill over repacked weights: a tiled dequant-GEMM in Triton, and the packed weights
dequantized to fp16 a row block at a time for the vendor GEMM."""

from __future__ import annotations

import functools

import torch
import triton
import triton.language as tl

from .._triton_util import dequant_matmul, num_sms
from .packed_config import _pq_args
from .packed_fields import (PQ_E, PQ_QTYPES, _pq_field, _pq_scales, _q5_bytes, _q6_bytes,
                            _swap_row_halves)


@triton.jit(do_not_specialize=["M"])
def _pq_gemm_kernel(x_ptr, qs_ptr, qh_ptr, a_ptr, b_ptr, out_ptr, M, N, KW, sx, sq, sh, sa, sb,
                    so, so_split, kw_len, one, QT: tl.constexpr, E: tl.constexpr,
                    H: tl.constexpr, BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr,
                    FP32: tl.constexpr, ROWPAIRED: tl.constexpr = False):
    """Prefill (and decode T = 2..16 on CUDA, BLOCK_M = 16): per field j, the [BN, 4H] weights
    (w = A f + B) times the matching [BM, 4H] activations with tl.dot (the K terms may come
    in any order). Program (m, n, k) covers words [k * kw_len, +kw_len) (split K)."""
    EV: tl.constexpr = 4 * E
    pm = tl.program_id(0)
    pn = tl.program_id(1)
    pk = tl.program_id(2)
    mm = pm * BLOCK_M + tl.arange(0, BLOCK_M)
    nn = pn * BLOCK_N + tl.arange(0, BLOCK_N)
    mmask = mm < M
    nmask = nn < N
    nc = tl.where(nmask, nn, 0).to(tl.int64)
    n3 = nc[:, None, None]
    n2 = nc[:, None]
    v = tl.arange(0, H)
    v3 = v[None, :, None]
    v2 = v[None, :]
    w3 = tl.arange(0, 4)[None, None, :]
    xoff = tl.reshape(v3 * EV + w3, (1, 4 * H))
    xrow = x_ptr + mm.to(tl.int64)[:, None] * sx
    acc = tl.zeros([BLOCK_M, BLOCK_N], tl.float32)
    kwbeg = pk * kw_len
    kwend = tl.minimum(kwbeg + kw_len, KW)
    for kw in range(kwbeg, kwend, H * 4):
        k0 = kw * E
        vm3 = (kw + v3 * 4) < kwend
        words = tl.load(qs_ptr + n3 * sq + (kw + v3 * 4 + w3), mask=vm3, other=0)
        if ROWPAIRED:   # [BN, H, 4]: rows first here
            words = tl.permute(_swap_row_halves(tl.permute(words, [1, 0, 2]), H, BLOCK_N),
                               [1, 0, 2])
        if QT == 3:
            hi = tl.load(qh_ptr + n3 * sh + (kw // 4 + (v3 * 4 + w3) // 4), mask=vm3, other=0)
        elif QT == 4:
            hi = tl.load(qh_ptr + n3 * sh + (kw // 2 + v3 * 2 + w3 // 2), mask=vm3, other=0)
        else:
            hi = words
        if QT == 3:
            words, hi = _q5_bytes(words, hi, w3)
        if QT == 4:
            words, hi = _q6_bytes(words, hi, w3)
        vs = tl.where(kw + v2 * 4 < kwend, v2, 0)
        A, B = _pq_scales(a_ptr, b_ptr, n2, sa, sb, k0, vs, QT, 0)
        if QT == 4:
            A1, B1 = _pq_scales(a_ptr, b_ptr, n2, sa, sb, k0, vs, QT, 1)
        else:
            A1, B1 = A, B
        xm = mmask[:, None] & tl.reshape(tl.broadcast_to(vm3, (1, H, 4)), (1, 4 * H))
        for j in tl.static_range(E):
            f = _pq_field(words, hi, j, QT, one)
            if j < 4 or QT != 4:
                w = f * A[:, :, None] + B[:, :, None]
            else:
                w = f * A1[:, :, None] + B1[:, :, None]
            w2 = tl.reshape(w, (BLOCK_N, 4 * H))
            xt = tl.load(xrow + k0 + xoff + 4 * j, mask=xm, other=0.0)
            if FP32:
                acc += tl.dot(xt, tl.trans(w2), input_precision="ieee")
            else:
                acc += tl.dot(xt, tl.trans(w2.to(xt.dtype)))
    optr = out_ptr + pk * so_split + mm.to(tl.int64)[:, None] * so + nn[None, :]
    tl.store(optr, acc.to(out_ptr.dtype.element_ty), mask=mmask[:, None] & nmask[None, :])


@triton.jit
def _pq_dequant_kernel(qs_ptr, qh_ptr, a_ptr, b_ptr, out_ptr, N, KW, sq, sh, sa, sb, so, one,
                       QT: tl.constexpr, E: tl.constexpr, H: tl.constexpr, BLOCK_N: tl.constexpr,
                       FIELD_MAJOR: tl.constexpr, ROWPAIRED: tl.constexpr = False):
    """The dense weights of rows [BLOCK_N] over H vectors: element 4j + w of a vector is field j
    of its word w, worth A * f + B (the GEMV's A * sum(f x) + B * sum(x), per x).
    FIELD_MAJOR: column j * KW + (word index) instead of the natural one, so that each field's
    store is contiguous across threads (the matmul then reads x in that column order)."""
    EV: tl.constexpr = 4 * E
    nn = tl.program_id(0) * BLOCK_N + tl.arange(0, BLOCK_N)
    nmask = nn < N
    nc = tl.where(nmask, nn, 0).to(tl.int64)
    v = tl.arange(0, H)
    v3 = v[:, None, None]                             # [H, 1, 1]
    n3 = nc[None, :, None]                            # [1, BN, 1]
    w3 = tl.arange(0, 4)[None, None, :]               # [1, 1, 4]
    kw = tl.program_id(1) * H * 4
    vm3 = (kw + v3 * 4) < KW
    words = tl.load(qs_ptr + n3 * sq + (kw + v3 * 4 + w3), mask=vm3, other=0)
    if ROWPAIRED:
        words = _swap_row_halves(words, H, BLOCK_N)
    if QT == 3:
        hi = tl.load(qh_ptr + n3 * sh + (kw // 4 + (v3 * 4 + w3) // 4), mask=vm3, other=0).to(tl.int32)
        words, hi = _q5_bytes(words, hi, w3)
    elif QT == 4:
        hi = tl.load(qh_ptr + n3 * sh + (kw // 2 + v3 * 2 + w3 // 2), mask=vm3, other=0).to(tl.int32)
        words, hi = _q6_bytes(words, hi, w3)
    else:
        hi = words
    v2 = tl.where(kw + v[:, None] * 4 < KW, v[:, None], 0)
    n2 = nc[None, :]
    A0, B0 = _pq_scales(a_ptr, b_ptr, n2, sa, sb, kw * E, v2, QT, 0)      # [H, BN]
    A1, B1 = A0, B0
    if QT == 4:
        A1, B1 = _pq_scales(a_ptr, b_ptr, n2, sa, sb, kw * E, v2, QT, 1)
    if FIELD_MAJOR:
        optr = out_ptr + n3 * so + (kw + v3 * 4 + w3)
        jstep = KW
    else:
        optr = out_ptr + n3 * so + (kw * E + v3 * EV + w3)
        jstep = 4
    m = vm3 & nmask[None, :, None]
    for j in tl.static_range(E):
        f = _pq_field(words, hi, j, QT, one)
        if j < 4:
            w = A0[:, :, None] * f + B0[:, :, None]
        else:
            w = A1[:, :, None] * f + B1[:, :, None]
        tl.store(optr + j * jstep, w.to(out_ptr.dtype.element_ty), mask=m)


def packed_to_dense(pw, dtype=torch.float16, rows: tuple[int, int] | None = None, *,
                    field_major: bool = False):
    """The dense [rows, K] weights of a PackedQuant (all rows, or rows r0:r1); field_major:
    columns in field_major_order (the layout the prefill matmul uses)."""
    r0, r1 = rows if rows is not None else (0, pw.shape[0])
    K = pw.shape[1]
    qt = pw.qtype
    QT, E = PQ_QTYPES[qt], PQ_E[qt]
    qs, qh, a, b = _pq_args(pw)
    out = torch.empty((r1 - r0, K), dtype=dtype, device=qs.device)
    if r1 <= r0:
        return out
    # row r0 of every plane: plane views start there (planes are [N, ...] row-major)
    qs, qh, a, b = (t[r0:] for t in (qs, qh, a, b))
    assert not (pw.row_pairs and r0 % 2), "row-paired weights start at even rows"
    H, BN = 32, 4
    KW = K // E
    _pq_dequant_kernel[(triton.cdiv(r1 - r0, BN), triton.cdiv(KW, 4 * H))](
        qs, qh, a, b, out, r1 - r0, KW, qs.stride(0), qh.stride(0), a.stride(0), b.stride(0),
        out.stride(0), 0x3F800000, QT=QT, E=E, H=H, BLOCK_N=BN, FIELD_MAJOR=field_major,
        ROWPAIRED=pw.row_pairs, num_warps=4)
    return out


@functools.lru_cache(maxsize=64)
def field_major_order(K: int, E: int, device) -> torch.Tensor:
    """Column c = j * KW + u of the field-major layout holds element (u // 4) * 4E + 4j + u % 4
    (word u, field j) of the natural one: x[:, order] meets packed_to_dense(field_major=True)."""
    KW = K // E
    u = torch.arange(KW)
    j = torch.arange(E)
    nat = (u // 4 * 4 * E + u % 4)[None, :] + 4 * j[:, None]
    return nat.reshape(-1).to(device)




def _pq_dequant_matmul(x, pw, out):
    """Prefill: the weights dequantized to fp16 a row block at a time for the vendor GEMM
    (_triton_util.dequant_matmul), in field-major columns so that the dequant's stores
    coalesce (x is gathered into the same order once)."""
    N, K = pw.shape
    xw = x.index_select(1, field_major_order(K, PQ_E[pw.qtype], x.device)).to(torch.float16)
    return dequant_matmul(xw, N, K, lambda r0, r1: packed_to_dense(pw, torch.float16, (r0, r1), field_major=True),
                          out)


def _pq_gemm(x, pw, out, **cfg):
    """Tiled tl.dot path: prefill (T > 16), and T = 2..16 fp16 on CUDA (tensor cores; the
    broadcast GEMV costs T FMAs per weight). Split K when the tiles do not fill the GPU."""
    T, K = x.shape
    N = pw.shape[0]
    qt = pw.qtype
    QT, E = PQ_QTYPES[qt], PQ_E[qt]
    qs, qh, a, b = _pq_args(pw)
    cuda = x.device.type == "cuda"
    small = T <= 16
    if small:
        # BLOCK_N = 64 with these threads and warps keeps enough weight bytes in flight per
        # SM with the 2-3 programs that its registers let reside
        d_h, d_w = {"Q8_0": (16, 4), "Q5_K": (8, 4), "Q6_K": (8, 4)}.get(qt, (16, 8))
        d_m, d_n = 16, 64
    else:
        d_h, d_w = (8 if E == 4 else 4), 4
        d_m, d_n = (64, 64) if cuda else (16, 16)
    block_m = cfg.pop("BLOCK_M", d_m)
    block_n = cfg.pop("BLOCK_N", d_n)
    H = cfg.pop("H", d_h)
    warps = cfg.pop("num_warps", d_w)
    split = cfg.pop("SPLIT", None)
    assert not (pw.row_pairs and block_n % 2), "row-paired weights take whole pairs"
    KW = K // E
    progs = triton.cdiv(T, block_m) * triton.cdiv(N, block_n)
    if split is None:
        split = 1
        while progs * split * 2 <= 4 * num_sms(x.device) and KW // (split * 2) >= 8 * H:
            split *= 2
    step = 4 * H
    kw_len = triton.cdiv(triton.cdiv(KW, split), step) * step
    split = triton.cdiv(KW, kw_len)
    if split == 1:
        dst, so_split = out, 0
    else:
        dst = torch.empty((split, T, N), dtype=torch.float32, device=x.device)
        so_split = T * N
    _pq_gemm_kernel[(triton.cdiv(T, block_m), triton.cdiv(N, block_n), split)](
        x, qs, qh, a, b, dst, T, N, KW, x.stride(0), qs.stride(0), qh.stride(0), a.stride(0),
        b.stride(0), dst.stride(-2), so_split, kw_len, 0x3F800000, QT=QT, E=E, H=H,
        BLOCK_M=block_m, BLOCK_N=block_n, FP32=x.dtype == torch.float32,
        ROWPAIRED=pw.row_pairs, num_warps=warps)
    if split > 1:
        torch.sum(dst, 0, out=out) if out.dtype == torch.float32 else out.copy_(dst.sum(0))
    return out
