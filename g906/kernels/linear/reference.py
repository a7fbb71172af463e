"""PyTorch references of the linear ops: dequantize (gguf_blocks.py) + matmul, and the RMSNorm
split over two projections (add_norm_out, rms_in)."""

from __future__ import annotations

import os

import torch

from ..int4.weight import is_group_quant
from .gguf_blocks import dequantize

# The float32 matrix of a GGUF weight kept on the weight object itself (CPU only): the CPU has no
# dequantizing GEMV, and dequantizing a whole matrix (a 248k-row output layer included) on every
# call made decode a hundred times slower than the matmul it feeds. The cost is the dense copy's
# memory (4 bytes a weight, beside the blocks); G906_CPU_DEQUANT_CACHE=0 trades it back for time.
_DENSE_ATTR = "_g906_dense_f32"


def cpu_dequant_cache_enabled() -> bool:
    return os.environ.get("G906_CPU_DEQUANT_CACHE", "1").strip().lower() not in ("0", "false", "no", "off")


def dense_weight(weight) -> torch.Tensor:
    """A QuantizedTensor's (or PackedQuant's) float32 [out, in] matrix; on the CPU dequantized
    once and kept with the weight (see _DENSE_ATTR)."""
    cached = getattr(weight, _DENSE_ATTR, None)
    if cached is not None:
        return cached
    if getattr(weight, "planes", None) is not None:  # PackedQuant (repack.py): exact decode
        w = weight.dequantize()
    else:
        w = dequantize(weight.data, weight.qtype, weight.shape)
    if w.device.type == "cpu" and cpu_dequant_cache_enabled():
        w = w.float().contiguous()
        object.__setattr__(weight, _DENSE_ATTR, w)
    return w


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
    if is_group_quant(weight):  # GPTQ / AWQ / compressed-tensors: its own op (int4/)
        from .. import registry

        return add_norm_out(registry.dispatch("group_quant_matmul", x, weight), add_norm)
    w = dense_weight(weight)
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
