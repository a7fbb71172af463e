from __future__ import annotations

import pytest
import torch

from .conftest import DEVICE, HAS_GPU

TOL = {torch.float32: 1e-4, torch.float16: 2e-3, torch.bfloat16: 1e-2}

gpu = pytest.mark.gpu
needs_gpu = pytest.mark.skipif(not HAS_GPU, reason="needs a CUDA/ROCm GPU")


def rel_err(out: torch.Tensor, ref: torch.Tensor) -> float:
    out = out.double()
    ref = ref.double()
    return float((out - ref).norm() / ref.norm().clamp_min(1e-30))


def assert_close(out, ref, dtype=None, tol=None):
    dtype = dtype or out.dtype
    assert out.shape == ref.shape, (out.shape, ref.shape)
    assert not torch.isnan(out).any(), "NaN in output (unwritten or invalid elements)"
    assert not torch.isnan(ref).any(), "NaN in reference"
    e = rel_err(out, ref)
    t = tol if tol is not None else TOL[dtype]
    assert e <= t, f"relative error {e:.3e} > {t:.1e}"


def randn(*shape, dtype=torch.float32, scale=1.0, gen=None):
    return (torch.randn(*shape, generator=gen) * scale).to(device=DEVICE, dtype=dtype)


def paged_cache(num_blocks, block_size, hk, d, dtype):
    """Cache poisoned with NaN (unwritten slots must never be read)."""
    kc = torch.full((num_blocks, block_size, hk, d), float("nan"), dtype=dtype, device=DEVICE)
    vc = torch.full_like(kc, float("nan"))
    return kc, vc


def fill_sequences(kc, vc, seq_lens, gen):
    """Random block tables (a shuffled pool) and K/V written for every cached position."""
    nb, bs = kc.shape[:2]
    perm = torch.randperm(nb, generator=gen).tolist()
    max_blocks = max((n + bs - 1) // bs for n in seq_lens) + 1
    tables = torch.full((len(seq_lens), max_blocks), -1, dtype=torch.int32)
    for b, n in enumerate(seq_lens):
        for i in range((n + bs - 1) // bs):
            tables[b, i] = perm.pop()
        for p in range(n):
            blk, off = int(tables[b, p // bs]), p % bs
            kc[blk, off] = torch.randn(kc.shape[2:], generator=gen).to(kc.dtype)
            vc[blk, off] = torch.randn(vc.shape[2:], generator=gen).to(vc.dtype)
    # -1 entries are never dereferenced for valid positions; use 0 so masked lanes stay in bounds
    return tables.clamp_min(0).to(DEVICE)


# the modules of g906.kernels.linear whose launchers ask is_rocm() and warp_size(): a mocked
# device must replace those names in each
LINEAR_LAUNCHERS = ("kernel", "dense", "packed", "packed_config")


def linear_launchers_with(name: str) -> list:
    """The modules of LINEAR_LAUNCHERS that look `name` up."""
    import importlib

    mods = [importlib.import_module(f"g906.kernels.linear.{m}") for m in LINEAR_LAUNCHERS]
    return [m for m in mods if hasattr(m, name)]
