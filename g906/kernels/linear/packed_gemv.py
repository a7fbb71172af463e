"""The packed dequant-GEMV (T <= 16) over repacked weights, one or two weights a launch.

Layout and field decoding: packed_fields.py; launch configs: packed_config.py; the host-side
launcher: packed.py (packed_matmul) and kernel.py (linear_pair).
"""

from __future__ import annotations

import triton
import triton.language as tl

from ..pdl import pdl_start
from .dense import _load_silu_mul
from .packed_fields import (_even_odd_rows, _field_fma, _nibble_pair_fma, _pq_fp16_field,
                            _pq_hi, _pq_scale_raw, _pq_scale_values, _q4k_values, _q5_bytes,
                            _q6_bytes, _row_pair_sums, _row_pair_words, _split4,
                            _split_field_fma, _swap_row_halves)
from .residual_norm import add_norm_load, add_norm_store, rms_partials, rms_scale


@triton.jit
def _pq_x16(x_ptr, p, xm, KX, SILU: tl.constexpr):
    """Activations for the packed GEMV in x's dtype; SILU: silu(x[k]) * x[KX + k]
    (_load_silu_mul)."""
    if SILU:
        return _load_silu_mul(x_ptr, p, xm, KX)
    return tl.load(p, mask=xm, other=0.0)


@triton.jit
def _pq_x(x_ptr, p, xm, KX, SILU: tl.constexpr):
    """_pq_x16 as fp32."""
    return _pq_x16(x_ptr, p, xm, KX, SILU).to(tl.float32)


