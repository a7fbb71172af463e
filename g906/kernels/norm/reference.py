"""PyTorch references for the norms (fp32 math, output in the input dtype)."""

from __future__ import annotations

import torch
import torch.nn.functional as F


def rms_norm(x, weight, eps, *, residual=None, zero_centred=False):
    dtype = x.dtype
    if residual is not None:
        h = x.float() + residual.float()
        new_residual = h.to(dtype)
        # the normalised value is computed from the rounded residual, as a separate add would
        h = new_residual.float()
    else:
        h = x.float()
    w = weight.float()
    if zero_centred:
        w = 1.0 + w
    out = (h * torch.rsqrt(h.pow(2).mean(-1, keepdim=True) + eps) * w).to(dtype)
    if residual is not None:
        return out, new_residual
    return out


def gated_rms_norm(x, z, weight, eps):
    dtype = x.dtype
    h = x.float()
    h = h * torch.rsqrt(h.pow(2).mean(-1, keepdim=True) + eps)
    return (h * weight.float() * F.silu(z.float())).to(dtype)
