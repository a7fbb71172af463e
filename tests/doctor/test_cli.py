"""`g906 doctor` end to end, as a subprocess: exit statuses, JSON, --collect/--from, --root,
CHECK_ID, --list-checks, --recipe. Most runs use fixture sysroots or saved facts, so no torch
import is needed; one runs on this machine as the acceptance criterion says."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from g906.doctor import collect_facts

from tests.doctor.sysroot import GiB, Machine, alice, amd_devices, build, torch_probe


def g906(*args: str, cwd: Path | None = None, env: dict | None = None) -> subprocess.CompletedProcess:
    e = dict(os.environ)
    e.pop("G906_DEBUG", None)
    e.update(env or {})
    return subprocess.run([sys.executable, "-m", "g906", *args], capture_output=True, text=True, cwd=cwd, env=e,
                          timeout=300)


def saved_facts(tmp_path: Path, machine: Machine, probe: dict, name: str = "facts.json", **kw) -> Path:
    root = build(tmp_path / ("root-" + name), machine)
    facts = collect_facts(root, probe=probe, env=kw.pop("env", {}), identity=kw.pop("identity", alice()),
                          run_tools=False)
    path = tmp_path / name
    facts.save(path)
    return path


HEALTHY = dict(gpus=[("gfx906", 32 * GiB)], rocm="6.3.0", rocblas_archs=["gfx906"], rccl_targets=["gfx906"])
HEALTHY_PROBE = torch_probe(devices=amd_devices(("gfx906", 32 * GiB)))


def on_cpu_machine() -> bool:
    return not os.path.exists("/dev/kfd") and not os.path.exists("/proc/driver/nvidia/version")


@pytest.mark.skipif(not on_cpu_machine(), reason="this machine has a GPU")
def test_json_on_this_cpu_machine():
    cp = g906("doctor", "--json")
    assert cp.returncode == 0, cp.stdout + cp.stderr
    doc = json.loads(cp.stdout)
    assert doc["ok"] is True and doc["format"] == 1
    assert doc["engine"]["device"] == "cpu"
    assert "will run on the CPU" in doc["engine"]["summary"]
    ids = [c["id"] for c in doc["checks"]]
    assert len(ids) == len(set(ids)) and "engine.device" in ids and "torch.import" in ids
    for c in doc["checks"]:
        assert set(c) == {"id", "status", "summary", "detail", "fix", "group", "title", "data"}
        assert c["status"] in ("ok", "warn", "fail", "skip")


def test_collect_then_from_gives_the_same_verdicts(tmp_path):
    root = build(tmp_path / "root", Machine(**HEALTHY))
    facts_file = tmp_path / "facts.json"
    first = g906("doctor", "--root", str(root), "--collect", str(facts_file), "--json")
    assert first.returncode in (0, 1), first.stderr
    assert facts_file.is_file()
    again = g906("doctor", "--from", str(facts_file), "--json")
    assert again.returncode == first.returncode
    a, b = json.loads(first.stdout), json.loads(again.stdout)
    assert [(c["id"], c["status"], c["summary"]) for c in a["checks"]] == \
           [(c["id"], c["status"], c["summary"]) for c in b["checks"]]
    # under --root without --python, torch is not inspected (no false verdicts about this machine's torch)
    torch_row = next(c for c in a["checks"] if c["id"] == "torch.import")
    assert torch_row["status"] == "skip" and "--python" in torch_row["summary"]


def test_exit_status_fail_and_human_report(tmp_path):
    bad = saved_facts(tmp_path, Machine(**{**HEALTHY, "rocm": "7.2.0", "rocblas_archs": ["gfx942"]}),
                      torch_probe("2.11.0+rocm7.2", "7.2.1", devices=amd_devices(("gfx906", 32 * GiB))))
    cp = g906("doctor", "--from", str(bad))
    assert cp.returncode == 1
    out = cp.stdout
    assert "✗" in out and "rocblas.tensile" in out and "fix:" in out
    assert "problems found:" in out and "1 failure" in out
    assert "Libraries" in out and "System" in out


def test_strict_turns_warnings_into_exit_1(tmp_path):
    warn_only = saved_facts(tmp_path, Machine(**HEALTHY), HEALTHY_PROBE, env={"HSA_OVERRIDE_GFX_VERSION": "9.0.6"})
    assert g906("doctor", "--from", str(warn_only)).returncode == 0
    cp = g906("doctor", "--from", str(warn_only), "--strict", "--json")
    assert cp.returncode == 1
    doc = json.loads(cp.stdout)
    assert doc["ok"] is False and doc["summary"]["warn"] >= 1 and doc["summary"]["fail"] == 0


def test_single_check_and_prefix(tmp_path):
    facts = saved_facts(tmp_path, Machine(**HEALTHY), HEALTHY_PROBE)
    cp = g906("doctor", "rocblas.tensile", "--from", str(facts), "--json")
    assert cp.returncode == 0
    assert [c["id"] for c in json.loads(cp.stdout)["checks"]] == ["rocblas.tensile"]
    cp = g906("doctor", "rccl", "--from", str(facts), "--json")
    assert [c["id"] for c in json.loads(cp.stdout)["checks"]] == ["rccl.gfx906", "rccl.swap"]
    cp = g906("doctor", "rocblas.tensil", "--from", str(facts))
    assert cp.returncode == 2
    assert "no check named 'rocblas.tensil'" in cp.stderr and "did you mean rocblas.tensile" in cp.stderr


def test_list_checks():
    cp = g906("doctor", "--list-checks", "--json")
    assert cp.returncode == 0
    ids = [c["id"] for c in json.loads(cp.stdout)["checks"]]
    for cid in ("gpu.detect", "access.kfd", "rocblas.tensile", "rccl.gfx906", "triton.gfx906", "recipe.memory",
                "engine.device"):
        assert cid in ids
    human = g906("doctor", "--list-checks")
    assert human.returncode == 0 and "recipe.memory" in human.stdout and "(with --recipe)" in human.stdout


def test_usage_errors_exit_2(tmp_path):
    junk = tmp_path / "junk.json"
    junk.write_text("{not json")
    cp = g906("doctor", "--from", str(junk))
    assert cp.returncode == 2 and "not valid JSON" in cp.stderr
    cp = g906("doctor", "--from", str(tmp_path / "missing.json"))
    assert cp.returncode == 2 and "no such facts file" in cp.stderr
    other = tmp_path / "other.json"
    other.write_text('{"schema": 99}')
    assert g906("doctor", "--from", str(other)).returncode == 2
    cp = g906("doctor", "--from", str(junk), "--root", str(tmp_path))
    assert cp.returncode == 2 and "cannot be combined" in cp.stderr
    cp = g906("doctor", "--root", str(tmp_path / "nope"))
    assert cp.returncode == 2 and "not a directory" in cp.stderr
    cp = g906("doctor", "--bogus-flag")
    assert cp.returncode == 2
    cp = g906("doctor", "--from", str(junk), "--json")
    assert cp.returncode == 2 and "error" in json.loads(cp.stdout)
    assert "Traceback" not in cp.stderr


def test_recipe_mode(tmp_path):
    recipe = tmp_path / "recipe.toml"
    recipe.write_text('[model]\nsource = "builtin:tiny-qwen35"\n[parallel]\ntensor_parallel_size = 2\n')
    facts = saved_facts(tmp_path, Machine(**HEALTHY), HEALTHY_PROBE)
    cp = g906("doctor", "--from", str(facts), "--recipe", str(recipe), "--json")
    doc = json.loads(cp.stdout)
    rows = {c["id"]: c for c in doc["checks"]}
    assert doc["recipe"] == str(recipe)
    assert rows["recipe.tensor_parallel"]["status"] == "fail"  # TP=2 with one GPU
    assert rows["recipe.model_files"]["status"] == "ok"
    assert cp.returncode == 1
    bad = tmp_path / "bad.toml"
    bad.write_text('[model]\nsorce = "x"\n')
    cp = g906("doctor", "--from", str(facts), "--recipe", str(bad))
    assert cp.returncode == 2 and "Traceback" not in cp.stderr


def test_root_reads_only_the_sysroot(tmp_path):
    root = build(tmp_path / "root", Machine(gpus=[("gfx906", 16 * GiB), ("gfx1100", 24 * GiB)], rocm="6.3.0"))
    cp = g906("doctor", "--root", str(root), "--json", "-v")
    doc = json.loads(cp.stdout)
    rows = {c["id"]: c for c in doc["checks"]}
    assert rows["gpu.detect"]["data"]["gpus"] == ["gfx906", "gfx1100"]
    assert rows["gpu.arch"]["status"] == "warn"
    assert rows["rocm.version"]["summary"].startswith("ROCm 6.3.0")
