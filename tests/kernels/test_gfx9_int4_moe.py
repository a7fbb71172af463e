"""gfx9 code check of the int4 routed-expert GEMVs (g906/kernels/moe/int4.py), the kernels ROCm
runs for an int4 MoE decode step: compiled for gfx908 from recorded launches at Qwen3.5-35B-A3B's
expert shapes (hidden 2048, 512 features an expert, top-8, group 128; 8 experts stand in for
256: the expert count is a runtime stride), they must not use AGPRs, spill or need more than 256
VGPRs (a gfx906 lane's): test_gfx9_code.py's compiler and rules. The grouped GEMM is left out,
as for the dense int4 kernels: its tl.dot becomes MFMA on gfx908, FMAs on gfx906."""

from __future__ import annotations

import importlib
from unittest import mock

import torch

from tests.kernels.test_gfx9_code import (MAX_VGPRS, _check, _launch_request, _Launches,  # noqa: F401
                                          compiler, sass)

CASES = [  # (tokens, zero points, act order, bits)
    (1, False, False, 4), (1, True, False, 4), (4, True, True, 4), (1, False, False, 8),
]


def _experts(E, N, K, gs, zeros, act, bits):
    from g906.kernels.int4.experts import GroupQuantExperts

    G = K // gs
    return GroupQuantExperts(torch.zeros(E, N, K * bits // 32, dtype=torch.int32),
                             torch.zeros(E, N, G, dtype=torch.float16),
                             torch.zeros(E, N, G, dtype=torch.uint8) if zeros else None, bits, gs, (E, N, K),
                             torch.arange(K).expand(E, 1, K).contiguous() if act else None)


def test_int4_routed_gemvs_do_not_spill(compiler, sass):
    module = "g906.kernels.moe.int4"
    mod = importlib.import_module(module)
    E, H, inter, k, gs = 8, 2048, 512, 8, 128
    results = []
    for T, zeros, act, bits in CASES:
        gu = _experts(E, 2 * inter, H, gs, zeros, act, bits)
        dn = _experts(E, H, inter, gs, zeros, act, bits)
        x = torch.zeros(T, H, dtype=torch.float16)
        ids = torch.arange(T * k, dtype=torch.int32).reshape(T, k) % E
        w = torch.full((T, k), 1.0 / k)
        recs = {n: _Launches(getattr(mod, n)) for n in ("_gq_routed_gate_up_kernel", "_gq_routed_down_kernel")}
        with mock.patch.multiple(mod, **recs):
            mod.moe_experts(x, gu, dn, ids, w)
        for name, rec in recs.items():
            assert len(rec.calls) == 1, name
            args, kwargs = rec.calls[0]
            req, _ = _launch_request(sass, module, name, rec.fn, args, kwargs)
            label = f"{name} T={T} zeros={zeros} act={act} bits={bits}"
            results.append((label, compiler(req), MAX_VGPRS))
    _check(results)
