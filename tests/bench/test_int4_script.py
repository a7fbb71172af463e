"""benchmarks/int4.py runs end to end on the CPU in reference mode (the GPU run times the
Triton kernels): every row is produced, int4 and Q4_K weights give finite products, and the
figures are computed from the bytes each weight must move."""

from __future__ import annotations

import torch

from tests.benchmark_scripts import load_benchmark


def test_int4_benchmark_reference_mode(monkeypatch):
    monkeypatch.delenv("G906_KERNELS", raising=False)
    bench = load_benchmark("int4")
    out = bench.run(device=torch.device("cpu"), reference=True, quick=True, shrink=16, rep=1)
    rows = out["rows"]
    assert {r["weight"] for r in rows} == {"int4 g128 sym", "int4 g128 zp", "Q4_K"}
    assert {r["T"] for r in rows} == {1, 32} and len(rows) == 12
    assert all(r["path"] == "reference" and r["ms"] > 0 and r["pct_copy"] > 0 for r in rows)
    # a 4-bit weight with fp16 group-128 scales moves about a quarter of fp16's bytes, like Q4_K
    one = next(r for r in rows if r["weight"] == "int4 g128 sym" and r["T"] == 1)
    assert one["bytes"] < one["N"] * one["K"] * 2 * 0.3
    w = bench.int4_weight(64, 256, zeros=True, device="cpu")
    x = torch.randn(2, 256)
    from g906.kernels import ops

    assert torch.isfinite(ops.linear(x, w)).all() and torch.isfinite(
        ops.linear(x, bench.q4k_weight(64, 256, "cpu"))).all()


def test_int4_benchmark_moe_rows(monkeypatch):
    monkeypatch.delenv("G906_KERNELS", raising=False)
    bench = load_benchmark("int4")
    rows = bench.run_moe(device=torch.device("cpu"), reference=True, shrink=16, rep=1, bw=10.0)
    assert {r["weight"] for r in rows} == {"int4 g128 sym", "Q4_K"} and {r["T"] for r in rows} == {1, 32}
    one = next(r for r in rows if r["weight"] == "int4 g128 sym" and r["T"] == 1)
    assert one["active_experts"] == 8 and all(r["ms"] > 0 and r["path"] == "reference" for r in rows)
    # the active bytes: 8 of the 16 experts' int4 words and scales, about a quarter of fp16's
    assert one["bytes"] < 8 * 3 * one["N"] // 2 * one["K"] * 2 * 0.3
