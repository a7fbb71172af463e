"""Triton entry points of the linear ops (registered in g906/kernels/ops.py): each picks the
kernel for its weight (dense, raw GGUF blocks, repacked) and shape, and fuses the neighbouring
op into the GEMV where that pays.

The kernels: dense.py (dense GEMV), gguf_matmul.py (raw GGUF blocks), packed.py and
packed_*.py (repacked weights, repack.py), residual_norm.py (the RMSNorm split over two GEMVs).
"""

from __future__ import annotations

import torch
import triton

from .. import registry
from .._triton_util import empty, is_rocm, next_pow2
from ..pdl import pdl_args
from ..int4.weight import is_group_quant
from .dense import _gemv_config, dense_gemv
from .gguf_matmul import quant_matmul
from .packed import packed_matmul
from . import packed_config
from .packed_config import (_pq_args, _pq_pair_configs, _pq_whole_rows, _whole_row_blocks,
                            warp_size)
from .packed_fields import PQ_E, PQ_QTYPES
from .packed_gemv import _pq_gemv_pair_kernel
from .residual_norm import _around, _rms_in_registers, _rms_of_args


# A fused op is recomputed by every program for its whole K range: programs x K x T elements,
# each an exp and a reciprocal on the special-function units, which few lanes share. Small
# products (the 0.8B's down and output projections) run faster fused than as two kernels;
# larger ones (the 9B's) lose more than the separate kernel costs. Above this many elements
# the two ops run separately.
FUSED_RECOMPUTE_MAX = 2_000_000


def _recompute_ok(T, N, K, block_n) -> bool:
    return triton.cdiv(N, block_n) * K * T <= FUSED_RECOMPUTE_MAX


def _gemv_fusable(x, weight) -> bool:
    if not (isinstance(weight, torch.Tensor) and 0 < x.shape[0] <= 16 and x.dim() == 2
            and weight.dtype == x.dtype and weight.stride(1) == 1):
        return False
    N, K = weight.shape
    c = _gemv_config(x.shape[0], N, K, x.device, x.dtype)
    return _recompute_ok(x.shape[0], N, K, c["BLOCK_N"])


def _packed_silu_pays(x, pw) -> bool:
    N, K = pw.shape
    c = packed_config._pq_gemv_config(x.shape[0], N, K, pw.qtype, x.device)   # (as packed_matmul)
    return _recompute_ok(x.shape[0], N, K, c["BLOCK_N"])


def silu_mul_linear(x, weight, *, add_norm=None):
    """linear(silu_and_mul(x), weight): one GEMV kernel for dense weights and T <= 16 (decode),
    else the two ops as the registry picks them. add_norm: as linear's."""
    if _gemv_fusable(x, weight) and x.stride(1) == 1:
        return dense_gemv(x, weight, prologue=("silu_mul",), add_norm=add_norm)
    if (getattr(weight, "planes", None) is not None and x.stride(1) == 1 and x.shape[0] <= 16
            and x.dtype in (torch.float16, torch.float32) and _packed_silu_pays(x, weight)):
        return packed_matmul(x, weight, silu=True, add_norm=add_norm)  # its GEMV fuses it
    return registry.dispatch("linear", registry.dispatch("silu_and_mul", x), weight,
                             add_norm=add_norm)


def gated_norm_linear(o, z, norm_weight, eps, weight, *, add_norm=None):
    """linear(gated_rms_norm(o, z, norm_weight, eps) as [T, H * D], weight) for o, z [T, H, D]:
    one GEMV kernel for dense weights, T <= 16 and a power-of-two D, else the two ops.
    add_norm: as linear's."""
    T, H, D = o.shape
    x = o.reshape(T, H * D)
    if (_gemv_fusable(x, weight) and x.stride(1) == 1 and z.stride(-1) == 1
            and D & (D - 1) == 0 and norm_weight.numel() == D):
        return dense_gemv(x, weight, prologue=("gated_norm", z, norm_weight, eps),
                          add_norm=add_norm)
    normed = registry.dispatch("gated_rms_norm", o, z, norm_weight, eps)
    return registry.dispatch("linear", normed.reshape(T, H * D), weight, add_norm=add_norm)


def linear(x, weight, *, add_norm=None, rms_of=None, **cfg):
    """add_norm, rms_of (residual_norm.py): inside the GEMV where linear_fuses_norm, else
    computed around the product as reference.py defines them."""
    if is_group_quant(weight):      # GPTQ / AWQ / compressed-tensors (int4/kernel.py)
        if add_norm is not None or rms_of is not None:
            return _around(linear, x, weight, add_norm, rms_of, **cfg)
        return registry.dispatch("group_quant_matmul", x, weight)
    dense = isinstance(weight, torch.Tensor)
    if dense and x.shape[0] <= 16:
        return dense_gemv(x, weight, add_norm=add_norm, rms_of=rms_of, **cfg)
    if getattr(weight, "planes", None) is not None:  # PackedQuant (repack.prepare)
        return packed_matmul(x, weight, add_norm=add_norm, rms_of=rms_of, **cfg)
    if add_norm is not None or rms_of is not None:
        return _around(linear, x, weight, add_norm, rms_of, **cfg)
    if dense:  # prefill: the vendor GEMM (rocBLAS / cuBLAS) is the right tool
        return x @ weight.t()
    return quant_matmul(x, weight, **cfg)


