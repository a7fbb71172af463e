"""PyTorch references: GGUF block dequantization (the types the Triton kernels fuse) and
linear = dequantize + matmul.

Block layouts (ggml): Q8_0 [d f16 | 32 x i8]; Q4_0 [d f16 | 16 B: low nibbles = elements 0-15,
high nibbles = 16-31, minus 8]; Q4_K [d f16 | dmin f16 | 12 B packed 6-bit scales/mins | 128 B
nibbles]; Q5_K [d | dmin | 12 B scales | 32 B high bits | 128 B nibbles]; Q6_K [128 B low
nibbles | 64 B 2-bit highs | 16 x i8 scales | d f16].  Checked against gguf.quants.dequantize.
"""

from __future__ import annotations

import numpy as np
import torch

# qtype -> (elements per block, bytes per block)
BLOCKS = {
    "Q4_0": (32, 18), "Q4_1": (32, 20), "Q5_0": (32, 22), "Q5_1": (32, 24), "Q8_0": (32, 34),
    "Q2_K": (256, 84), "Q3_K": (256, 110), "Q4_K": (256, 144), "Q5_K": (256, 176),
    "Q6_K": (256, 210),
}
# types dequantized here in torch (and fused in the Triton kernels)
TORCH_TYPES = ("Q8_0", "Q4_0", "Q4_K", "Q5_K", "Q6_K")


def _f16(b):  # [..., 2] uint8 -> float32 [...]
    return b.contiguous().view(torch.float16)[..., 0].float()


def _k_scales(s):
    """[n, 12] packed 6-bit scales -> (sc [n, 8], m [n, 8]) as float32."""
    s = s.to(torch.int32)
    sc_lo = s[:, 0:4] & 63
    m_lo = s[:, 4:8] & 63
    sc_hi = (s[:, 8:12] & 15) | ((s[:, 0:4] >> 6) << 4)
    m_hi = (s[:, 8:12] >> 4) | ((s[:, 4:8] >> 6) << 4)
    return torch.cat([sc_lo, sc_hi], 1).float(), torch.cat([m_lo, m_hi], 1).float()


def _dequant_torch(blocks: torch.Tensor, qtype: str) -> torch.Tensor:
    """blocks uint8 [n, block_bytes] -> float32 [n, block_elems]."""
    n = blocks.shape[0]
    if qtype == "Q8_0":
        d = _f16(blocks[:, 0:2])
        q = blocks[:, 2:34].contiguous().view(torch.int8).float()
        return q * d[:, None]
    if qtype == "Q4_0":
        d = _f16(blocks[:, 0:2])
        qs = blocks[:, 2:18].to(torch.int32)
        q = torch.cat([qs & 15, qs >> 4], 1).float() - 8.0
        return q * d[:, None]
    if qtype in ("Q4_K", "Q5_K"):
        d = _f16(blocks[:, 0:2])
        dmin = _f16(blocks[:, 2:4])
        sc, m = _k_scales(blocks[:, 4:16])
        qoff = 16 if qtype == "Q4_K" else 48
        qs = blocks[:, qoff:qoff + 128].to(torch.int32).view(n, 4, 32)
        q = torch.stack([qs & 15, qs >> 4], 2).reshape(n, 8, 32)      # sub-block j = 2*g + hi
        if qtype == "Q5_K":
            qh = blocks[:, 16:48].to(torch.int32)                       # [n, 32]
            bits = torch.stack([(qh >> j) & 1 for j in range(8)], 1)   # [n, 8, 32]
            q = q + 16 * bits
        y = d[:, None, None] * sc[:, :, None] * q.float() - dmin[:, None, None] * m[:, :, None]
        return y.reshape(n, 256)
    if qtype == "Q6_K":
        ql = blocks[:, 0:128].to(torch.int32).view(n, 2, 64)
        qh = blocks[:, 128:192].to(torch.int32).view(n, 2, 32)
        sc = blocks[:, 192:208].contiguous().view(torch.int8).float().view(n, 2, 8)
        d = _f16(blocks[:, 208:210])
        parts = []
        for qq in range(4):
            lo = ql[:, :, 32 * (qq & 1):32 * (qq & 1) + 32]
            nib = (lo >> (4 * (qq >> 1))) & 15
            hb = (qh >> (2 * qq)) & 3
            q = (nib | (hb << 4)).float() - 32.0                        # [n, 2, 32]
            s = sc[:, :, None, :].expand(n, 2, 1, 8)[..., 0, :]          # [n, 2, 8]
            s = torch.stack([s[:, :, 2 * qq], s[:, :, 2 * qq + 1]], 2).repeat_interleave(16, 2)
            parts.append(q * s)
        y = torch.stack(parts, 2)                                       # [n, 2, 4, 32]
        return (d[:, None, None, None] * y).reshape(n, 256)
    raise ValueError(qtype)