@triton.jit
def _pq_vector_dot(acc, words, hi, ra, rb, ra1, x_ptr, xrow, k0, xoff, xm, KX, w3, one,
                   QT: tl.constexpr, E: tl.constexpr, H: tl.constexpr, BLOCK_T: tl.constexpr,
                   BLOCK_N: tl.constexpr, PAIRS: tl.constexpr, SILU: tl.constexpr,
                   WSPLIT: tl.constexpr, CVT: tl.constexpr, ROWPAIRED: tl.constexpr = False):
    """acc [H, BT, BN] + each thread's vector of every row (words [H, BN, 4], high bits,
    raw scales) dotted with its activations (_pq_gemv_kernel's loop body after the loads).
    ROWPAIRED: Q4_K words stored row-paired (repack.py): packed fp16 takes them as they are,
    the other paths swap them back into rows."""
    if ROWPAIRED and PAIRS != 3:
        words = _swap_row_halves(words, H, BLOCK_N)
    if QT == 0 and CVT:
        words = words ^ -2139062144         # 0x80808080: q + 128 in each byte, unsigned
    if QT == 3:
        words, hi = _q5_bytes(words, hi, w3)
    if QT == 4:
        words, hi = _q6_bytes(words, hi, w3)
    if (QT == 2 and PAIRS >= 2) or (QT == 3 and PAIRS == 3):
        DS, DM = _q4k_values(ra, rb, QT)
    else:
        A, B = _pq_scale_values(ra, rb, QT, CVT)
    if QT == 4:
        A1, B1 = _pq_scale_values(ra1, rb, QT, CVT)
    if PAIRS == 3:
        # fields in packed fp16 (Q4_K / Q5_K / Q6_K, below): two rows' words regrouped so one
        # int32 holds the same fields of both (_row_pair_words; Q5_K / Q6_K: their even
        # fields' byte words, and the odd ones' from hi; Q4_K off ROCm is stored so,
        # ROWPAIRED, which saves the regrouping in the loop).
        # 0x64006400 (fp16 1024 in both halves) from the run-time `one` (0x3F800000): a
        # register, so each field's mask and it fit one LOP3 (two immediates would not)
        magic = one ^ 0x5B806400
        if ROWPAIRED:   # stored that way (repack.py): the loads are the pairs
            pair_lo, pair_hi = _even_odd_rows(words, H, BLOCK_N)
        else:
            pair_lo, pair_hi = _row_pair_words(words, H, BLOCK_N)
        odd_lo, odd_hi = pair_lo, pair_hi
        if QT != 2:
            odd_lo, odd_hi = _row_pair_words(hi, H, BLOCK_N)
    if QT == 4 and PAIRS == 3:
        # Q6_K as Q4_K / Q5_K below, centred at its zero point: (q - 32) / 64, exact, so no
        # sum(x) term; fields 0-3 and 4-7 of a vector have their own scales (A, A1): two sums
        p0 = tl.zeros([H, BLOCK_T, BLOCK_N // 2, 4, 2], tl.float16)
        p1 = tl.zeros([H, BLOCK_T, BLOCK_N // 2, 4, 2], tl.float16)
        for j in tl.static_range(4):
            xa = _pq_x16(x_ptr, xrow + k0 + xoff + 4 * j, xm, KX, SILU)
            xb = _pq_x16(x_ptr, xrow + k0 + xoff + 4 * (j + 4), xm, KX, SILU)
            fa = _pq_fp16_field(pair_lo, pair_hi, odd_lo, odd_hi, j, QT, magic)
            fb = _pq_fp16_field(pair_lo, pair_hi, odd_lo, odd_hi, j + 4, QT, magic)
            p0 += fa[:, None] * xa[:, :, :, :, None]
            p1 += fb[:, None] * xb[:, :, :, :, None]
            if j == 0:   # (the anchor below)
                x4 = tl.sum(xa.to(tl.float32), 3)
        # + 0 * x4 (4 activations' sum): a term in the activations' layout, which Triton then
        # gives the fp16 sums too; without one (Q6_K needs no sum(x)) it spreads them across
        # lanes and converts every product through shared memory
        acc += (A[:, None] * _row_pair_sums(p0, H, BLOCK_T, BLOCK_N)
                + A1[:, None] * _row_pair_sums(p1, H, BLOCK_T, BLOCK_N)) + x4 * 0.0
    elif (QT == 2 or QT == 3) and PAIRS == 3:
        # Q4_K / Q5_K on fp16 activations in packed fp16: each field of the regrouped words
        # an fp16 pair (row 2i, row 2i + 1) meeting one activation (the pair LLVM's
        # vectorizer forms: one register, no byte permutes): per 2 weights a LOP3, a centring
        # FMA and the product's HFMA2 (_pq_fp16_field): fewer instructions a weight than fp32
        # fields. Centred (|f| <= 0.5, 8 products a lane) the fp16 sums stay near fp16
        # rounding, where the uncentred 1 + q / 16 would lose several times more; each row's
        # sum goes to fp32 once a vector
        ph = tl.zeros([H, BLOCK_T, BLOCK_N // 2, 4, 2], tl.float16)
        X = tl.zeros([H, BLOCK_T, 1], tl.float32)
        for j in tl.static_range(4):
            # two fields a step: Q4_K's j and 4 + j (lo's and hi's), Q5_K's 2j and 2j + 1
            Fa = j if QT == 2 else 2 * j
            Fb = j + 4 if QT == 2 else 2 * j + 1
            xa = _pq_x16(x_ptr, xrow + k0 + xoff + 4 * Fa, xm, KX, SILU)      # 4F + w
            xb = _pq_x16(x_ptr, xrow + k0 + xoff + 4 * Fb, xm, KX, SILU)
            X += tl.sum(xa.to(tl.float32), 3) + tl.sum(xb.to(tl.float32), 3)
            fa = _pq_fp16_field(pair_lo, pair_hi, odd_lo, odd_hi, Fa, QT, magic)
            fb = _pq_fp16_field(pair_lo, pair_hi, odd_lo, odd_hi, Fb, QT, magic)
            ph += fa[:, None] * xa[:, :, :, :, None]
            ph += fb[:, None] * xb[:, :, :, :, None]
        # sum(q / 2^b x) = ps + X / 2; DS = 2^b d sc (b = 4, 5)
        acc += DS[:, None] * (_row_pair_sums(ph, H, BLOCK_T, BLOCK_N) + 0.5 * X)
        acc -= DM[:, None] * X
    elif QT == 2 and PAIRS == 2:
        # Q4_K, fields two at a time as below, with the scales folded: the f = 1 parts of
        # the sums (16 x for even fields, x for odd: M) and sum(x) (X) are per thread, shared
        # by all rows, so each row's vector costs a subtract and two FMAs (_q4k_values).
        # The 4 words of the vector and their activations are separate tensors (as WSPLIT)
        ws0, ws1, ws2, ws3 = _split4(words)
        X = tl.zeros([H, BLOCK_T, 1], tl.float32)
        M = tl.zeros([H, BLOCK_T, 1], tl.float32)
        p = tl.zeros([H, BLOCK_T, BLOCK_N], tl.float32)
        for j in tl.static_range(0, E, 2):
            e0, e1, e2, e3 = _split4(_pq_x(x_ptr, xrow + k0 + xoff + 4 * j, xm, KX, SILU))
            o0, o1, o2, o3 = _split4(_pq_x(x_ptr, xrow + k0 + xoff + 4 * j + 4, xm, KX, SILU))
            se = (e0 + e1) + (e2 + e3)
            so4 = (o0 + o1) + (o2 + o3)
            X += se + so4
            M += se * 16.0 + so4
            p = _nibble_pair_fma(p, ws0, j, e0, o0, one)
            p = _nibble_pair_fma(p, ws1, j, e1, o1, one)
            p = _nibble_pair_fma(p, ws2, j, e2, o2, one)
            p = _nibble_pair_fma(p, ws3, j, e3, o3, one)
        acc += DS[:, None] * (p - M) - DM[:, None] * X
    elif WSPLIT or QT == 4:
        # the 4 words of each vector (and their activations) as separate tensors: one
        # accumulator per row and vector instead of one per word (fewer registers, no
        # word reduction); Q6_K's fields 0-3 and 4-7 have their own scales (p, q)
        c0, c1, c2, c3 = _split4(words)
        h0, h1, h2, h3 = _split4(hi)
        p = tl.zeros([H, BLOCK_T, BLOCK_N], tl.float32)
        q = tl.zeros([H, BLOCK_T, BLOCK_N], tl.float32)   # Q6_K: fields 4-7
        X = tl.zeros([H, BLOCK_T, 1], tl.float32)
        X1 = tl.zeros([H, BLOCK_T, 1], tl.float32)
        for j in tl.static_range(E):
            x0, x1, x2, x3 = _split4(_pq_x(x_ptr, xrow + k0 + xoff + 4 * j, xm, KX, SILU))
            sj = (x0 + x1) + (x2 + x3)
            if QT == 4 and j >= 4:
                X1 += sj
                q = _split_field_fma(q, c0, c1, c2, c3, h0, h1, h2, h3, j, x0, x1, x2, x3, QT, one, CVT)
            else:
                X += sj
                p = _split_field_fma(p, c0, c1, c2, c3, h0, h1, h2, h3, j, x0, x1, x2, x3, QT, one, CVT)
        acc += A[:, None] * p + B[:, None] * X
        if QT == 4:
            acc += A1[:, None] * q + B1[:, None] * X1
    else:
        p = tl.zeros([H, BLOCK_T, BLOCK_N, 4], tl.float32)
        xs = tl.zeros([H, BLOCK_T, 1, 4], tl.float32)
        if (QT == 1 or QT == 2) and PAIRS:
            # 4-bit fields two at a time: one shift puts field j at bits 15-18 and j + 1 at
            # 19-22, each then needs only an and-or (half the shifts): f_j = 1 + q/256 meets
            # 16 x (exact), so f x = x + q x / 16 + 15 x for even j; the 15 x terms (xe, per
            # thread, shared by all rows) are taken off each row's sum below
            xe = tl.zeros([H, BLOCK_T, 1, 4], tl.float32)
            for j in tl.static_range(0, E, 2):
                x0 = _pq_x(x_ptr, xrow + k0 + xoff + 4 * j, xm, KX, SILU)
                x1 = _pq_x(x_ptr, xrow + k0 + xoff + 4 * j + 4, xm, KX, SILU)
                p = _nibble_pair_fma(p, words, j, x0, x1, one)
                xs += x0
                xs += x1
                xe += x0
            p -= 15.0 * xe
        else:
            for j in tl.static_range(E):
                xj = _pq_x(x_ptr, xrow + k0 + xoff + 4 * j, xm, KX, SILU)
                p = _field_fma(p, words, hi, j, xj, QT, one, CVT)
                xs += xj
        acc += A[:, None] * tl.sum(p, axis=3) + B[:, None] * tl.sum(xs, axis=3)
    return acc


@triton.jit
def _pq_step_loads(qs_ptr, qh_ptr, a_ptr, b_ptr, n3, n2, v3, w3, v2, sq, sh, sa, sb, kw, kwend,
                   tm, QT: tl.constexpr, E: tl.constexpr, EVEN: tl.constexpr):
    """One iteration's weight planes at word kw of every row (words [H, BN, 4], high bits,
    raw scales) and the activations' mask: vectors past kwend (not EVEN) load as zeros."""
    if EVEN:
        words = tl.load(qs_ptr + n3 * sq + (kw + v3 * 4 + w3))     # [H, BN, 4] int32
        hi = _pq_hi(qh_ptr, n3, sh, kw, v3, w3, words, QT)
        xm = tm
        vs = v2
    else:
        vm3 = (kw + v3 * 4) < kwend
        words = tl.load(qs_ptr + n3 * sq + (kw + v3 * 4 + w3), mask=vm3, other=0)
        hi = _pq_hi(qh_ptr, n3, sh, kw, v3, w3, words, QT, vm3)
        xm = tm & vm3[:, None]
        vs = tl.where(kw + v2 * 4 < kwend, v2, 0)  # masked vectors' terms are 0 anyway
    ra, rb, ra1 = _pq_scale_raw(a_ptr, b_ptr, n2, sa, sb, kw * E, vs, QT)
    return words, hi, ra, rb, ra1, xm


@triton.jit
def _glu_row(j, ROWPAIRED: tl.constexpr):
    """The output row (from the program's first) of a GLU GEMV's weight row j: rows go gate,
    up of one output row, or (ROWPAIRED: the stored pairs stay pairs) gate, gate, up, up of
    two."""
    if ROWPAIRED:
        return j // 4 * 2 + j % 2
    return j // 2


@triton.jit
def _glu_up(j, ROWPAIRED: tl.constexpr):
    """1 where a GLU GEMV's weight row j is an up row (_glu_row)."""
    if ROWPAIRED:
        return (j // 2) % 2
    return j % 2


@triton.jit
def _pq_gemv_kernel(x_ptr, qs_ptr, qh_ptr, a_ptr, b_ptr, out_ptr, N, T, KW, sx,
                    sq: tl.constexpr, sh: tl.constexpr, sa: tl.constexpr, sb: tl.constexpr,
                    so, so_split, kw_len, one, r_ptr, sr, hn_ptr, anw_ptr, ss_out_ptr, ss_in_ptr,
                    P_in, eps_in,
                    QT: tl.constexpr, E: tl.constexpr, H: tl.constexpr,
                    BLOCK_N: tl.constexpr, BLOCK_T: tl.constexpr, EVEN: tl.constexpr,
                    PREFETCH: tl.constexpr = False, PAIRS: tl.constexpr = 1,
                    SILU: tl.constexpr = False, PDL: tl.constexpr = False,
                    WSPLIT: tl.constexpr = False, ONE_IMM: tl.constexpr = False,
                    CVT: tl.constexpr = False, TOKEN_BLOCKS: tl.constexpr = False,
                    PRELOAD: tl.constexpr = False, GLU: tl.constexpr = False,
                    ADD_NORM: tl.constexpr = 0, RMS_IN: tl.constexpr = False,
                    BLOCK_P: tl.constexpr = 1, EVEN_N: tl.constexpr = False,
                    ROWPAIRED: tl.constexpr = False):
    """The packed GEMV: rows block program_id(0), split-K part program_id(1)
    (_pq_gemv_program)."""
    _pq_gemv_program(tl.program_id(0), tl.program_id(1), x_ptr, qs_ptr, qh_ptr, a_ptr, b_ptr,
                     out_ptr, N, T, KW, sx, sq, sh, sa, sb, so, so_split, kw_len, one,
                     r_ptr, sr, hn_ptr, anw_ptr, ss_out_ptr, ss_in_ptr, P_in, eps_in, QT, E, H,
                     BLOCK_N, BLOCK_T, EVEN, PREFETCH, PAIRS, SILU, PDL, WSPLIT, ONE_IMM, CVT,
                     TOKEN_BLOCKS, PRELOAD, GLU, ADD_NORM, RMS_IN, BLOCK_P, EVEN_N, ROWPAIRED)


@triton.jit
def _pq_gemv_pair_kernel(x_ptr, out_ptr, T, sx, so, one, progs, ss_in_ptr, P_in, eps_in,
                         qs_ptr, qh_ptr, a_ptr, b_ptr, N, KW, sq: tl.constexpr,
                         sh: tl.constexpr, sa: tl.constexpr, sb: tl.constexpr,
                         qs2_ptr, qh2_ptr, a2_ptr, b2_ptr, N2, KW2, sq2: tl.constexpr,
                         sh2: tl.constexpr, sa2: tl.constexpr, sb2: tl.constexpr,
                         QT: tl.constexpr, E: tl.constexpr, BLOCK_N: tl.constexpr,
                         EVEN: tl.constexpr, PREFETCH: tl.constexpr, PAIRS: tl.constexpr,
                         WSPLIT: tl.constexpr, PRELOAD: tl.constexpr,
                         QT2: tl.constexpr, E2: tl.constexpr, BLOCK_N2: tl.constexpr,
                         EVEN2: tl.constexpr, PREFETCH2: tl.constexpr, PAIRS2: tl.constexpr,
                         WSPLIT2: tl.constexpr, PRELOAD2: tl.constexpr,
                         H: tl.constexpr, BLOCK_T: tl.constexpr, PDL: tl.constexpr = False,
                         ONE_IMM: tl.constexpr = False, CVT: tl.constexpr = False,
                         TOKEN_BLOCKS: tl.constexpr = False, RMS_IN: tl.constexpr = False,
                         BLOCK_P: tl.constexpr = 1, EVEN_N: tl.constexpr = False,
                         EVEN_N2: tl.constexpr = False, ROWPAIRED: tl.constexpr = False,
                         ROWPAIRED2: tl.constexpr = False):
    """Two packed GEMVs of one input in one launch: programs [0, progs)
    compute the first weight's N rows into out[:, :N], the others the second's N2 rows into
    out[:, N:], each with its own type and rows per program (one split of K each; linear_pair).
    RMS_IN: x is an hn (residual_norm.py), both scale their sums by its 1 / rms."""
    pid = tl.program_id(0)
    if pid < progs:
        _pq_gemv_program(pid, 0, x_ptr, qs_ptr, qh_ptr, a_ptr, b_ptr, out_ptr, N, T, KW, sx,
                         sq, sh, sa, sb, so, 0, KW, one, x_ptr, 0, x_ptr, x_ptr, x_ptr, ss_in_ptr,
                         P_in, eps_in, QT, E, H, BLOCK_N, BLOCK_T, EVEN, PREFETCH, PAIRS, False,
                         PDL, WSPLIT, ONE_IMM, CVT, TOKEN_BLOCKS, PRELOAD, False, 0, RMS_IN,
                         BLOCK_P, EVEN_N, ROWPAIRED)
    else:
        _pq_gemv_program(pid - progs, 0, x_ptr, qs2_ptr, qh2_ptr, a2_ptr, b2_ptr, out_ptr + N,
                         N2, T, KW2, sx, sq2, sh2, sa2, sb2, so, 0, KW2, one, x_ptr, 0, x_ptr,
                         x_ptr, x_ptr, ss_in_ptr, P_in, eps_in, QT2, E2, H, BLOCK_N2, BLOCK_T,
                         EVEN2, PREFETCH2, PAIRS2, False, PDL, WSPLIT2, ONE_IMM, CVT,
                         TOKEN_BLOCKS, PRELOAD2, False, 0, RMS_IN, BLOCK_P, EVEN_N2, ROWPAIRED2)


@triton.jit
def _pq_gemv_program(pid_n, pid_k, x_ptr, qs_ptr, qh_ptr, a_ptr, b_ptr, out_ptr, N, T, KW, sx,
                     sq, sh, sa, sb, so, so_split, kw_len, one, r_ptr, sr, hn_ptr, anw_ptr,
                     ss_out_ptr, ss_in_ptr, P_in, eps_in,
                     QT: tl.constexpr, E: tl.constexpr, H: tl.constexpr,
                     BLOCK_N: tl.constexpr, BLOCK_T: tl.constexpr, EVEN: tl.constexpr,
                     PREFETCH: tl.constexpr, PAIRS: tl.constexpr, SILU: tl.constexpr,
                     PDL: tl.constexpr, WSPLIT: tl.constexpr, ONE_IMM: tl.constexpr,
                     CVT: tl.constexpr, TOKEN_BLOCKS: tl.constexpr, PRELOAD: tl.constexpr,
                     GLU: tl.constexpr, ADD_NORM: tl.constexpr, RMS_IN: tl.constexpr,
                     BLOCK_P: tl.constexpr, EVEN_N: tl.constexpr,
                     ROWPAIRED: tl.constexpr = False):
    """out[t, n] (or split-K partial pid_k) = x[t] . w[n] over words [pid_k * kw_len, +kw_len),
    for the BLOCK_T tokens of block program_id(2) (TOKEN_BLOCKS: there are several).
    GLU (one split): w is [gate; up], N rows, and out[t, r] = silu(x . w[r]) * (x . w[r + N/2])
    for r < N/2: a program's rows are BLOCK_N / 2 such pairs, interleaved gate, up (ROWPAIRED:
    two gate rows then their up rows, _glu_row).
    ROWPAIRED: Q4_K's words stored as row pairs (repack.py): the fp16 fields (PAIRS = 3) take
    them as loaded, the other paths swap them back (_pq_vector_dot); BLOCK_N is even (GLU: a
    multiple of 4; packed_matmul) so that programs hold whole pairs.
    ADD_NORM / RMS_IN (one split): the RMSNorm split over two GEMVs (residual_norm.py): out is
    h = y + residual, with hn and the program's partial sums of h * h (ADD_NORM; 2: the weight
    zero-centred), or x is such an hn and each token's sums are scaled by 1 / rms from its P_in
    partial sums (RMS_IN, before GLU's silu).

    H = threads per program. Tiles are [H, BLOCK_T, BLOCK_N, 4] with the vector axis first,
    so Triton puts every thread on it and keeps tokens, rows and the 4 words of a vector in
    registers: the activations a thread loads and converts serve all its rows, words and
    activations share one layout, and nothing crosses threads until after the loop.
    PREFETCH: the next iteration's words, high bits and scales are loaded before this one is
    decoded (EVEN only; ptxas places those loads late in the body, so it pays only in some
    configs: _pq_cuda_decode). PAIRS: 4-bit fields two per shift (1), and for Q4_K with the
    scales folded (2), or Q4_K / Q5_K / Q6_K in packed fp16 with rows in pairs (3: fp16 x,
    BLOCK_N even; _pq_pairs); 0: one at a time.
    WSPLIT (always for Q6_K and Q4_K's PAIRS = 2): the 4 words of each vector and their
    activations are split into separate tensors, so each row keeps one accumulator per vector
    instead of one per word: no reduction over the words, and fewer registers, which pays for
    Q5_K/Q6_K; Q8_0 is as fast without.
    SILU: x rows hold [gate | up] (K apart), the GEMV runs on silu(gate) * up (_pq_x).
    ONE_IMM: 1.0f's bits as an immediate instead of the run-time `one` (gfx9: _pq_field).
    CVT: Q8_0 / Q5_K / Q6_K fields converted from their bytes (v_cvt_f32_ubyteN on gfx9, full
    rate there; a quarter-rate I2F on NVIDIA), one instruction per field.
    Under PREFETCH or PRELOAD (set with PDL) the first iteration's weight planes are loaded
    before the PDL wait (they are constants: their stream starts while the kernel before
    finishes); PRELOAD peels that iteration, for programs too short for PREFETCH (it loads
    each iteration's successor, the last its own again; _pq_loop_flags).
    The planes' row strides (sq, sh, sa, sb) are compile-time constants and, where the rows
    fill every program (EVEN_N), each row's offset from the program's first row is too: every
    load of a plane then takes one base address and an immediate per row, with no per-row
    address arithmetic in the loop. Partial row blocks clamp their rows (read row 0) instead."""
    KX = KW * E
    EV: tl.constexpr = 4 * E
    if ONE_IMM:
        one = 0x3F800000
    if GLU:
        jj = tl.arange(0, BLOCK_N)
        nr = pid_n * (BLOCK_N // 2) + _glu_row(jj, ROWPAIRED)   # each weight row's output row
        nn = nr + _glu_up(jj, ROWPAIRED) * (N // 2)
        nmask = nr < N // 2
    else:
        nn = pid_n * BLOCK_N + tl.arange(0, BLOCK_N)
        nmask = nn < N
    # rows relative to the program's first (64-bit offsets, the strides constexpr: each row's
    # address is one base plus an immediate, no per-row address arithmetic in the loop)
    row0 = (pid_n * (BLOCK_N // 2 if GLU else BLOCK_N)).to(tl.int64)
    qs_ptr += row0 * sq
    qh_ptr += row0 * sh
    a_ptr += row0 * sa
    b_ptr += row0 * sb
    if EVEN_N:   # (written as constants: nn - row0 would not fold)
        jr = tl.arange(0, BLOCK_N)
        if GLU:
            nc = (_glu_row(jr, ROWPAIRED) + _glu_up(jr, ROWPAIRED) * (N // 2)).to(tl.int64)
        else:
            nc = jr.to(tl.int64)
    else:
        nc = tl.where(nmask, nn, 0).to(tl.int64) - row0   # clamp: rows past N read row 0
    v = tl.arange(0, H)
    v3 = v[:, None, None]                             # [H, 1, 1]
    n3 = nc[None, :, None]                            # [1, BN, 1]
    w3 = tl.arange(0, 4)[None, None, :]               # [1, 1, 4]
    v2 = v[:, None]                                   # [H, 1]
    n2 = nc[None, :]                                  # [1, BN]
    if TOKEN_BLOCKS:   # (a compile-time switch: the offset would cost the pointers' alignment)
        t0 = tl.program_id(2) * BLOCK_T               # this program's first token
        x_ptr += t0 * sx
        out_ptr += t0 * so
        T -= t0
        if ADD_NORM:
            r_ptr += t0 * sr
            hn_ptr += t0 * so
            ss_out_ptr += t0 * tl.num_programs(0)
        if RMS_IN:
            ss_in_ptr += t0 * P_in
    tt = tl.arange(0, BLOCK_T)
    t4 = tt[None, :, None, None]                      # [1, BT, 1, 1]
    xoff = v3[:, None] * EV + w3[:, None]             # [H, 1, 1, 4]: field 0 of each word
    xrow = x_ptr + t4.to(tl.int64) * sx
    tm = t4 < T
    acc = tl.zeros([H, BLOCK_T, BLOCK_N], tl.float32)
    kwbeg = pid_k * kw_len
    kwend = tl.minimum(kwbeg + kw_len, KW)
    if PREFETCH:  # the first iteration's loads; each iteration then issues the next one's
        wn = tl.load(qs_ptr + n3 * sq + (kwbeg + v3 * 4 + w3))
        hn = _pq_hi(qh_ptr, n3, sh, kwbeg, v3, w3, wn, QT)
        an, bn, an1 = _pq_scale_raw(a_ptr, b_ptr, n2, sa, sb, kwbeg * E, v2, QT)
    elif PRELOAD:  # the first iteration's planes, before the PDL wait (they are constants)
        w0, h0, a0, b0, a10, xm0 = _pq_step_loads(qs_ptr, qh_ptr, a_ptr, b_ptr, n3, n2, v3, w3,
                                                  v2, sq, sh, sa, sb, kwbeg, kwend, tm, QT, E,
                                                  EVEN)
    pdl_start(PDL)
    first = kwbeg
    if PRELOAD and not PREFETCH:
        acc = _pq_vector_dot(acc, w0, h0, a0, b0, a10, x_ptr, xrow, kwbeg * E, xoff, xm0, KX, w3,
                             one, QT, E, H, BLOCK_T, BLOCK_N, PAIRS, SILU, WSPLIT, CVT, ROWPAIRED)
        first = kwbeg + H * 4
    for kw in range(first, kwend, H * 4):      # vector 0 of every iteration is in the row
        k0 = kw * E
        if PREFETCH:
            words, hi, ra, rb, ra1 = wn, hn, an, bn, an1
            # the last iteration loads its own vectors again (cached) instead of masking
            nxt = tl.where(kw + H * 4 < kwend, kw + H * 4, kw)
            wn = tl.load(qs_ptr + n3 * sq + (nxt + v3 * 4 + w3))
            hn = _pq_hi(qh_ptr, n3, sh, nxt, v3, w3, wn, QT)
            an, bn, an1 = _pq_scale_raw(a_ptr, b_ptr, n2, sa, sb, nxt * E, v2, QT)
            xm = tm
        else:
            words, hi, ra, rb, ra1, xm = _pq_step_loads(qs_ptr, qh_ptr, a_ptr, b_ptr, n3, n2, v3,
                                                        w3, v2, sq, sh, sa, sb, kw, kwend, tm,
                                                        QT, E, EVEN)
        acc = _pq_vector_dot(acc, words, hi, ra, rb, ra1, x_ptr, xrow, k0, xoff, xm, KX, w3, one,
                             QT, E, H, BLOCK_T, BLOCK_N, PAIRS, SILU, WSPLIT, CVT, ROWPAIRED)
    res = tl.sum(acc, axis=0)                                               # [BT, BN]
    # the norm's operands after the loop, unlike the dense GEMV: held through it they would
    # take registers the loop needs
    if RMS_IN:
        parts = rms_partials(ss_in_ptr, P_in, tt, T, BLOCK_T, BLOCK_P)
        res = res * rms_scale(parts, KX, eps_in)[:, None]
    if GLU:   # the sums of the gate and the up row side by side: silu(gate) * up, in fp32
        if ROWPAIRED:   # gate rows r, r + 1, then their up rows
            res = tl.reshape(tl.permute(tl.reshape(res, [BLOCK_T, BLOCK_N // 4, 2, 2]),
                                        [0, 1, 3, 2]), [BLOCK_T, BLOCK_N // 2, 2])
        g, u = tl.split(tl.reshape(res, [BLOCK_T, BLOCK_N // 2, 2]))
        res = g * tl.sigmoid(g) * u
        nn = pid_n * (BLOCK_N // 2) + tl.arange(0, BLOCK_N // 2)
        nmask = nn < N // 2
    if ADD_NORM:
        r_an, w_an = add_norm_load(tt, nn, T, N, r_ptr, sr, anw_ptr, ADD_NORM == 2)
        add_norm_store(res, r_an, w_an, tt, nn, T, N, out_ptr, hn_ptr, so, ss_out_ptr)
    else:
        optr = out_ptr + pid_k * so_split + tt[:, None] * so + nn[None, :]
        tl.store(optr, res.to(out_ptr.dtype.element_ty), mask=(tt[:, None] < T) & nmask[None, :])
