"""Every recipe in recipes/ validates (the CI acceptance), through the real CLI."""

from __future__ import annotations

import json

import pytest
from typer.testing import CliRunner

from g906.cli.app import app

from .helpers import RECIPES, REPO, run_g906


def test_there_is_one_recipe_per_deployment():
    names = {p.name for p in RECIPES}
    assert {"demo.toml", "qwen3.5-0.8b-f16.toml", "qwen3.5-9b-f16.toml", "qwen3.5-27b-gguf-tp2.toml",
            "qwen3.5-multimodal-gguf.toml", "qwen3.5-vllm.toml", "qwen3.5-9b-gptq-int4.toml",
            "qwen3.5-35b-a3b-gguf.toml", "qwen3.5-35b-a3b-gguf-tp2.toml", "qwen3.5-35b-a3b-gptq-int4.toml"} <= names


@pytest.mark.parametrize("recipe", RECIPES, ids=lambda p: p.name)
def test_recipe_validates(recipe):
    result = CliRunner().invoke(app, ["validate", str(recipe), "--json"])
    assert result.exit_code == 0, result.output
    doc = json.loads(result.stdout)
    assert doc["ok"] is True
    assert set(doc) == {"ok", "file", "recipe", "plan", "warnings"}
    assert doc["recipe"]["model"]["source"]
    # defaults are filled in
    assert doc["recipe"]["server"]["host"] == "127.0.0.1"
    human = CliRunner().invoke(app, ["validate", str(recipe)])
    assert human.exit_code == 0, human.output
    assert "is a valid recipe" in human.stdout
    if recipe.name not in ("demo.toml", "qwen3.5-vllm.toml"):  # these name no local files
        assert "warning: model not found" in human.stderr


def test_deployment_details():
    def plan(name):
        r = CliRunner().invoke(app, ["validate", str(REPO / "recipes" / name), "--json"])
        return json.loads(r.stdout)["plan"]

    p = plan("qwen3.5-0.8b-f16.toml")
    assert (p["max_model_len"], p["reasoning_parser"], p["port"], p["dtype"]) == (8192, "qwen3", 8000, "float16")
    assert p["mm_limits"]["image"]["count"] == 0 and p["tensor_parallel_size"] == 1
    assert plan("qwen3.5-9b-f16.toml")["gpu_memory_utilization"] == 0.85
    p = plan("qwen3.5-27b-gguf-tp2.toml")
    assert (p["tensor_parallel_size"], p["devices"], p["max_model_len"], p["model_format"]) == (2, [0, 1], 32768, "gguf")
    assert "UD-Q6_K_XL" in p["model_source"]
    p = plan("qwen3.5-multimodal-gguf.toml")
    assert p["mm_limits"]["image"] == {"count": 1, "width": 512, "height": 512}
    assert plan("qwen3.5-vllm.toml")["engine_kind"] == "vllm"
    p = plan("qwen3.5-35b-a3b-gguf.toml")
    assert "UD-Q4_K_XL" in p["model_source"] and p["tensor_parallel_size"] == 1 and p["engine_kind"] == "embedded"
    assert p["mm_limits"]["image"]["count"] == 1
    p = plan("qwen3.5-35b-a3b-gguf-tp2.toml")
    assert (p["tensor_parallel_size"], p["devices"], p["max_model_len"]) == (2, [0, 1], 131072)
    p = plan("qwen3.5-35b-a3b-gptq-int4.toml")
    assert (p["tensor_parallel_size"], p["engine_kind"], p["dtype"]) == (1, "embedded", "float16")
    assert "GPTQ-Int4" in p["model_source"]
    p = plan("demo.toml")
    assert (p["model_format"], p["served_model_name"], p["warnings"]) == ("builtin", "tiny-qwen35", [])


def test_validate_in_a_real_process():
    proc = run_g906("validate", "recipes/demo.toml", "--json")
    assert proc.returncode == 0, proc.stderr
    assert json.loads(proc.stdout)["ok"] is True


def test_missing_model_files_are_errors_with_check_files():
    proc = run_g906("validate", "recipes/qwen3.5-27b-gguf-tp2.toml", "--check-files", "--json")
    assert proc.returncode == 2
    errors = json.loads(proc.stdout)["errors"]
    assert errors[0]["key"] == "model.source" and errors[0]["line"] == 5
    assert "model not found" in errors[0]["message"]
    assert "Traceback" not in proc.stderr


def test_validate_works_with_torch_broken(tmp_path):
    """validate is what users run when their stack is broken: a torch that raises on import
    must not matter (and resolve must not import it)."""
    fake = tmp_path / "fake"
    (fake / "torch").mkdir(parents=True)
    (fake / "torch" / "__init__.py").write_text("raise ImportError('torch is broken (test)')\n")
    (fake / "triton").mkdir()
    (fake / "triton" / "__init__.py").write_text("raise ImportError('triton is broken (test)')\n")
    import os
    import subprocess
    import sys

    env = dict(os.environ, PYTHONPATH=str(fake))
    for recipe in ("recipes/demo.toml", "recipes/qwen3.5-27b-gguf-tp2.toml"):
        proc = subprocess.run([sys.executable, "-m", "g906", "validate", recipe, "--json"], cwd=REPO, env=env,
                              capture_output=True, text=True, timeout=120)
        assert proc.returncode == 0, proc.stderr
        assert json.loads(proc.stdout)["ok"] is True
