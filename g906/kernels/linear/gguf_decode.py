"""GGUF blocks decoded inside a kernel: 256 elements of a row a step.

Each step decodes one K-quant super-block (or 8 blocks of 32) into two register tiles of shape
[BLOCK_N, P, Q] (P * Q = 128) whose element order follows the block's byte order, with each
element's offset in the step, so the activations can be gathered in the same order and no
shuffle is needed. Weight bytes come from the raw GGUF blocks (uint8 [rows, row_bytes]); fp16
scales are read byte by byte, so no alignment beyond one byte is assumed.
Used by the GGUF GEMV/GEMM (gguf_matmul.py) and the quantized embedding.
"""

from __future__ import annotations

import triton
import triton.language as tl


QTYPES = {"Q8_0": 0, "Q4_0": 1, "Q4_K": 2, "Q5_K": 3, "Q6_K": 4}
# bytes of one 256-element step for each type
STEP_BYTES = {"Q8_0": 8 * 34, "Q4_0": 8 * 18, "Q4_K": 144, "Q5_K": 176, "Q6_K": 210}
# shape [P, Q] of the two register tiles one step decodes into (P * Q = 128)
PART_SHAPE = {"Q8_0": (4, 32), "Q4_0": (8, 16), "Q4_K": (4, 32), "Q5_K": (4, 32), "Q6_K": (8, 16)}


@triton.jit
def _f16_at(p):
    lo = tl.load(p).to(tl.uint16)
    hi = tl.load(p + 1).to(tl.uint16)
    return (lo | (hi << 8)).to(tl.float16, bitcast=True).to(tl.float32)


@triton.jit
def _u8(p):
    return tl.load(p).to(tl.int32)


@triton.jit
def _k_scale_min(base, j):
    """6-bit scale and min of sub-block j (any int tensor) of a Q4_K/Q5_K super-block."""
    lo = j < 4
    jm = tl.where(lo, j, j - 4)
    s_j = _u8(base + 4 + jm)          # scales[j] (j<4) | scales[j-4] (j>=4)
    s_j4 = _u8(base + 4 + jm + 4)     # scales[j+4] (j<4) | scales[j] (j>=4)
    s_j8 = _u8(base + 4 + jm + 8)     # scales[j+4] for j>=4
    sc = tl.where(lo, s_j & 63, (s_j8 & 15) | ((s_j >> 6) << 4))
    m = tl.where(lo, s_j4 & 63, (s_j8 >> 4) | ((s_j4 >> 6) << 4))
    return sc.to(tl.float32), m.to(tl.float32)


@triton.jit
def _dequant_step(rowp, QT: tl.constexpr):
    """Decode 256 elements of each row. rowp: [BN, 1, 1] uint8 pointers at the step's first byte.
    Returns (w0, e0, w1, e1): fp32 tiles [BN, P, Q] and their element offsets [1, P, Q]."""
    if QT == 0:  # Q8_0: 8 blocks of 34 bytes, parts = blocks 0-3 and 4-7
        p = tl.arange(0, 4)[None, :, None]
        l = tl.arange(0, 32)[None, None, :]
        b0 = rowp + p * 34
        b1 = rowp + (p + 4) * 34
        w0 = tl.load(b0 + 2 + l).to(tl.int8, bitcast=True).to(tl.float32) * _f16_at(b0)
        w1 = tl.load(b1 + 2 + l).to(tl.int8, bitcast=True).to(tl.float32) * _f16_at(b1)
        e0 = p * 32 + l
        e1 = (p + 4) * 32 + l
    elif QT == 1:  # Q4_0: 8 blocks of 18 bytes; low nibbles = elements 0-15, high = 16-31
        p = tl.arange(0, 8)[None, :, None]
        l = tl.arange(0, 16)[None, None, :]
        bb = rowp + p * 18
        d = _f16_at(bb)
        qs = _u8(bb + 2 + l)
        w0 = ((qs & 15) - 8).to(tl.float32) * d
        w1 = ((qs >> 4) - 8).to(tl.float32) * d
        e0 = p * 32 + l
        e1 = p * 32 + 16 + l
    elif QT == 2 or QT == 3:  # Q4_K / Q5_K: groups g of 64 = (sub-block 2g: low, 2g+1: high)
        g = tl.arange(0, 4)[None, :, None]
        l = tl.arange(0, 32)[None, None, :]
        d = _f16_at(rowp)
        dmin = _f16_at(rowp + 2)
        sc0, m0 = _k_scale_min(rowp, 2 * g)
        sc1, m1 = _k_scale_min(rowp, 2 * g + 1)
        if QT == 2:
            qs = _u8(rowp + 16 + g * 32 + l)
            q0 = qs & 15
            q1 = qs >> 4
        else:
            qs = _u8(rowp + 48 + g * 32 + l)
            qh = _u8(rowp + 16 + l)
            q0 = (qs & 15) | (((qh >> (2 * g)) & 1) << 4)
            q1 = (qs >> 4) | (((qh >> (2 * g + 1)) & 1) << 4)
        w0 = (d * sc0) * q0.to(tl.float32) - dmin * m0
        w1 = (d * sc1) * q1.to(tl.float32) - dmin * m1
        e0 = g * 64 + l
        e1 = g * 64 + 32 + l
    else:  # Q6_K: s in 0..7 = (half h = s//4, quarter s%4), r in 0..15
        s = tl.arange(0, 8)[None, :, None]
        r = tl.arange(0, 16)[None, None, :]
        h = s // 4
        s4 = s % 4
        d = _f16_at(rowp + 208)
        ql = _u8(rowp + 16 * s + r)
        qh = _u8(rowp + 128 + 32 * h + 16 * (s4 % 2) + r)
        sh = 2 * (s4 // 2)
        q0 = ((ql & 15) | (((qh >> sh) & 3) << 4)) - 32
        q1 = ((ql >> 4) | (((qh >> (sh + 4)) & 3) << 4)) - 32
        sc0 = tl.load(rowp + 192 + 8 * h + s4).to(tl.int8, bitcast=True).to(tl.float32)
        sc1 = tl.load(rowp + 196 + 8 * h + s4).to(tl.int8, bitcast=True).to(tl.float32)
        w0 = (d * sc0) * q0.to(tl.float32)
        w1 = (d * sc1) * q1.to(tl.float32)
        e0 = 128 * h + 16 * s4 + r
        e1 = 128 * h + 64 + 16 * s4 + r
    return w0, e0, w1, e1
