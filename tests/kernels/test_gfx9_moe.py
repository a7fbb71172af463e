"""gfx9 code check of the MoE kernels (g906/kernels/moe) at the shape MI50 owners run, the
35B-A3B (hidden 2048, 256 experts of 512 features, top-8), compiled for gfx908 from recorded
launches of moe_experts with the engine's dtypes as test_gfx9_code.py compiles the other
decode kernels: the routed GEMVs of decode (1 to 16 tokens) and the grouped GEMMs of prefill,
dense fp16 experts and every fused GGUF type. Nothing may spill on a gfx906 (no AGPRs, no
scratch, at most 256 VGPRs). The shared expert runs the dense MLP's kernels and the router
the dense GEMV: test_gfx9_code.py checks them at this shape.

The grouped GEMM's tl.dot: on gfx908 Triton lowers it to matrix-core (MFMA) instructions, which
accumulate in AGPRs; a gfx906 has no matrix cores and takes the FMA lowering. The compiling
process leaves the MFMA pass out for these requests (`fma_dot`), so the code checked is the FMA
code a gfx906 runs."""

from __future__ import annotations

import importlib
import json
from unittest import mock

import pytest
import torch

from g906 import data
from tests.kernels.test_gfx9_code import (  # noqa: F401 - compiler, sass: fixtures
    MAX_VGPRS,
    _check,
    _launch_request,
    _analyse,
    _Launches,
    _rocm,
    compiler,
    sass,
)

SHAPE = data.load("models")["shapes"]["qwen3.5-35b-a3b"]
MODULE = "g906.kernels.moe.kernel"
MOE_QTYPES = ("F16", *importlib.import_module(MODULE).FUSED_QTYPES)


def _experts(qtype: str, E: int, N: int, K: int):
    """Expert weights [E, N, K] as the engine holds them (never read: empty storage)."""
    from g906.engine.weights import QuantizedExperts
    from g906.kernels.linear.gguf_decode import STEP_BYTES

    if qtype == "F16":
        return torch.empty(E, N, K, dtype=torch.float16)
    return QuantizedExperts(torch.empty(E, N, K // 256 * STEP_BYTES[qtype], dtype=torch.uint8), qtype, (E, N, K))


def _launch_moe(qtype: str, T: int) -> list[tuple[str, tuple, dict]]:
    """The kernels moe_experts launches for T tokens at the 35B-A3B shape (ROCm's configs)."""
    mod = importlib.import_module(MODULE)
    h, E, k, inter = SHAPE["hidden_size"], SHAPE["num_experts"], SHAPE["num_experts_per_tok"], \
        SHAPE["moe_intermediate_size"]
    names = ("_routed_gate_up_kernel", "_routed_down_kernel", "_grouped_gate_up_kernel", "_grouped_down_kernel")
    recs = {n: _Launches(getattr(mod, n)) for n in names}
    x = torch.zeros(T, h, dtype=torch.float16)
    ids = torch.stack([torch.randperm(E)[:k] for _ in range(T)])
    tw = torch.full((T, k), 1.0 / k)
    with mock.patch.multiple(mod, on_gpu=lambda device: True, is_rocm=lambda: True, **recs):
        mod.moe_experts(x, _experts(qtype, E, 2 * inter, h), _experts(qtype, E, h, inter), ids, tw)
    return [(n, args, kw) for n, rec in recs.items() for args, kw in rec.calls]


TOKENS = (1, 4, 16, 64)


@pytest.mark.parametrize("qtype", MOE_QTYPES)
def test_moe_kernels(compiler, sass, qtype):
    """The routed GEMVs (1, 4 and 16 tokens) and the grouped GEMMs (64 tokens) moe_experts
    launches on ROCm, with fp16 or GGUF experts."""
    mod = importlib.import_module(MODULE)
    cases: dict[str, tuple] = {}
    with _rocm():
        for T in TOKENS:
            for name, args, kwargs in _launch_moe(qtype, T):
                req, const = _launch_request(sass, MODULE, name, getattr(mod, name), args, kwargs)
                if name.startswith("_grouped"):
                    req["fma_dot"] = True
                case = cases.setdefault(json.dumps(req, sort_keys=True), (name, req, const, set()))
                case[3].add(T)
    assert {c[0] for c in cases.values()} == {"_routed_gate_up_kernel", "_routed_down_kernel",
                                              "_grouped_gate_up_kernel", "_grouped_down_kernel"}
    results = []
    for name, req, const, tokens in cases.values():
        shown = " ".join(f"{k}={v}" for k, v in const.items() if k.isupper())
        label = f"{name} {qtype} {shown} warps={req['options'].get('num_warps')} (T={sorted(tokens)})"
        results.append((label, compiler(req), MAX_VGPRS))
    _check(results)


def test_fma_dot_is_not_the_matrix_core_code(compiler, sass):
    """Without fma_dot the gfx908 build of the grouped GEMM takes matrix-core instructions,
    whose accumulators are AGPRs; with it, none: the check reads the code a gfx906 runs."""
    mod = importlib.import_module(MODULE)
    with _rocm():
        name, args, kwargs = next(c for c in _launch_moe("F16", 64) if c[0] == "_grouped_gate_up_kernel")
    req, _ = _launch_request(sass, MODULE, name, getattr(mod, name), args, kwargs)
    assert compiler(req)["agprs"] > 0
    assert compiler({**req, "fma_dot": True})["agprs"] == 0


@pytest.mark.parametrize("qtype", ["Q4_K", "F16"])
def test_sass_script_builds_the_engines_routed_gemv(compiler, sass, qtype):
    """benchmarks/sass.py --moe (which prints the routed GEMV's VALU instructions per weight,
    docs/PERF.md) compiles the kernel moe_experts launches at one token: the same constexprs
    and the same registers."""
    mod = importlib.import_module(MODULE)
    with _rocm():
        launches = {n: (a, kw) for n, a, kw in _launch_moe(qtype, 1)}
    for which, name in (("gate_up", "_routed_gate_up_kernel"), ("down", "_routed_down_kernel")):
        req, const = _launch_request(sass, MODULE, name, getattr(mod, name), *launches[name])
        res = _analyse(compiler, ["--moe", which, "--qtype", qtype, "--rows", const["BLOCK_N"],
                                  "--block-k", const["BLOCK_K"], "--warps", req["options"]["num_warps"]])
        assert {k: res["const"][k] for k in ("TOPK", "QT", "STEP_B", "BLOCK_N", "BLOCK_K")} == \
            {k: const[k] for k in ("TOPK", "QT", "STEP_B", "BLOCK_N", "BLOCK_K")}
        assert res["vgprs"] == compiler(req)["vgprs"]