def linear_glu(x, weight, *, rms_of=None):
    """silu(x @ gate^T) * (x @ up^T) for weight = [gate; up]: in the epilogue of the packed
    GEMV at decode sizes (packed_matmul's glu), else the product then the silu-mul. rms_of:
    as linear's."""
    if getattr(weight, "planes", None) is not None:
        return packed_matmul(x, weight, glu=True, rms_of=rms_of)
    return registry.dispatch("silu_and_mul", linear(x, weight, rms_of=rms_of))


# Packed types whose GEMVs take the split RMSNorm on CUDA (faster than the norm kernels).
# Q8_0's 1-warp GEMVs are slower with it, and ROCm's have not been timed on a gfx906: they
# keep the norm kernels.
SPLIT_NORM_QTYPES = ("Q4_K", "Q5_K", "Q6_K")


def linear_fuses_norm(x, weight) -> bool:
    """Whether linear(x, weight) takes add_norm / rms_of inside its GEMV: the dense GEMV
    (decode sizes), and on CUDA the packed GEMV of a SPLIT_NORM_QTYPES weight where one
    program sums a whole row (T <= 16 off the tensor-core path, one split of K)."""
    if getattr(weight, "planes", None) is not None:
        return (weight.qtype in SPLIT_NORM_QTYPES and not is_rocm()
                and _pq_whole_rows(x, weight))
    return (isinstance(weight, torch.Tensor) and 0 < x.shape[0] <= 16
            and weight.dtype == x.dtype and weight.stride(1) == 1)


def linear_pair(x, w0, w1, *, rms_of=None):
    """(linear(x, w0), linear(x, w1)): two packed weights of different types read by one launch
    (_pq_gemv_pair_kernel) where _pq_pair_configs allows (the outputs are then views of one
    [T, N0 + N1] tensor), else one linear each. A GGUF mix's projections of one input (Q4_K_M's
    linear attention: the Q5_K qkv and the Q4_K z / b / a) then cost one GEMV's start and tail.
    rms_of: as linear's (x an hn; both GEMVs apply its 1 / rms)."""
    pws = (w0, w1)
    cs = _pq_pair_configs(x, pws)
    if cs is None:
        return linear(x, w0, rms_of=rms_of), linear(x, w1, rms_of=rms_of)
    x, rms_of = _rms_in_registers(x, rms_of)
    ss_in, p_in, eps_in = _rms_of_args(rms_of, x)
    T, K = x.shape
    (a, b), (ca, cb) = pws, cs
    out = empty((T, a.shape[0] + b.shape[0]), x.dtype, x.device)
    progs = triton.cdiv(a.shape[0], ca["BLOCK_N"])
    bt = ca["BLOCK_T"]
    grid = (progs + triton.cdiv(b.shape[0], cb["BLOCK_N"]), 1, triton.cdiv(T, bt))

    def seg(w, c, suffix):
        qs, qh, pa, pb = _pq_args(w)
        args = [qs, qh, pa, pb, w.shape[0], K // PQ_E[w.qtype], qs.stride(0), qh.stride(0),
                pa.stride(0), pb.stride(0)]
        const = {k + suffix: v for k, v in dict(
            QT=PQ_QTYPES[w.qtype], E=PQ_E[w.qtype], BLOCK_N=c["BLOCK_N"], EVEN=c["EVEN"],
            PREFETCH=c["PREFETCH"], PAIRS=c["PAIRS"], WSPLIT=c["WSPLIT"],
            PRELOAD=c["PRELOAD"], EVEN_N=_whole_row_blocks(w.shape[0], c["BLOCK_N"]),
            ROWPAIRED=w.row_pairs).items()}
        return args, const

    args_a, const_a = seg(a, ca, "")
    args_b, const_b = seg(b, cb, "2")
    _pq_gemv_pair_kernel[grid](
        x, out, T, x.stride(0), out.stride(0), 0x3F800000, progs, ss_in, p_in, eps_in,
        *args_a, *args_b, H=warp_size(x.device) * ca["num_warps"], BLOCK_T=bt,
        ONE_IMM=ca["ONE_IMM"], CVT=ca["CVT"], TOKEN_BLOCKS=T > bt, num_warps=ca["num_warps"],
        RMS_IN=rms_of is not None, BLOCK_P=next_pow2(p_in), **const_a, **const_b,
        **pdl_args(x.device))
    return out[:, :a.shape[0]], out[:, a.shape[0]:]