def dequantize(raw: torch.Tensor, qtype: str, shape) -> torch.Tensor:
    """raw uint8 [rows, row_bytes] -> float32 `shape`.

    Uses the engine's dequantizer (g906.engine.quant.dequant) when it is present, else the
    torch code above for the fused types, else gguf's numpy dequantizer."""
    try:
        from g906.engine.quant.dequant import dequantize as engine_dequantize  # type: ignore
    except Exception:
        engine_dequantize = None
    if engine_dequantize is not None:
        return engine_dequantize(raw, qtype, tuple(shape)).float()
    rows, cols = int(shape[0]), int(shape[1])
    if qtype in TORCH_TYPES:
        be, bb = BLOCKS[qtype]
        blocks = raw.reshape(-1, bb)
        return _dequant_torch(blocks, qtype).reshape(rows, cols)
    from gguf import GGMLQuantizationType
    from gguf.quants import dequantize as gguf_dequantize

    arr = gguf_dequantize(raw.cpu().numpy(), GGMLQuantizationType[qtype])
    return torch.from_numpy(np.ascontiguousarray(arr, dtype=np.float32)).reshape(rows, cols).to(raw.device)


def rms_in(x, rms_of):
    """rms_of = (ss, eps): x [T, K] (an hn, see add_norm_out) times 1 / rms of the rows whose
    sums of squares are ss [T, P] summed over P, in x's dtype. RMSNorm(h) = rms_in(hn, (ss,
    eps)) for (h, hn, ss) = add_norm_out(...): the norm split over two projections."""
    if rms_of is None:
        return x
    ss, eps = rms_of
    rstd = torch.rsqrt(ss.float().sum(-1, keepdim=True) / x.shape[-1] + eps)
    return (x.float() * rstd).to(x.dtype)


def add_norm_out(y, add_norm):
    """add_norm = (residual, norm_weight, zero_centred): (h, hn, ss) with h = y + residual (the
    new residual stream), hn = h * norm_weight (1 + it if zero_centred), each rounded to y's
    dtype, and ss [T, P] fp32 partial sums of h * h over P column groups (P = 1 here; the
    kernels' P is their programs along N): an RMSNorm of h whose 1 / rms the next projection
    applies (rms_in)."""
    if add_norm is None:
        return y
    residual, nw, zero_centred = add_norm
    h = (y.float() + residual.float()).to(y.dtype)
    w = nw.float() + 1.0 if zero_centred else nw.float()
    hf = h.float()
    return h, (hf * w).to(y.dtype), hf.pow(2).sum(-1, keepdim=True)


def linear(x, weight, *, add_norm=None, rms_of=None):
    x = rms_in(x, rms_of)
    if isinstance(weight, torch.Tensor):
        if x.device.type == "cpu" and x.dtype != torch.float32:
            y = (x.float() @ weight.float().t()).to(x.dtype)
        else:
            y = x @ weight.to(x.dtype).t()
        return add_norm_out(y, add_norm)
    if getattr(weight, "planes", None) is not None:  # PackedQuant (repack.py): exact decode
        w = weight.dequantize()
    else:
        w = dequantize(weight.data, weight.qtype, weight.shape)
    return add_norm_out((x.float() @ w.t()).to(x.dtype), add_norm)


def linear_pair(x, w0, w1, *, rms_of=None):
    """(linear(x, w0), linear(x, w1)): two projections of one input (one launch on a GPU)."""
    return linear(x, w0, rms_of=rms_of), linear(x, w1, rms_of=rms_of)


def linear_glu(x, weight, *, rms_of=None):
    """silu_and_mul(linear(x, weight)) for weight = [gate; up]: the MLP's gate and up
    projections and their SwiGLU (one GEMV kernel at decode on a GPU)."""
    from ..activation.reference import silu_and_mul

    return silu_and_mul(linear(x, weight, rms_of=rms_of))


def silu_mul_linear(x, weight, *, add_norm=None):
    """linear(silu_and_mul(x), weight): the fused decode GEMV's reference."""
    from ..activation.reference import silu_and_mul

    return linear(silu_and_mul(x), weight, add_norm=add_norm)


def gated_norm_linear(o, z, norm_weight, eps, weight, *, add_norm=None):
    """linear(gated_rms_norm(o, z, norm_weight, eps) as [T, H * D], weight) for o [T, H, D]."""
    from ..norm.reference import gated_rms_norm

    T = o.shape[0]
    return linear(gated_rms_norm(o, z, norm_weight, eps).reshape(T, -1), weight,
                  add_norm=add_norm)
