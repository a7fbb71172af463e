"""Decoding repacked weights (PackedQuant, repack.py) inside a kernel: fields and scales.

A row is read as vectors of 4 int32 words (16 bytes) holding EV = 4 * E elements (E = 4 for
8-bit quants, 8 for 4-bit); field j of word w is element 4j + w of the vector, so the
activations that field j meets are 4 consecutive elements (one 8-byte load) and every tile
keeps the words' layout ([H, T, BN, 4], H = threads): no layout shuffles, the sum over a vector
is inside one thread. Each field becomes a float in [1, 2) by placing its bits under the
exponent (f = 1 + q / 2^bits: a shift and an and/or, no int->float conversion); per vector,
S = sum(f * x) and X = sum(x) give the exact dot product with the dequantized weights as
A * S + B * X, A and B per (row, vector) from the scales (fp32, exact).
"""

from __future__ import annotations

import triton
import triton.language as tl


PQ_QTYPES = {"Q8_0": 0, "Q4_0": 1, "Q4_K": 2, "Q5_K": 3, "Q6_K": 4}
PQ_E = {"Q8_0": 4, "Q4_0": 8, "Q4_K": 8, "Q5_K": 8, "Q6_K": 8}      # elements per word


@triton.jit
def _pq_field(words, hi, J: tl.constexpr, QT: tl.constexpr, one, CVT: tl.constexpr = False):
    """Field J of every word (Q5_K/Q6_K: with its high bits) as a float in [1, 2).
    `one` = 0x3F800000 (1.0f): passed at run time on NVIDIA, where the mask and the exponent
    then fold into one LOP3 (two immediates would not); an immediate on gfx9 (ONE_IMM), where
    1.0f is an inline constant, so the literal mask and it fit v_and_or_b32's one constant-bus
    operand (a run-time `one` would be a second: an and and an or)."""
    if CVT and QT != 1 and QT != 2:   # a byte per field: the byte itself as a float (CVT)
        if QT != 0 and J % 2 == 1:    # Q5_K/Q6_K odd fields: in hi (_q5_bytes, _q6_bytes)
            c = hi
        else:
            c = words
        B: tl.constexpr = J if QT == 0 else J // 2
        return ((c >> (8 * B)) & 255).to(tl.float32)
    if QT == 0:  # int8: q + 128 (sign bit flipped) as 8 bits under the exponent
        m8 = one ^ (128 << 15)
        f = (((words >> (8 * J)) << 15) & (255 << 15)) ^ m8             # 1 + (q + 128) / 256
        return f.to(tl.float32, bitcast=True)
    if QT == 3:  # words/hi = _q5_bytes: 5 bits in byte J // 2 of one of them: 1 + q / 32
        if J % 2 == 0:
            c = words
        else:
            c = hi
        f = (((c >> (8 * (J // 2))) << 18) & (31 << 18)) | one
    elif QT == 4:  # words/hi = _q6_bytes: field J is byte J // 2 of one of them; 1 + q / 64
        if J % 2 == 0:
            c = words
        else:
            c = hi
        f = (((c >> (8 * (J // 2))) << 17) & (63 << 17)) | one
    else:  # 4 bits: 1 + q / 16
        f = (((words >> (4 * J)) << 19) & (15 << 19)) | one
    f = f.to(tl.float32, bitcast=True)
    return f


@triton.jit
def _nibble_pair(words, J: tl.constexpr, one):
    """4-bit fields J and J + 1 of every word as floats: one shift puts field J at bits 15-18
    and J + 1 at 19-22, then an and-or each: 1 + q / 256 and 1 + q / 16."""
    if J < 4:
        sw = words << (15 - 4 * J)
    else:
        sw = words >> (4 * J - 15)
    f0 = ((sw & (15 << 15)) | one).to(tl.float32, bitcast=True)
    f1 = ((sw & (15 << 19)) | one).to(tl.float32, bitcast=True)
    return f0, f1


@triton.jit
def _q5_bytes(words, hv, w3):
    """Q5_K: the 5-bit quants of the even / odd fields of each word, one per byte. `hv` is the
    vector's int32 of 5th bits (repack._q5_pos), broadcast over its 4 words."""
    g = tl.where(w3 == 3, hv >> 2, hv << (4 - 2 * tl.minimum(w3, 2)))
    even = (words & 0x0F0F0F0F) | (g & 0x10101010)
    odd = ((words >> 4) & 0x0F0F0F0F) | ((g >> 1) & 0x10101010)
    return even, odd


@triton.jit
def _q6_bytes(words, hi, w3):
    """Q6_K: the 6-bit quants of the even / odd fields of each word, one per byte (low nibble |
    2 high bits << 4), so a field then costs a shift and an and-or like Q8_0. `hi` is the
    int32 high word shared by words 2p and 2p+1 (repack._q6_pos: bits already in place; the
    odd word's sit 4 bits lower)."""
    g = hi << ((w3 % 2) * 4)
    even = (words & 0x0F0F0F0F) | (g & 0x30303030)
    odd = ((words >> 4) & 0x0F0F0F0F) | ((g >> 2) & 0x30303030)
    return even, odd


@triton.jit
def _split4(t):
    """A tensor whose last axis has 4 elements -> the 4 tensors without it (in registers)."""
    a, b = tl.split(tl.reshape(t, t.shape[:-1] + [2, 2]))
    t0, t2 = tl.split(a)
    t1, t3 = tl.split(b)
    return t0, t1, t2, t3


@triton.jit
def _small_int_f32(v):
    """An int in [0, 2^23) as fp32 through the exponent (an or and a subtract: int->float
    conversions run at a quarter of the FMA rate on NVIDIA)."""
    return (v | 0x4B000000).to(tl.float32, bitcast=True) - 8388608.0


@triton.jit
def _pq_scale_raw(a_ptr, b_ptr, n2, sa, sb, k0, v2, QT: tl.constexpr):
    """The scale planes' values for vector v2 of rows n2 as loaded ([H, BN] each): (ra, rb, ra1)
    for _pq_scale_values; ra1 is Q6_K's second half (others: ra again)."""
    if QT == 0:
        ra = tl.load(a_ptr + n2 * sa + (k0 // 32 + v2 // 2))
        return ra, ra, ra
    elif QT == 1:
        ra = tl.load(a_ptr + n2 * sa + (k0 // 32 + (v2 * 4) // 4))
        return ra, ra, ra
    elif QT == 2 or QT == 3:
        dm = tl.load(a_ptr + n2 * sa + (k0 + v2 * 32) // 256)
        # (v2 * 4) // 4: an index Triton does not see as contiguous along the vector axis, so
        # the load keeps the layout of the words instead of a vectorized one converted later
        scm = tl.load(b_ptr + n2 * sb + (k0 // 32 + (v2 * 4) // 4))
        return dm, scm, dm
    else:
        sc0 = tl.load(a_ptr + n2 * sa + (k0 // 16 + 2 * v2))
        sc1 = tl.load(a_ptr + n2 * sa + (k0 // 16 + 2 * v2 + 1))
        d = tl.load(b_ptr + n2 * sb + (k0 + v2 * 32) // 256)
        return sc0, d, sc1


@triton.jit
def _d_dmin(dm):
    """Q4_K / Q5_K: the int32 of a super-block's fp16 d (low half) and dmin (high) as fp32."""
    d = (dm & 0xFFFF).to(tl.int16).to(tl.float16, bitcast=True).to(tl.float32)
    dmin = ((dm >> 16) & 0xFFFF).to(tl.int16).to(tl.float16, bitcast=True).to(tl.float32)
    return d, dmin


@triton.jit
def _pq_scale_values(ra, rb, QT: tl.constexpr, CVT: tl.constexpr = False):
    """(A, B) fp32 [H, BN] from _pq_scale_raw's values: dot(w, x) over a vector (Q6_K: over the
    half whose scale ra is) = A * sum(f * x) + B * sum(x). CVT (Q8_0, Q5_K, Q6_K): f is the
    field's byte as an integer (Q8_0: q + 128), not 1 + q / 2^bits."""
    if QT == 0 and CVT:    # q = f - 128
        d = ra.to(tl.float32)
        A = d
        B = -128.0 * d
    elif QT == 0:    # q = 256 f - 384
        d = ra.to(tl.float32)
        A = 256.0 * d
        B = -384.0 * d
    elif QT == 1:  # q - 8 = 16 f - 24
        d = ra.to(tl.float32)
        A = 16.0 * d
        B = -24.0 * d
    elif QT == 2 or QT == 3:  # d*sc*q - dmin*m; Q4_K q = 16 f - 16, Q5_K q = 32 f - 32
        d, dmin = _d_dmin(ra)
        scm = rb.to(tl.int32)
        ds = d * _small_int_f32(scm & 255)
        m = _small_int_f32((scm >> 8) & 255)
        if QT == 2:
            A = 16.0 * ds
            B = -16.0 * ds - dmin * m
        elif CVT:             # Q5_K q = f
            A = ds
            B = -dmin * m
        else:
            A = 32.0 * ds
            B = -32.0 * ds - dmin * m
    else:          # Q6_K: q - 32 = 64 f - 96, one int8 scale per 16 elements
        sc = _small_int_f32(ra.to(tl.int32) + 128) - 128.0
        ds = rb.to(tl.float32) * sc
        if CVT:               # q - 32 = f - 32
            A = ds
            B = -32.0 * ds
        else:
            A = 64.0 * ds
            B = -96.0 * ds
    return A, B


@triton.jit
def _pq_scales(a_ptr, b_ptr, n2, sa, sb, k0, v2, QT: tl.constexpr, HALF: tl.constexpr):
    """(A, B) fp32 [BN, H] of vector v2 (Q6_K: of its half HALF, 16 elements)."""
    ra, rb, ra1 = _pq_scale_raw(a_ptr, b_ptr, n2, sa, sb, k0, v2, QT)
    if HALF == 1:
        ra = ra1
    return _pq_scale_values(ra, rb, QT)


@triton.jit
def _q4k_values(dm, scm, QT: tl.constexpr = 2):
    """Q4_K (DS, DM) fp32 [H, BN]: dot(w, x) over a vector = DS * (sum(f x) - sum(x)) -
    DM * sum(x) with f = 1 + q / 16: DS = 16 d sc, DM = dmin m. Q5_K (QT 3): DS = 32 d sc
    (f = 1 + q / 32)."""
    d, dmin = _d_dmin(dm)
    scm = scm.to(tl.int32)
    # 16 sc: under 2^27's exponent the mantissa's last bit is worth 16 (2^28: 32)
    if QT == 3:
        sc16 = ((scm & 255) | 0x4D800000).to(tl.float32, bitcast=True) - 268435456.0
    else:
        sc16 = ((scm & 255) | 0x4D000000).to(tl.float32, bitcast=True) - 134217728.0
    m = _small_int_f32((scm >> 8) & 255)
    return d * sc16, dmin * m


@triton.jit
def _pq_hi(qh_ptr, n3, sh, kw, v3, w3, words, QT: tl.constexpr, mask3=None):
    """Q5_K / Q6_K: the high-bit plane's int32 for each word of vectors v3 (others: words)."""
    hi = words
    if QT == 3 or QT == 4:
        if QT == 3:  # an int32 per vector, shared by its 4 words (index written so the load
            # is not seen as contiguous along H: it keeps the words' layout)
            hptr = qh_ptr + n3 * sh + (kw // 4 + (v3 * 4 + w3) // 4)
        else:        # an int32 per two quant words
            hptr = qh_ptr + n3 * sh + (kw // 2 + v3 * 2 + w3 // 2)
        if mask3 is None:
            hi = tl.load(hptr).to(tl.int32)
        else:
            hi = tl.load(hptr, mask=mask3, other=0).to(tl.int32)
    return hi


@triton.jit
def _half2(v):
    """int32 -> its two halves as fp16 (low, high) on a new last axis of 2: the pair stays in
    the one 32-bit register, so fp16 math on it issues as packed (HFMA2, v_pk_fma_f16)."""
    return tl.join(v.to(tl.int16), (v >> 16).to(tl.int16)).to(tl.float16, bitcast=True)


@triton.jit
def _even_odd_rows(words, H: tl.constexpr, BLOCK_N: tl.constexpr):
    """Words [H, BN, 4] -> those of rows 2i and of rows 2i + 1, each [H, BN / 2, 4]."""
    return tl.split(tl.permute(tl.reshape(words, [H, BLOCK_N // 2, 2, 4]), [0, 1, 3, 2]))


@triton.jit
def _row_pair_words(words, H: tl.constexpr, BLOCK_N: tl.constexpr):
    """Words [H, BN, 4] of BN rows -> (lo, hi) [H, BN / 2, 4]: for rows 2i and 2i + 1, lo holds
    both rows' fields 0-3 (row 2i's in its low half) and hi their fields 4-7."""
    a, b = _even_odd_rows(words, H, BLOCK_N)
    lo = (a & 0xFFFF) | (b << 16)
    hi = ((a >> 16) & 0xFFFF) | (b & -65536)
    return lo, hi


@triton.jit
def _swap_row_halves(words, H: tl.constexpr, BLOCK_N: tl.constexpr):
    """Words [H, BN, 4] of row-paired Q4_K (repack.py, row_pairs) <-> the rows' own words:
    _row_pair_words, interleaved back into rows (it is its own inverse)."""
    lo, hi = _row_pair_words(words, H, BLOCK_N)
    return tl.reshape(tl.permute(tl.join(lo, hi), [0, 1, 3, 2]), [H, BLOCK_N, 4])


@triton.jit
def _row_pair_sums(ph, H: tl.constexpr, BLOCK_T: tl.constexpr, BLOCK_N: tl.constexpr):
    """fp16 products [H, BT, BN / 2, 4 words, 2 rows] -> each row's sum in fp32 [H, BT, BN]."""
    w0, w1, w2, w3 = _split4(tl.permute(ph, [0, 1, 2, 4, 3]))
    return tl.reshape(((w0 + w1) + (w2 + w3)).to(tl.float32), [H, BLOCK_T, BLOCK_N])


@triton.jit
def _centred_nibbles(pw, J: tl.constexpr, magic):
    """Field J of both halves of row-paired words (_row_pair_words) as fp16 pairs q / 16 - 0.5
    (exact): fields 0 and 1 sit at bits 0-3 and 4-7 of each half, 2 and 3 there after one shift
    of 8 (shared, CSE); an and-or puts 1024's exponent over them (magic = 0x64006400 at run
    time: one LOP3), giving 1024 + q or 1024 + 16 q, and one packed FMA scales and centres."""
    if J >= 2:
        pw = pw >> 8
    if J % 2 == 0:
        f = _half2((pw & 0x000F000F) | magic)
        return f * 0.0625 - 64.5
    f = _half2((pw & 0x00F000F0) | magic)
    return f * 0.00390625 - 4.5


@triton.jit
def _centred_fives(pb, B: tl.constexpr, magic):
    """Byte B (0 or 1) of both halves of row-paired Q5_K bytes (_q5_bytes, then
    _row_pair_words) as fp16 pairs q / 32 - 0.5 (exact): 1024 + q under the magic, one FMA."""
    if B == 1:
        pb = pb >> 8
    return _half2((pb & 0x001F001F) | magic) * 0.03125 - 32.5


@triton.jit
def _centred_sixes(pb, B: tl.constexpr, magic):
    """Byte B (0 or 1) of both halves of row-paired Q6_K bytes (_q6_bytes, then
    _row_pair_words) as fp16 pairs (q - 32) / 64 (exact, its zero point: no sum(x) term)."""
    if B == 1:
        pb = pb >> 8
    return _half2((pb & 0x003F003F) | magic) * 0.015625 - 16.5


@triton.jit
def _pq_fp16_field(lo, hi, odd_lo, odd_hi, F: tl.constexpr, QT: tl.constexpr, magic):
    """Field F (0-7) of rows 2i and 2i + 1 as a centred fp16 pair, from their regrouped
    words: Q4_K nibbles (lo: fields 0-3, hi: 4-7; _centred_nibbles), Q5_K / Q6_K bytes (lo /
    hi: the even fields 0, 2 / 4, 6, odd_lo / odd_hi: 1, 3 / 5, 7; _centred_fives,
    _centred_sixes)."""
    if QT == 2:
        if F < 4:
            return _centred_nibbles(lo, F, magic)
        return _centred_nibbles(hi, F - 4, magic)
    if F % 2 == 0:
        src = lo
        if F >= 4:
            src = hi
    else:
        src = odd_lo
        if F >= 4:
            src = odd_hi
    if QT == 4:
        return _centred_sixes(src, (F % 4) // 2, magic)
    return _centred_fives(src, (F % 4) // 2, magic)


@triton.jit
def _nibble_pair_fma(p, words, J: tl.constexpr, x0, x1, one):
    """p + fields J and J + 1 of every row's word(s) (_nibble_pair) times their activations
    (x0 meets f = 1 + q/256, hence 16 x0)."""
    f0, f1 = _nibble_pair(words, J, one)
    p += f0[:, None] * (x0 * 16.0)                 # separate statements: FMAs into p
    p += f1[:, None] * x1
    return p


@triton.jit
def _field_fma(p, words, hi, J: tl.constexpr, x, QT: tl.constexpr, one, CVT: tl.constexpr = False):
    """p + field J of every row's word(s) (_pq_field) times its activation."""
    return p + _pq_field(words, hi, J, QT, one, CVT)[:, None] * x


@triton.jit
def _split_field_fma(p, c0, c1, c2, c3, h0, h1, h2, h3, J: tl.constexpr, x0, x1, x2, x3,
                     QT: tl.constexpr, one, CVT: tl.constexpr):
    """_field_fma over the 4 split words of a vector and their activations."""
    p = _field_fma(p, c0, h0, J, x0, QT, one, CVT)
    p = _field_fma(p, c1, h1, J, x1, QT, one, CVT)
    p = _field_fma(p, c2, h2, J, x2, QT, one, CVT)
    return _field_fma(p, c3, h3, J, x3, QT, one, CVT)
