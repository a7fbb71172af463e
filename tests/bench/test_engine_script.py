"""benchmarks/engine.py end to end on a tiny shape (the H200 run uses the same code paths)."""

from __future__ import annotations

import json

import pytest

from tests.benchmark_scripts import load_benchmark


def test_engine_script_quick(tmp_path, capsys):
    mod = load_benchmark("engine")
    rc = mod.main(["--quick", "--device", "cpu", "--groups", "0.8b-f16", "--no-hf", "--out", str(tmp_path)])
    assert rc == 0
    data = json.loads((tmp_path / "engine.json").read_text())
    assert data["env"]["date"] and data["copy_bandwidth_bytes_s"] > 0 and data["matmul_flops_s"] > 0
    (row,) = data["rows"]
    assert row["id"] == "0.8b-f16-decode" and row["value"] > 0 and 0 < row["pct_of_limit"]
    assert row["detail"]["profile"]["kernels"] is not None
    assert row["detail"]["profile"]["graphs"]["kernels"] == []     # the CPU runs no kernels
    assert "| 0.8B F16 decode b=1 |" in capsys.readouterr().out
    assert data["prefill_graph_tokens"] == 512            # the engine's default (no graphs on the CPU)


def test_engine_script_refuses_negative_prefill_graphs(capsys):
    with pytest.raises(SystemExit) as info:
        load_benchmark("engine").main(["--quick", "--device", "cpu", "--prefill-graphs", "-1"])
    assert info.value.code == 2 and "--prefill-graphs must be 0 or more" in capsys.readouterr().err


def test_kernel_timeline_counts_pdl_overlap_once():
    """Each kernel costs the time from the end of the one before it to its own end: a kernel
    that starts early (PDL) is not charged its overlap, a gap goes to the kernel after it."""
    ev = [dict(name="a", ts=0.0, dur=10.0, args={"grid": [4, 1, 1]}),
          dict(name="b", ts=8.0, dur=5.0, args={"grid": [2, 1, 1]}),     # starts 2 us early
          dict(name="a", ts=20.0, dur=10.0, args={"grid": [4, 1, 1]}),   # after a 7 us gap
          dict(name="c", ts=21.0, dur=3.0)]                              # inside a's span
    t = load_benchmark("engine").kernel_timeline(ev, steps=2)
    got = {r["name"]: (r["us_per_step"], r["calls_per_step"]) for r in t["kernels"]}
    assert got == {"a [4, 1, 1]": (13.5, 1.0), "b [2, 1, 1]": (1.5, 0.5), "c": (0.0, 0.5)}
    assert t["us_per_step"] == 15.0 and t["kernels_per_step"] == 2.0
    assert [r["name"] for r in t["kernels"]][0] == "a [4, 1, 1]"


def test_gemv_config_overrides(monkeypatch, capsys):
    """--gemv-config: one weight shape's batch-1 packed GEMV config, checked as it is parsed."""
    import torch

    from g906.kernels.linear import packed_config as K

    mod = load_benchmark("engine")
    key, cfg = mod.parse_gemv_config("Q4_K:4096x4096:BLOCK_N=4,num_warps=2,PREFETCH=false")
    assert key == ("Q4_K", 4096, 4096) and cfg == {"BLOCK_N": 4, "num_warps": 2, "PREFETCH": False}
    monkeypatch.setattr(K, "_pq_gemv_config", K._pq_gemv_config)      # restored after the test
    cpu = torch.device("cpu")
    before = K._pq_gemv_config(1, 4096, 4096, "Q4_K", cpu)
    mod.apply_gemv_configs({key: cfg})
    mod.apply_gemv_configs({key: cfg})                                  # twice: wraps the original once
    got = K._pq_gemv_config(1, 4096, 4096, "Q4_K", cpu)
    assert got == {**before, **cfg} and got["BLOCK_N"] == 4
    assert K._pq_gemv_config(2, 4096, 4096, "Q4_K", cpu) == K._pq_gemv_config.__wrapped__(2, 4096, 4096, "Q4_K", cpu)
    assert K._pq_gemv_config(1, 8192, 4096, "Q4_K", cpu) == K._pq_gemv_config.__wrapped__(1, 8192, 4096, "Q4_K", cpu)
    for bad, why in [("Q4_K:4096x4096", "expected QTYPE:NxK"), ("Q3_K:1x256:BLOCK_N=4", "unknown packed type"),
                     ("Q4_K:4096:BLOCK_N=4", "is not ROWSxIN"), ("Q4_K:4096x4096:ROWS=4", "is not KEY=VALUE"),
                     ("Q4_K:4096x4096:BLOCK_N=four", "takes an integer"),
                     ("Q4_K:4096x4096:PREFETCH=maybe", "takes true/false")]:
        with pytest.raises(ValueError, match=why):
            mod.parse_gemv_config(bad)
    with pytest.raises(SystemExit) as info:
        mod.main(["--quick", "--device", "cpu", "--gemv-config", "Q4_K:4096x4096:ROWS=4"])
    assert info.value.code == 2 and "--gemv-config 'Q4_K:4096x4096:ROWS=4': 'ROWS=4' is not" in capsys.readouterr().err
