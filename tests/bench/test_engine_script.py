"""benchmarks/engine.py end to end on a tiny shape (the H200 run uses the same code paths)."""

from __future__ import annotations

import importlib.util
import json
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]


def _script():
    spec = importlib.util.spec_from_file_location("bench_engine", ROOT / "benchmarks" / "engine.py")
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    return mod


def test_engine_script_quick(tmp_path, capsys):
    mod = _script()
    rc = mod.main(["--quick", "--device", "cpu", "--groups", "0.8b-f16", "--no-hf", "--out", str(tmp_path)])
    assert rc == 0
    data = json.loads((tmp_path / "engine.json").read_text())
    assert data["env"]["date"] and data["copy_bandwidth_bytes_s"] > 0 and data["matmul_flops_s"] > 0
    (row,) = data["rows"]
    assert row["id"] == "0.8b-f16-decode" and row["value"] > 0 and 0 < row["pct_of_limit"]
    assert row["detail"]["profile"]["kernels"] is not None
    assert "| 0.8B F16 decode b=1 |" in capsys.readouterr().out
    assert data["prefill_graph_tokens"] == 512            # the engine's default (no graphs on the CPU)


def test_engine_script_refuses_negative_prefill_graphs(capsys):
    with pytest.raises(SystemExit) as info:
        _script().main(["--quick", "--device", "cpu", "--prefill-graphs", "-1"])
    assert info.value.code == 2 and "--prefill-graphs must be 0 or more" in capsys.readouterr().err
