"""`g906 validate` on an engine.kind = "vllm" recipe checks it against the installed vLLM."""

from __future__ import annotations

import json
import subprocess
import sys

from tests.recipe.helpers import write_gguf


def _recipe(tmp_path, extra: str = "") -> str:
    (tmp_path / "m").mkdir()
    model = write_gguf(tmp_path / "m" / "Qwen3.5-9B-Q4_K_M.gguf")
    path = tmp_path / "v.toml"
    path.write_text(f'[model]\nsource = "{model}"\n[engine]\nkind = "vllm"\n{extra}')
    return str(path)


def _validate(*args):
    return subprocess.run([sys.executable, "-m", "g906", "validate", *args], capture_output=True, text=True, timeout=60)


def test_supported_recipe_validates(tmp_path, fake_vllm):
    out = _validate(_recipe(tmp_path), "--json")
    assert out.returncode == 0, out.stderr
    assert json.loads(out.stdout)["ok"] is True


def test_flag_the_installed_vllm_lacks_fails_validation_with_the_reason(tmp_path, fake_vllm):
    fake_vllm.set(flavor="legacy", version="0.8.5")
    out = _validate(_recipe(tmp_path, "[engine.vllm]\nskip_mm_profiling = true\n"))
    assert out.returncode == 2
    assert "--skip-mm-profiling" in out.stderr and "vLLM 0.8.5" in out.stderr
    assert "Traceback" not in out.stderr


def test_without_vllm_installed_it_is_a_warning(tmp_path, monkeypatch):
    monkeypatch.setenv("PATH", "/usr/bin:/bin")
    monkeypatch.setenv("G906_CACHE_DIR", str(tmp_path / "cache"))
    out = _validate(_recipe(tmp_path))
    assert out.returncode == 0
    assert "vLLM not checked" in out.stderr
