"""`g906 up SOURCE` without a recipe: what SOURCE is, the synthesised recipe (--print-recipe), the
vLLM-named overrides, and Hugging Face Hub ids found in a cache laid out as huggingface_hub lays it
out (checked with huggingface_hub's own scanner)."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from g906.errors import G906Error, UsageError
from g906.recipe.hub import HubError, HubSpec, cached_model, choose_gguf, parse_hub_id, quant_tags
from g906.recipe.load import loads_recipe
from g906.recipe.source import classify

from .hf_cache import add_to_hf_cache


def g906(*args, env=None, cwd=None, timeout=120):
    return subprocess.run([sys.executable, "-m", "g906", *args], capture_output=True, text=True, cwd=cwd,
                          timeout=timeout, env={**os.environ, "OMP_NUM_THREADS": "1", **(env or {})})


@pytest.mark.parametrize("text, spec", [
    ("Qwen/Qwen3.5-9B", HubSpec("Qwen/Qwen3.5-9B")),
    ("unsloth/Qwen3.5-9B-GGUF:Q4_K_M", HubSpec("unsloth/Qwen3.5-9B-GGUF", quant="Q4_K_M")),
    ("unsloth/Qwen3.5-9B-GGUF:q8_0", HubSpec("unsloth/Qwen3.5-9B-GGUF", quant="Q8_0")),
    ("unsloth/Qwen3.5-9B-GGUF:UD-Q4_K_XL", HubSpec("unsloth/Qwen3.5-9B-GGUF", quant="UD-Q4_K_XL")),
    ("unsloth/Qwen3.5-9B-GGUF:IQ4_XS", HubSpec("unsloth/Qwen3.5-9B-GGUF", quant="IQ4_XS")),
    ("org/model:BF16", HubSpec("org/model", quant="BF16")),
    ("org/model:v1.2", HubSpec("org/model", revision="v1.2")),
    ("org/model:main", HubSpec("org/model", revision="main")),
    ("org/model:" + "a" * 40, HubSpec("org/model", revision="a" * 40)),
    ("model.gguf", None), ("dir/model.gguf", None), ("recipes/demo.toml", None), ("a/b/c", None),
    ("org/model:", None), ("../x", None), ("builtin:tiny-qwen35", None), ("org/", None),
])
def test_parse_hub_id(text, spec):
    assert parse_hub_id(text) == spec


def test_classify(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    (tmp_path / "m.gguf").write_bytes(b"GGUF" + b"\0" * 20)
    (tmp_path / "weird-name.bin").write_bytes(b"GGUF" + b"\0" * 20)      # the magic decides, not the name
    (tmp_path / "r.toml").write_text('[model]\nsource = "builtin:tiny-qwen35"\n')
    (tmp_path / "hf").mkdir()
    (tmp_path / "hf" / "config.json").write_text("{}")
    (tmp_path / "empty").mkdir()
    assert classify("m.gguf").kind == "gguf" and classify("weird-name.bin").kind == "gguf"
    assert classify("r.toml").kind == "recipe" and classify("hf").kind == "hf"
    assert classify("builtin:tiny-qwen35").kind == "builtin"
    assert classify("Qwen/Qwen3.5-9B").kind == "hub"
    assert classify("nosuch.toml").kind == "recipe"          # load_recipe says "no such file"
    with pytest.raises(UsageError, match="no such file"):
        classify("nosuch.gguf")
    with pytest.raises(UsageError, match="without config.json"):
        classify("empty")
    os.makedirs("org/name")                                   # an existing path wins over a Hub id
    (tmp_path / "org" / "name" / "config.json").write_text("{}")
    assert classify("org/name").kind == "hf"


def test_print_recipe_is_a_valid_recipe_with_the_overrides(tmp_path):
    out = g906("up", "builtin:tiny-qwen35", "--print-recipe", "--port", "9123", "--served-model-name", "foo",
               "--max-model-len", "8k", "--allowed-origins", '["http://ui.example"]', "--log-level", "WARNING",
               "--access-log", "--gpu-memory-utilization", "0.5", "--tensor-parallel-size", "1",
               "--max-num-seqs", "3")
    assert out.returncode == 0, out.stderr
    r = loads_recipe(out.stdout)
    assert r.model.source == "builtin:tiny-qwen35" and r.model.name == "foo"
    assert r.server.port == 9123 and r.server.allowed_origins == ["http://ui.example"]
    assert r.server.log_level == "warning" and r.server.access_log is True
    assert r.limits.max_model_len == 8192 and r.limits.gpu_memory_utilization == 0.5
    assert r.limits.max_num_seqs == 3 and r.parallel.tensor_parallel_size == 1


def test_print_recipe_of_a_recipe_keeps_its_keys_and_applies_env_vars(tmp_path):
    rec = tmp_path / "r.toml"
    rec.write_text('[model]\nsource = "builtin:tiny-qwen35"\nname = "kept"\n[limits]\nmax_num_seqs = 5\n'
                   '[server]\nport = 8100\n')
    out = g906("up", str(rec), "--print-recipe", "--allowed-origins", "http://a.example, http://b.example",
               env={"G906_PORT": "8200", "G906_HOST": "0.0.0.0"})
    assert out.returncode == 0, out.stderr
    r = loads_recipe(out.stdout)
    assert (r.model.name, r.limits.max_num_seqs) == ("kept", 5)
    assert (r.server.port, r.server.host) == (8200, "0.0.0.0")
    assert r.server.allowed_origins == ["http://a.example", "http://b.example"]
    out = g906("up", str(rec), "--print-recipe", "--port", "8300", env={"G906_PORT": "8200"})
    assert loads_recipe(out.stdout).server.port == 8300      # the flag wins over the variable


@pytest.mark.parametrize("args, names", [
    (["--max-model-len", "3"], ["--max-model-len", "at least 16"]),
    (["--max-model-len", "lots"], ["--max-model-len"]),
    (["--gpu-memory-utilization", "1.5"], ["--gpu-memory-utilization"]),
    (["--log-level", "loud"], ["--log-level"]),
    (["--allowed-origins", "[1, 2]"], ["--allowed-origins"]),
    (["--allowed-origins", "[oops"], ["--allowed-origins", "JSON"]),
    (["--api-key", " "], ["--api-key"]),
])
def test_bad_overrides_are_messages_naming_the_flag(args, names):
    out = g906("up", "builtin:tiny-qwen35", "--dry-run", *args)
    assert out.returncode == 2, out.stdout + out.stderr
    assert "Traceback" not in out.stderr
    for n in names:
        assert n in out.stderr


def test_dry_run_of_a_model_without_recipe(tmp_path):
    out = g906("up", "builtin:tiny-qwen35", "--dry-run", "--json", "--served-model-name", "foo",
               "--max-model-len", "512", "--api-key", "k", "--allowed-origins", "*")
    assert out.returncode == 0, out.stderr
    plan = json.loads(out.stdout)
    assert plan["model"]["served_name"] == "foo" and plan["memory"]["max_model_len"] == 512
    assert plan["server"]["api_key_env"] == "G906_API_KEY" and plan["recipe"] is None


# -- the Hugging Face cache -------------------------------------------------------------------

GGUF_FILES = {
    "Tiny-Q4_K_M.gguf": b"GGUF-q4km",
    "Tiny-Q8_0.gguf": b"GGUF-q80",
    "mmproj-F16.gguf": b"GGUF-mmproj",
    "Q6_K/Tiny-Q6_K-00002-of-00002.gguf": b"GGUF-q6k-2",
    "Q6_K/Tiny-Q6_K-00001-of-00002.gguf": b"GGUF-q6k-1",
    "README.md": b"# tiny\n",
}


def test_choose_gguf():
    files = list(GGUF_FILES)
    assert quant_tags(files) == ["Q4_K_M", "Q6_K", "Q8_0"]
    assert choose_gguf(HubSpec("o/n", quant="Q8_0"), files) == ["Tiny-Q8_0.gguf"]
    assert choose_gguf(HubSpec("o/n"), files) == ["Tiny-Q4_K_M.gguf"]        # llama.cpp's default
    assert choose_gguf(HubSpec("o/n", quant="Q6_K"), files) == [
        "Q6_K/Tiny-Q6_K-00001-of-00002.gguf", "Q6_K/Tiny-Q6_K-00002-of-00002.gguf"]
    with pytest.raises(HubError) as e:
        choose_gguf(HubSpec("o/n", quant="Q2_K"), files)
    assert "Q2_K" in e.value.message and "Q4_K_M, Q6_K, Q8_0" in e.value.hint
    with pytest.raises(HubError, match="several GGUF files"):
        choose_gguf(HubSpec("o/n"), ["a-Q8_0.gguf", "a-Q5_K_M.gguf"])
    assert choose_gguf(HubSpec("o/n"), ["only-Q8_0.gguf", "mmproj-x.gguf"]) == ["only-Q8_0.gguf"]


@pytest.fixture()
def hf_cache(tmp_path, monkeypatch):
    from huggingface_hub import constants

    cache = tmp_path / "hub"
    cache.mkdir()
    monkeypatch.setattr(constants, "HF_HUB_CACHE", str(cache))
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    return cache


def test_cached_models_are_found_offline(hf_cache):
    from huggingface_hub import scan_cache_dir

    snap = add_to_hf_cache(hf_cache, "org/tiny-GGUF", GGUF_FILES)
    hf = add_to_hf_cache(hf_cache, "org/tiny", {"config.json": b"{}", "model.safetensors": b"x" * 16,
                                                "tokenizer.json": b"{}"})
    v2 = add_to_hf_cache(hf_cache, "org/tiny", {"config.json": b'{"v": 2}', "model.safetensors": b"y" * 16},
                         branch="v2")
    info = scan_cache_dir(hf_cache)                           # huggingface_hub agrees with the layout
    assert not info.warnings, info.warnings
    assert {r.repo_id for r in info.repos} == {"org/tiny-GGUF", "org/tiny"}
    assert cached_model(HubSpec("org/tiny-GGUF", quant="Q8_0")) == snap / "Tiny-Q8_0.gguf"
    assert cached_model(HubSpec("org/tiny-GGUF")) == snap / "Tiny-Q4_K_M.gguf"
    assert cached_model(HubSpec("org/tiny-GGUF", quant="Q6_K")) == snap / "Q6_K/Tiny-Q6_K-00001-of-00002.gguf"
    assert cached_model(HubSpec("org/tiny")) == hf
    assert cached_model(HubSpec("org/tiny", revision="v2")) == v2
    assert cached_model(HubSpec("org/tiny", revision=v2.name)) == v2      # a commit
    assert cached_model(HubSpec("org/absent")) is None
    assert cached_model(HubSpec("org/tiny", quant="Q4_K_M")) is None       # (online: the Hub's list says why)


def test_an_incomplete_split_set_is_not_found(hf_cache):
    files = {k: v for k, v in GGUF_FILES.items() if "00002-of" not in k}
    add_to_hf_cache(hf_cache, "org/part", files)
    assert cached_model(HubSpec("org/part", quant="Q6_K")) is None


def test_fetch_offline_without_the_files_is_a_message(tmp_path):
    env = {"HF_HUB_OFFLINE": "1", "HF_HUB_CACHE": str(tmp_path / "hub"), "HF_HOME": str(tmp_path / "hf")}
    for cmd in (["up", "org/absent"], ["pull", "org/absent:Q4_K_M"]):
        out = g906(*cmd, "--skip-doctor" if cmd[0] == "up" else "--json", env=env)
        assert out.returncode == 1, out.stderr
        assert "not in the Hugging Face cache" in out.stderr + out.stdout and "Traceback" not in out.stderr
        assert "g906 pull" in out.stderr + out.stdout


def test_pull_finds_the_cached_model(tmp_path):
    cache = tmp_path / "hub"
    snap = add_to_hf_cache(cache, "org/tiny-GGUF", GGUF_FILES)
    out = g906("pull", "org/tiny-GGUF:q8_0", "--json", env={"HF_HUB_OFFLINE": "1", "HF_HUB_CACHE": str(cache)})
    assert out.returncode == 0, out.stderr
    assert json.loads(out.stdout) == {"model": "org/tiny-GGUF:Q8_0", "path": str(snap / "Tiny-Q8_0.gguf")}


def test_a_recipe_naming_a_hub_id_resolves_from_the_cache(hf_cache, tmp_path):
    from g906.recipe.errors import RecipeError
    from g906.recipe.resolve import resolve

    rec = tmp_path / "r.toml"
    rec.write_text('[model]\nsource = "org/absent"\n')
    with pytest.raises(RecipeError) as e:
        resolve(loads_recipe(rec.read_text(), file=str(rec), path=rec), rec)
    text = "\n".join(e.value.details) + str(e.value)
    assert "not in the Hugging Face cache" in text and "g906 pull org/absent" in text
    assert isinstance(e.value, G906Error)
