"""gfx9 code check of the int4 dequant-GEMV (g906/kernels/int4/kernel.py), the kernel ROCm runs
in decode: compiled for gfx908 from recorded launches at Qwen3.5-9B shapes, it must not use
AGPRs, spill or need more than 256 VGPRs (a gfx906 lane's): test_gfx9_code.py's compiler and
rules. The prefill GEMM is left out: its tl.dot becomes MFMA on gfx908, whose accumulators live
in AGPRs, while gfx906 (no matrix cores) lowers it to FMAs, so gfx908's code says nothing about
it."""

from __future__ import annotations

import importlib
from unittest import mock

import pytest
import torch

from tests.kernels.test_gfx9_code import (MAX_VGPRS, _check, _launch_request, _Launches,  # noqa: F401
                                          compiler, sass)

CASES = [  # (N, K, T, group, zeros, bits)
    (8192, 4096, 1, 128, False, 4), (4096, 12288, 1, 128, True, 4), (4096, 4096, 4, -1, True, 4),
    (4096, 4096, 1, 128, True, 8), (8192, 4096, 16, 128, True, 4),
]


def test_int4_kernels_do_not_spill(compiler, sass):
    from g906.kernels.int4.weight import GroupQuantWeight

    module = "g906.kernels.int4.kernel"
    mod = importlib.import_module(module)
    results = []
    for N, K, T, gs, zeros, bits in CASES:
        gsz = K if gs == -1 else gs
        G = K // gsz
        w = GroupQuantWeight(torch.zeros(N, K * bits // 32, dtype=torch.int32), torch.zeros(N, G, dtype=torch.float16),
                             torch.zeros(N, G, dtype=torch.uint8) if zeros else None, bits, gsz, (N, K))
        x = torch.zeros(T, K, dtype=torch.float16)
        name = "_gq_gemv_kernel"
        rec = _Launches(getattr(mod, name))
        with mock.patch.object(mod, name, rec):
            mod.group_quant_matmul(x, w)
        assert len(rec.calls) == 1
        args, kwargs = rec.calls[0]
        req, const = _launch_request(sass, module, name, rec.fn, args, kwargs)
        label = f"{name} N={N} K={K} T={T} g{gs} zeros={zeros} bits={bits}"
        results.append((label, compiler(req), MAX_VGPRS))
    _check(results)
