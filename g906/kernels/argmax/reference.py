from __future__ import annotations

import torch


def argmax(x):
    """x [T, V] -> int64 [T]: the index of each row's maximum (the first one on ties)."""
    return x.argmax(dim=-1)
