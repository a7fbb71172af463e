"""The probe for real (gloo on the CPU), its diagnoses, and install's automatic rollback."""

from __future__ import annotations

import json
import sys

from g906.rccl import resolve_target, run_probe, status
from g906.rccl import state as st

from .helpers import assert_clean_error, real_torch_env, run_cli, sha


def test_probe_gloo_world_size_2_runs_for_real():
    p = run_cli("probe", "--backend", "gloo", "--world-size", "2", timeout=300)
    assert p.returncode == 0, p.stdout + p.stderr
    assert "ALLREDUCE_OK" in p.stdout
    assert "[2.0, 2.0, 2.0, 2.0]" in p.stdout
    assert "torch=" in p.stdout


def test_probe_nccl_without_gpus_is_unavailable_not_failed():
    p = run_cli("probe", "--backend", "nccl", "--world-size", "1")
    assert_clean_error(p, "probe unavailable", "no NCCL/RCCL backend")


def test_probe_diagnoses_a_torch_that_cannot_load(fake_env):
    env = fake_env()                     # torch/__init__.py raises "undefined symbol"
    res = run_probe(str(env.python), world_size=2, backend="gloo")
    assert res.status == "failed"
    assert "import torch failed" in res.summary and "undefined symbol" in res.summary
    assert "same ROCm" in res.hint
    p = run_cli("probe", "--python", env.python, "--backend", "gloo")
    assert_clean_error(p, "undefined symbol")


def test_probe_detects_wrong_results(fake_env, tmp_path):
    # A torch whose all_reduce is a no-op: the sum is wrong (what a broken RCCL looks like).
    shim = tmp_path / "shim"
    shim.mkdir()
    (shim / "sitecustomize.py").write_text(
        "import torch.distributed as d\n"
        "d.all_reduce = lambda t, *a, **k: None\n")
    import os

    env = dict(os.environ, PYTHONPATH=str(shim))
    res = run_probe(sys.executable, world_size=2, backend="gloo", env=env, sizes=(4,))
    assert res.status == "failed", res.output
    assert "returned 1.0" in res.summary and "expected 2.0" in res.summary


def test_failed_probe_rolls_back_automatically(fake_env, gfx906_lib):
    env = fake_env()
    before = env.files()
    p = run_cli("install", gfx906_lib, "--python", env.python, "--probe-backend", "gloo")
    assert_clean_error(p, "the probe failed after installing", "restored the original", "undefined symbol",
                       "rollback: rolled_back")
    assert env.files() == before
    assert st.load_manifest(st.area_for(env.lib_dir)).state == "rolled_back"


def test_failed_probe_json(fake_env, gfx906_lib):
    env = fake_env()
    before = env.files()
    p = run_cli("install", gfx906_lib, "--python", env.python, "--probe-backend", "gloo", "--json")
    assert p.returncode == 1
    out = json.loads(p.stdout)
    assert out["result"]["probe"]["status"] == "failed"
    assert out["result"]["rollback"]["action"] == "rolled_back"
    assert env.files() == before


def test_install_then_probe_passes_on_a_real_torch(tmp_path, gfx906_lib, stock_lib):
    """A real torch (the installed one, seen through a symlink farm) with a bundled librccl:
    install swaps it, the gloo probe passes in that environment, and the swap stays."""
    env = real_torch_env(tmp_path / "real", stock_lib)
    p = run_cli("install", gfx906_lib, "--python", env.python, "--probe-backend", "gloo", timeout=300)
    assert p.returncode == 0, p.stdout + p.stderr
    assert "ALLREDUCE_OK" in p.stdout
    assert sha(env.lib_dir / "librccl.so.1") == sha(gfx906_lib)
    assert status(resolve_target(str(env.python)))["g906_swap"]
