from __future__ import annotations

import torch.nn.functional as F


def silu_and_mul(x):
    i = x.shape[-1] // 2
    return (F.silu(x[..., :i].float()) * x[..., i:].float()).to(x.dtype)
