"""GGUF blocks in torch: the geometry of each type and its dequantization.

`decode_blocks(blocks, qtype)` turns whole blocks (uint8 [n, block bytes], on any device) into
float32 [n, block elements]. Every decoder follows the block layouts ggml defines and performs
its float32 arithmetic in the same order as gguf-py's numpy reference (gguf.quants), with no
fused multiply-adds, so the results are bit-identical to `gguf.quants.dequantize`
(tests/engine/test_quant_dequant.py). It is the reference the kernels' decoders are checked
against, and the engine's dequantizer (g906.engine.quant.dequant) runs it.

BLOCKS restates the geometry of g906/data/quant_types.toml, the engine's table and the one
source of truth (the kernels import nothing else of g906): tests/kernels/test_gguf_blocks.py
checks that they agree.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence

import torch

# type -> (elements per block, bytes per block), as ggml defines them
BLOCKS = {
    "F32": (1, 4), "F16": (1, 2), "BF16": (1, 2),
    "Q4_0": (32, 18), "Q4_1": (32, 20), "Q5_0": (32, 22), "Q5_1": (32, 24), "Q8_0": (32, 34),
    "Q2_K": (256, 84), "Q3_K": (256, 110), "Q4_K": (256, 144), "Q5_K": (256, 176),
    "Q6_K": (256, 210), "IQ4_NL": (32, 18), "IQ4_XS": (256, 136),
}

QK_K = 256

# IQ4_NL / IQ4_XS non-linear 4-bit code book (ggml's kvalues_iq4nl).
IQ4NL_VALUES = (-127, -104, -83, -65, -49, -35, -22, -10, 1, 13, 25, 38, 53, 69, 89, 113)


# ---------------------------------------------------------------------------------------------
# helpers (all on [n_blocks, type_size] uint8 tensors)


def _f16(b: torch.Tensor) -> torch.Tensor:
    """Two little-endian bytes per row -> float32 column [n, 1]."""
    return b.contiguous().view(torch.float16).to(torch.float32)


def _nibbles(qs: torch.Tensor) -> torch.Tensor:
    """[n, k] bytes -> [n, 2, k]: low nibbles first, then high nibbles."""
    return torch.stack((qs & 0x0F, qs >> 4), dim=1)


def _bits(b: torch.Tensor, nbits: int, width: int) -> torch.Tensor:
    """[n, k] bytes -> [n, 8//width... ] fields: field s of byte j = (b[j] >> (s*width)) & mask,
    shaped [n, nbits // width, k] (shift-major)."""
    mask = (1 << width) - 1
    shifts = [s * width for s in range(nbits // width)]
    return torch.stack([(b >> s) & mask for s in shifts], dim=1)


# ---------------------------------------------------------------------------------------------
# per-type block decoders: [n, type_size] uint8 -> [n, block] float32


def _deq_q4_0(b: torch.Tensor) -> torch.Tensor:
    n = b.shape[0]
    d = _f16(b[:, :2])
    q = _nibbles(b[:, 2:]).reshape(n, 32).to(torch.int8) - 8
    return d * q.to(torch.float32)


def _deq_q4_1(b: torch.Tensor) -> torch.Tensor:
    n = b.shape[0]
    d = _f16(b[:, :2])
    m = _f16(b[:, 2:4])
    q = _nibbles(b[:, 4:]).reshape(n, 32).to(torch.float32)
    return (d * q) + m


def _qh32(qh: torch.Tensor) -> torch.Tensor:
    """[n, 4] bytes = one little-endian uint32 -> [n, 32] bits (bit j -> element j)."""
    n = qh.shape[0]
    return _bits(qh, 8, 1).permute(0, 2, 1).reshape(n, 32)


def _deq_q5_0(b: torch.Tensor) -> torch.Tensor:
    n = b.shape[0]
    d = _f16(b[:, :2])
    qh = _qh32(b[:, 2:6])
    ql = _nibbles(b[:, 6:]).reshape(n, 32)
    q = (ql | (qh << 4)).to(torch.int8) - 16
    return d * q.to(torch.float32)


def _deq_q5_1(b: torch.Tensor) -> torch.Tensor:
    n = b.shape[0]
    d = _f16(b[:, :2])
    m = _f16(b[:, 2:4])
    qh = _qh32(b[:, 4:8])
    ql = _nibbles(b[:, 8:]).reshape(n, 32)
    q = (ql | (qh << 4)).to(torch.float32)
    return (d * q) + m


def _deq_q8_0(b: torch.Tensor) -> torch.Tensor:
    d = _f16(b[:, :2])
    x = b[:, 2:].contiguous().view(torch.int8).to(torch.float32)
    return x * d


def _deq_q2_k(b: torch.Tensor) -> torch.Tensor:
    n = b.shape[0]
    scales = b[:, :16]
    qs = b[:, 16:80]
    d = _f16(b[:, 80:82])
    dmin = _f16(b[:, 82:84])
    dl = (d * (scales & 0xF).to(torch.float32)).reshape(n, 16, 1)
    ml = (dmin * (scales >> 4).to(torch.float32)).reshape(n, 16, 1)
    # qs [n, 2, 32] -> 2-bit fields [n, 2, 4, 32]: element = half*128 + shift*32 + j
    q = _bits(qs.reshape(n * 2, 32), 8, 2).reshape(n, 2, 4, 32)
    q = q.reshape(n, 16, 16).to(torch.float32)
    return (dl * q - ml).reshape(n, QK_K)


def _deq_q3_k(b: torch.Tensor) -> torch.Tensor:
    n = b.shape[0]
    hmask = b[:, :32]
    qs = b[:, 32:96]
    sc = b[:, 96:108]
    d = _f16(b[:, 108:110])
    lsc = _nibbles(sc[:, :8]).reshape(n, 16)                  # low nibbles of 0..7, then high
    hsc = _bits(sc[:, 8:12], 8, 2).reshape(n, 16)             # 2-bit fields, shift-major
    scales = ((lsc & 0x0F) | ((hsc & 0x03) << 4)).to(torch.int8) - 32
    dl = (d * scales.to(torch.float32)).reshape(n, 16, 1)
    ql = _bits(qs.reshape(n * 2, 32), 8, 2).reshape(n, 16, 16)
    qh = _bits(hmask, 8, 1).reshape(n, 16, 16)
    qh = qh ^ 1  # a set high bit means no offset
    q = (ql.to(torch.int8) - (qh << 2).to(torch.int8)).to(torch.float32)
    return (dl * q).reshape(n, QK_K)


def _scale_min_k4(sc: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """Q4_K/Q5_K packed 6-bit scales and mins: [n, 12] -> ([n, 8], [n, 8])."""
    n = sc.shape[0]
    s = sc.reshape(n, 3, 4)
    d, m, md = s[:, 0], s[:, 1], s[:, 2]
    scale = torch.cat([d & 0x3F, (md & 0x0F) | ((d >> 2) & 0x30)], dim=-1)
    mins = torch.cat([m & 0x3F, (md >> 4) | ((m >> 2) & 0x30)], dim=-1)
    return scale, mins


def _deq_q4_k(b: torch.Tensor) -> torch.Tensor:
    n = b.shape[0]
    d = _f16(b[:, :2])
    dmin = _f16(b[:, 2:4])
    sc, m = _scale_min_k4(b[:, 4:16])
    qs = b[:, 16:144]
    dd = (d * sc.to(torch.float32)).reshape(n, 8, 1)
    dm = (dmin * m.to(torch.float32)).reshape(n, 8, 1)
    # [n, 4, 32] chunks -> [n, 4, 2, 32] nibbles: sub-block = chunk*2 + nibble
    q = torch.stack((qs.reshape(n, 4, 32) & 0x0F, qs.reshape(n, 4, 32) >> 4), dim=2)
    q = q.reshape(n, 8, 32).to(torch.float32)
    return (dd * q - dm).reshape(n, QK_K)


def _deq_q5_k(b: torch.Tensor) -> torch.Tensor:
    n = b.shape[0]
    d = _f16(b[:, :2])
    dmin = _f16(b[:, 2:4])
    sc, m = _scale_min_k4(b[:, 4:16])
    qh = b[:, 16:48]
    qs = b[:, 48:176]
    dd = (d * sc.to(torch.float32)).reshape(n, 8, 1)
    dm = (dmin * m.to(torch.float32)).reshape(n, 8, 1)
    ql = torch.stack((qs.reshape(n, 4, 32) & 0x0F, qs.reshape(n, 4, 32) >> 4), dim=2).reshape(n, 8, 32)
    hb = _bits(qh, 8, 1).reshape(n, 8, 32)
    q = (ql | (hb << 4)).to(torch.float32)
    return (dd * q - dm).reshape(n, QK_K)


def _deq_q6_k(b: torch.Tensor) -> torch.Tensor:
    n = b.shape[0]
    ql = b[:, :128]
    qh = b[:, 128:192]
    scales = b[:, 192:208].contiguous().view(torch.int8).to(torch.float32)
    d = _f16(b[:, 208:210])
    dd = (d * scales).reshape(n, 16, 1)
    # ql [n, 2, 64] -> nibbles [n, 2, 2, 64]: element = half*128 + nibble*64 + j
    l4 = ql.reshape(n, 2, 64)
    lo = torch.stack((l4 & 0x0F, l4 >> 4), dim=2).reshape(n, 8, 32)
    # qh [n, 2, 32] -> 2-bit fields [n, 2, 4, 32]: element = half*128 + shift*32 + j
    hi = _bits(qh.reshape(n * 2, 32), 8, 2).reshape(n, 8, 32)
    q = (lo | (hi << 4)).to(torch.int8) - 32
    q = q.reshape(n, 16, 16).to(torch.float32)
    return (dd * q).reshape(n, QK_K)


def _kvalues(device: torch.device) -> torch.Tensor:
    return torch.tensor(IQ4NL_VALUES, dtype=torch.int8, device=device)


def _deq_iq4_nl(b: torch.Tensor) -> torch.Tensor:
    n = b.shape[0]
    d = _f16(b[:, :2])
    idx = _nibbles(b[:, 2:]).reshape(n, 32).to(torch.long)
    q = _kvalues(b.device)[idx].to(torch.float32)
    return d * q


def _deq_iq4_xs(b: torch.Tensor) -> torch.Tensor:
    n = b.shape[0]
    d = _f16(b[:, :2])
    sh = b[:, 2:4].to(torch.int32)
    scales_h = sh[:, 0] | (sh[:, 1] << 8)                                  # uint16 LE
    shifts = torch.arange(0, 16, 2, device=b.device, dtype=torch.int32)
    hsc = ((scales_h.reshape(n, 1) >> shifts.reshape(1, 8)) & 0x03).to(torch.uint8)
    lsc = torch.stack((b[:, 4:8] & 0x0F, b[:, 4:8] >> 4), dim=2).reshape(n, 8)  # byte*2 + nibble
    scales = (lsc | (hsc << 4)).to(torch.int8) - 32
    dl = (d * scales.to(torch.float32)).reshape(n, 8, 1)
    qs = b[:, 8:136].reshape(n, 8, 16)
    idx = torch.stack((qs & 0x0F, qs >> 4), dim=2).reshape(n, 8, 32).to(torch.long)
    q = _kvalues(b.device)[idx].to(torch.float32)
    return (dl * q).reshape(n, QK_K)


def _deq_bf16(b: torch.Tensor) -> torch.Tensor:
    return (b.contiguous().view(torch.int16).to(torch.int32) << 16).view(torch.float32)


def _deq_f16(b: torch.Tensor) -> torch.Tensor:
    return b.contiguous().view(torch.float16).to(torch.float32)


def _deq_f32(b: torch.Tensor) -> torch.Tensor:
    return b.contiguous().view(torch.float32).clone()


DECODERS: dict[str, Callable[[torch.Tensor], torch.Tensor]] = {
    "F32": _deq_f32,
    "F16": _deq_f16,
    "BF16": _deq_bf16,
    "Q4_0": _deq_q4_0,
    "Q4_1": _deq_q4_1,
    "Q5_0": _deq_q5_0,
    "Q5_1": _deq_q5_1,
    "Q8_0": _deq_q8_0,
    "Q2_K": _deq_q2_k,
    "Q3_K": _deq_q3_k,
    "Q4_K": _deq_q4_k,
    "Q5_K": _deq_q5_k,
    "Q6_K": _deq_q6_k,
    "IQ4_NL": _deq_iq4_nl,
    "IQ4_XS": _deq_iq4_xs,
}


def decode_blocks(blocks: torch.Tensor, qtype: str) -> torch.Tensor:
    """Whole blocks of a type (uint8 [n, block bytes]) -> float32 [n, block elements]."""
    decoder = DECODERS.get(qtype)
    if decoder is None:
        raise ValueError(f"no GGUF decoder for {qtype!r} (one of {', '.join(DECODERS)})")
    return decoder(blocks)


def dequantize(raw: torch.Tensor, qtype: str, shape: Sequence[int]) -> torch.Tensor:
    """Rows of whole blocks (uint8 [..., row bytes]) -> float32 tensor of `shape`."""
    blocks = raw.reshape(-1, BLOCKS[qtype][1])
    if blocks.shape[0] == 0:
        return torch.empty(tuple(shape), dtype=torch.float32, device=raw.device)
    return decode_blocks(blocks, qtype).reshape(tuple(shape))
