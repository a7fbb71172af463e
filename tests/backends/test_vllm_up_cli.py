"""`g906 up` on the vLLM recipe, end to end through the CLI: a dry run works without vLLM (assuming
the newest one g906 knows, and saying so), uses the installed vLLM when there is one, and a real
start without vLLM fails with the clear error."""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from g906.backends.vllm_assumed import NEWEST_KNOWN_VERSION

ROOT = Path(__file__).resolve().parents[2]
RECIPE = "recipes/qwen3.5-vllm.toml"
NOTE = f"assuming vLLM {NEWEST_KNOWN_VERSION} (the newest g906 knows); install it to check against the real one"


def _up(*args: str, path: str, cache: Path) -> subprocess.CompletedProcess:
    env = {**os.environ, "PATH": path, "G906_CACHE_DIR": str(cache), "COLUMNS": "200"}
    return subprocess.run([sys.executable, "-m", "g906", "up", RECIPE, *args], cwd=ROOT, env=env,
                          capture_output=True, text=True, timeout=120)


@pytest.fixture
def bare_path(tmp_path) -> str:
    """A PATH with the system's programs but no vLLM."""
    path = os.pathsep.join([str(tmp_path / "empty-bin"), "/usr/bin", "/bin"])
    if shutil.which("vllm", path=path):
        pytest.skip("this machine has a vllm in /usr/bin or /bin")
    return path


def test_dry_run_without_vllm_prints_the_plan_and_the_assumed_command(bare_path, tmp_path):
    out = _up("--dry-run", path=bare_path, cache=tmp_path / "cache")
    assert out.returncode == 0, out.stdout + out.stderr
    assert "Traceback" not in out.stderr
    text = out.stdout
    assert text.splitlines()[0].startswith("Plan for ") and text.splitlines()[0].endswith(RECIPE)
    assert "source: Qwen/Qwen3.5-9B" in text and "kind: vllm" in text
    assert NOTE in text and f"# vLLM {NEWEST_KNOWN_VERSION} (assumed)" in text
    assert "vllm serve Qwen/Qwen3.5-9B \\" in text and "--skip-mm-profiling" in text
    assert "--limit-mm-per-prompt '{\"image\": 0, \"video\": 0}'" in text


def test_dry_run_json_without_vllm(bare_path, tmp_path):
    out = _up("--dry-run", "--json", path=bare_path, cache=tmp_path / "cache")
    assert out.returncode == 0, out.stdout + out.stderr
    doc = json.loads(out.stdout)
    assert doc["plan"]["model"]["source"] == "Qwen/Qwen3.5-9B" and doc["plan"]["engine"]["kind"] == "vllm"
    assert doc["engine"] == "vllm" and doc["vllm_version"] == NEWEST_KNOWN_VERSION
    assert doc["vllm_assumed"].endswith(NOTE)
    assert doc["argv"][:3] == ["vllm", "serve", "Qwen/Qwen3.5-9B"] and doc["env"] == {}


def test_real_up_without_vllm_fails_with_the_clear_error(bare_path, tmp_path):
    out = _up("--skip-doctor", path=bare_path, cache=tmp_path / "cache")
    assert out.returncode == 1, out.stdout + out.stderr
    assert "Error: the vLLM executable 'vllm' was not found on PATH" in out.stderr
    assert "Hint: install vLLM" in out.stderr and "Traceback" not in out.stderr
    assert "vllm serve" not in out.stdout


def test_dry_run_with_an_installed_vllm_uses_its_version(fake_vllm, tmp_path):
    fake_vllm.set(version="0.10.2+gfx906")
    out = _up("--dry-run", path=os.environ["PATH"], cache=tmp_path / "cache")
    assert out.returncode == 0, out.stdout + out.stderr
    assert "# vLLM 0.10.2+gfx906; OpenAI API on http://127.0.0.1:8000/v1" in out.stdout
    assert "assum" not in out.stdout
    assert "  --reasoning-parser qwen3_5 \\" in out.stdout       # the fork's parser, read from its --help
    assert fake_vllm.call_log().count("serve") == 0            # asked, never started
