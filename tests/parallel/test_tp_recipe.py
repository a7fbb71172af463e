"""Recipe validation of tensor_parallel_size against the model's files (HF config.json, GGUF
metadata): the resolver and the engine share one rule (g906.arch.tp), and the
resolver applies it without importing torch."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from g906.recipe.errors import RecipeError
from g906.recipe.load import load_recipe
from g906.recipe.resolve import resolve

REPO = Path(__file__).resolve().parents[2]


@pytest.fixture(scope="module")
def files(tmp_path_factory):
    from tests.engine.conftest import build_tiny_qwen35
    from tests.engine.gguf_writer import write_gguf

    d = tmp_path_factory.mktemp("tp-recipe")
    m = build_tiny_qwen35(seed=0)           # 4 heads, 2 KV heads, 2/4 linear-attention heads, I = 128
    m.save_pretrained(d / "hf")
    write_gguf(m, d / "m.gguf")
    return d


def recipe(d: Path, source: str, tp: int) -> Path:
    p = d / f"r-{source.replace('.', '_')}-{tp}.toml"
    p.write_text(f'[model]\nsource = "{source}"\n\n[parallel]\ntensor_parallel_size = {tp}\n')
    return p


@pytest.mark.parametrize("source", ["hf", "m.gguf"])
def test_resolver_applies_the_engine_rule(files, source):
    assert resolve(load_recipe(recipe(files, source, 2)), recipe(files, source, 2)).tensor_parallel_size == 2
    path = recipe(files, source, 4)
    with pytest.raises(RecipeError) as e:
        resolve(load_recipe(path), path)
    (issue,) = e.value.issues
    text = json.dumps(issue.to_json())
    assert issue.to_json()["key"] == "parallel.tensor_parallel_size"
    assert "tensor_parallel_size 4 does not divide the model's 2 KV heads (num_key_value_heads), " \
           "2 linear-attention key heads (linear_num_key_heads)" in text
    assert "allows: 1, 2" in text


def test_vllm_recipes_are_not_judged_by_the_embedded_rule(files):
    p = files / "vllm.toml"
    p.write_text('[model]\nsource = "hf"\n\n[parallel]\ntensor_parallel_size = 4\n\n[engine]\nkind = "vllm"\n')
    assert resolve(load_recipe(p), p).tensor_parallel_size == 4


def test_validate_names_the_counts_with_torch_broken(files, tmp_path):
    fake = tmp_path / "fake"
    (fake / "torch").mkdir(parents=True)
    (fake / "torch" / "__init__.py").write_text("raise ImportError('torch is broken (test)')\n")
    env = dict(os.environ, PYTHONPATH=str(fake))
    ok = subprocess.run([sys.executable, "-m", "g906", "validate", str(recipe(files, "m.gguf", 2)), "--json"],
                        cwd=REPO, env=env, capture_output=True, text=True, timeout=120)
    assert ok.returncode == 0, ok.stderr
    assert json.loads(ok.stdout)["ok"] is True
    bad = subprocess.run([sys.executable, "-m", "g906", "validate", str(recipe(files, "m.gguf", 4))],
                         cwd=REPO, env=env, capture_output=True, text=True, timeout=120)
    assert bad.returncode == 2
    assert "does not divide the model's 2 KV heads" in bad.stderr + bad.stdout
    assert "Traceback" not in bad.stderr
