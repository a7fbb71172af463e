"""`g906 up`'s pipeline around the engine: doctor preflight, the RCCL step for TP>1 on gfx906,
and the vLLM branch — driven through the real CLI with recorded doctor facts of a gfx906 box."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

from g906.doctor import collect_facts
from tests.doctor.sysroot import GiB, Machine, alice, amd_devices, build, torch_probe
from tests.rccl.helpers import LibFactory
from tests.recipe.helpers import write_gguf


def gfx906_facts(tmp_path: Path, *, rccl_targets: list[str]) -> Path:
    """Doctor facts of a 2×MI50 ROCm 7.2 box whose torch bundles the given RCCL targets."""
    machine = Machine(gpus=[("gfx906", 32 * GiB)] * 2, rocm="7.2.0", rocblas_archs=["gfx906", "gfx942"],
                      rccl_targets=rccl_targets, rccl_version="2.27.7")
    probe = torch_probe("2.11.0+rocm7.2", "7.2.26015-abc", devices=amd_devices(("gfx906", 32 * GiB), ("gfx906", 32 * GiB)),
                        triton={"found": True, "distribution": "triton", "version": "3.6.0+gfx906",
                                "backends": ["amd"], "mentions_gfx906": True})
    facts = collect_facts(build(tmp_path / "root", machine), probe=probe, env={}, identity=alice(), run_tools=False)
    path = tmp_path / "facts.json"
    facts.save(path)
    return path


def tp2_recipe(tmp_path: Path, *, rccl: str | None) -> Path:
    (tmp_path / "models").mkdir(exist_ok=True)
    model = write_gguf(tmp_path / "models" / "Qwen3.5-27B-Q6_K.gguf")
    lines = ["[model]", f'source = "{model}"', "[parallel]", "tensor_parallel_size = 2", "devices = [0, 1]"]
    if rccl:
        lines.append(f'rccl = "{rccl}"')
    path = tmp_path / "tp2.toml"
    path.write_text("\n".join(lines) + "\n")
    return path


def g906(*args: str) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "g906", *args], capture_output=True, text=True, timeout=120)


def test_dry_run_tp2_without_gfx906_rccl_and_no_package_shows_the_stop(tmp_path):
    facts = gfx906_facts(tmp_path, rccl_targets=["gfx908", "gfx90a", "gfx942"])
    out = g906("up", str(tp2_recipe(tmp_path, rccl=None)), "--dry-run", "--json", "--facts", str(facts))
    assert out.returncode == 0, out.stderr
    plan = json.loads(out.stdout)
    assert plan["rccl"]["action"] == "stop"
    assert "g906 rccl install" in plan["rccl"]["command"]
    assert "Traceback" not in out.stderr


def test_dry_run_tp2_with_named_package_shows_the_install_step(tmp_path):
    facts = gfx906_facts(tmp_path, rccl_targets=["gfx908", "gfx90a"])
    (tmp_path / "libs").mkdir()
    package = LibFactory(tmp_path / "libs")("g906", archs=("gfx906",))   # a real ELF librccl with gfx906 code
    out = g906("up", str(tp2_recipe(tmp_path, rccl=str(package))), "--dry-run", "--facts", str(facts))
    assert out.returncode == 0, out.stderr
    assert "RCCL: will install" in out.stdout
    assert str(package) in out.stdout


def test_up_tp2_without_package_stops_before_loading_with_the_command(tmp_path):
    facts = gfx906_facts(tmp_path, rccl_targets=["gfx908"])
    out = g906("up", str(tp2_recipe(tmp_path, rccl=None)), "--facts", str(facts))
    assert out.returncode == 1
    assert "rccl.gfx906" in out.stderr            # the doctor's blocking finding, with its fix
    assert "g906 rccl install" in out.stderr
    assert "Traceback" not in out.stderr


def test_up_tp2_with_gfx906_rccl_passes_the_rccl_step_in_dry_run(tmp_path):
    facts = gfx906_facts(tmp_path, rccl_targets=["gfx906", "gfx90a"])
    out = g906("up", str(tp2_recipe(tmp_path, rccl=None)), "--dry-run", "--json", "--facts", str(facts))
    assert out.returncode == 0, out.stderr
    assert json.loads(out.stdout)["rccl"]["action"] == "ok"


def test_bad_facts_file_is_a_usage_error(tmp_path):
    bad = tmp_path / "facts.json"
    bad.write_text("{not json")
    out = g906("up", str(tp2_recipe(tmp_path, rccl=None)), "--dry-run", "--facts", str(bad))
    assert out.returncode == 2
    assert "facts" in out.stderr and "Traceback" not in out.stderr


@pytest.mark.parametrize("kind", ["vllm"])
def test_vllm_branch_dry_run_prints_the_command(tmp_path, kind, monkeypatch):
    # a minimal fake vllm on PATH that answers --version and serve --help
    bindir = tmp_path / "bin"
    bindir.mkdir()
    fake = bindir / "vllm"
    fake.write_text(
        "#!/usr/bin/env python3\nimport sys\n"
        "if sys.argv[1:] == ['--version']: print('0.11.0'); sys.exit(0)\n"
        "print('usage: vllm serve [model_tag] [options]\\n\\noptions:\\n'\n"
        "      '  --host HOST\\n  --port PORT\\n  --served-model-name SERVED_MODEL_NAME\\n'\n"
        "      '  --tensor-parallel-size TENSOR_PARALLEL_SIZE\\n  --max-model-len MAX_MODEL_LEN\\n'\n"
        "      '  --max-num-seqs MAX_NUM_SEQS\\n  --gpu-memory-utilization GPU_MEMORY_UTILIZATION\\n'\n"
        "      '  --dtype {auto,half,float16,bfloat16,float,float32}\\n  --enforce-eager\\n'\n"
        "      '  --limit-mm-per-prompt LIMIT_MM_PER_PROMPT\\n  --max-num-batched-tokens MAX_NUM_BATCHED_TOKENS\\n'\n"
        "      '  --reasoning-parser {deepseek_r1,qwen3}\\n')\n")
    fake.chmod(0o755)
    (tmp_path / "m").mkdir()
    model = write_gguf(tmp_path / "m" / "Qwen3.5-0.8B-F16.gguf")
    recipe = tmp_path / "v.toml"
    recipe.write_text(f'[model]\nsource = "{model}"\n[engine]\nkind = "{kind}"\n')
    env_path = f"{bindir}:{__import__('os').environ['PATH']}"
    monkeypatch.setenv("PATH", env_path)
    monkeypatch.setenv("G906_CACHE_DIR", str(tmp_path / "cache"))
    out = g906("up", str(recipe), "--dry-run")
    assert out.returncode == 0, out.stderr
    assert "vllm serve" in out.stdout and str(model) in out.stdout
