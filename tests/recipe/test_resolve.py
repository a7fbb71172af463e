"""resolve() against real files written here: GGUFs (single, split, corrupt, mmproj), Hugging
Face directories, builtin models, relative and ~ paths."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from g906.recipe.errors import RecipeError
from g906.recipe.load import load_recipe
from g906.recipe.resolve import resolve

from .helpers import write_gguf, write_hf_dir


def plan_of(tmp_path: Path, body: str, *, check_files: bool = True, name: str = "r.toml"):
    path = tmp_path / name
    path.write_text(body)
    return resolve(load_recipe(path), path, check_files=check_files)


def errors_of(tmp_path: Path, body: str, **kw) -> list[dict]:
    with pytest.raises(RecipeError) as info:
        plan_of(tmp_path, body, **kw)
    assert info.value.exit_code == 2
    return [i.to_json() for i in info.value.issues]


# -- GGUF -------------------------------------------------------------------------------------

def test_gguf_single_file(tmp_path):
    (tmp_path / "models").mkdir()
    write_gguf(tmp_path / "models" / "Tiny-Q8_0.gguf")
    plan = plan_of(tmp_path, '[model]\nsource = "models/Tiny-Q8_0.gguf"\n[limits]\nmax_model_len = "2k"\n')
    assert plan.model_format == "gguf" and plan.quantization == "gguf"
    assert plan.model_path == tmp_path / "models" / "Tiny-Q8_0.gguf"
    assert plan.model_files == [plan.model_path]
    assert plan.architecture == "qwen35"
    assert plan.gguf_tensor_types == {"F16": 1, "F32": 1, "Q8_0": 1}
    facts = plan.model_facts
    assert (facts["num_hidden_layers"], facts["hidden_size"], facts["num_attention_heads"],
            facts["num_key_value_heads"], facts["context_length"]) == (4, 64, 4, 2, 4096)
    assert facts["weights_bytes"] == plan.model_path.stat().st_size
    assert plan.served_model_name == "Tiny-Q8_0"
    assert plan.max_model_len == 2048 and plan.warnings == [] and plan.missing_files == []
    assert plan.mmproj_path is None and not plan.images_enabled
    json.dumps(plan.to_json())


def test_split_gguf_set(tmp_path):
    write_gguf(tmp_path / "big.gguf", split_max_tensors=2)
    shards = sorted(tmp_path.glob("big-*.gguf"))
    assert [s.name for s in shards] == ["big-00001-of-00002.gguf", "big-00002-of-00002.gguf"]
    plan = plan_of(tmp_path, f'[model]\nsource = "{shards[0].name}"\n')
    assert plan.model_files == shards
    assert plan.gguf_tensor_types == {"F16": 1, "F32": 1, "Q8_0": 1}  # summed over the shards
    assert plan.served_model_name == "big" and plan.model_facts["split_count"] == 2

    errs = errors_of(tmp_path, f'[model]\nsource = "{shards[1].name}"\n')
    assert "must name the first shard" in errs[0]["message"] and errs[0]["line"] == 2
    assert shards[0].name in errs[0]["help"]

    shards[1].unlink()
    errs = errors_of(tmp_path, f'[model]\nsource = "{shards[0].name}"\n')
    assert "big-00002-of-00002.gguf" in errs[0]["message"] and errs[0]["key"] == "model.source"
    plan = plan_of(tmp_path, f'[model]\nsource = "{shards[0].name}"\n', check_files=False)
    assert plan.missing_files == [shards[1]] and "warning" in plan.warnings[0]


@pytest.mark.parametrize("content, says", [
    (b"", "empty file"),
    (b"PK\x03\x04zipfile", "not a GGUF file"),
    (b"GGUF", "damaged or truncated"),
    (b"GGUF\x03\x00\x00\x00" + b"\xff" * 16 + b"\x00" * 8, "damaged or truncated"),
])
def test_corrupt_gguf(tmp_path, content, says):
    (tmp_path / "bad.gguf").write_bytes(content)
    errs = errors_of(tmp_path, '[model]\nsource = "bad.gguf"\n')
    assert says in errs[0]["message"] and errs[0]["line"] == 2


def test_truncated_real_gguf(tmp_path):
    good = write_gguf(tmp_path / "m.gguf")
    data = good.read_bytes()
    good.write_bytes(data[: len(data) // 3])
    errs = errors_of(tmp_path, '[model]\nsource = "m.gguf"\n')
    assert "damaged or truncated" in errs[0]["message"]


def test_mmproj_auto_and_images(tmp_path):
    write_gguf(tmp_path / "m.gguf")
    write_gguf(tmp_path / "mmproj-F16.gguf", arch="clip", quant=False)
    on = '[model]\nsource = "m.gguf"\n[multimodal]\nimage = { count = 1, width = 512, height = 512 }\n'
    plan = plan_of(tmp_path, on)
    assert plan.mmproj_path == tmp_path / "mmproj-F16.gguf"
    assert plan.images_enabled and plan.mmproj_path in plan.model_files
    assert plan.model_facts["multimodal"] is True

    write_gguf(tmp_path / "mmproj-BF16.gguf", arch="clip", quant=False)
    errs = errors_of(tmp_path, on)
    assert "several projectors" in errs[0]["message"] and errs[0]["key"] == "multimodal.image"
    assert errs[0]["line"] == 4
    off = plan_of(tmp_path, '[model]\nsource = "m.gguf"\n')  # ambiguous is fine while images are off
    assert off.mmproj_path is None and not off.images_enabled
    plan = plan_of(tmp_path, on.replace('source = "m.gguf"', 'source = "m.gguf"\nmmproj = "mmproj-BF16.gguf"'))
    assert plan.mmproj_path == tmp_path / "mmproj-BF16.gguf"


def test_images_without_a_projector(tmp_path):
    write_gguf(tmp_path / "m.gguf")
    errs = errors_of(tmp_path, '[model]\nsource = "m.gguf"\n[multimodal]\nimage = 1\n')
    assert "no mmproj*.gguf" in errs[0]["message"] and errs[0]["line"] == 4


def test_mmproj_that_is_a_language_model(tmp_path):
    write_gguf(tmp_path / "m.gguf")
    write_gguf(tmp_path / "other.gguf")
    errs = errors_of(tmp_path, '[model]\nsource = "m.gguf"\nmmproj = "other.gguf"\n[multimodal]\nimage = 1\n')
    assert "not a vision projector" in errs[0]["message"] and errs[0]["line"] == 3


def test_projector_given_as_the_model(tmp_path):
    write_gguf(tmp_path / "mmproj-F16.gguf", arch="clip", quant=False)
    errs = errors_of(tmp_path, '[model]\nsource = "mmproj-F16.gguf"\n')
    assert "is a vision projector" in errs[0]["message"]


def test_architecture_the_embedded_engine_does_not_run(tmp_path):
    write_gguf(tmp_path / "llama.gguf", arch="llama")
    errs = errors_of(tmp_path, '[model]\nsource = "llama.gguf"\n')
    assert "does not run 'llama' models" in errs[0]["message"] and "vllm" in errs[0]["help"]
    plan = plan_of(tmp_path, '[model]\nsource = "llama.gguf"\n[engine]\nkind = "vllm"\n')
    assert plan.architecture == "llama" and plan.engine_kind == "vllm"


def test_context_length_warning(tmp_path):
    write_gguf(tmp_path / "m.gguf", context_length=4096)
    plan = plan_of(tmp_path, '[model]\nsource = "m.gguf"\n[limits]\nmax_model_len = "8k"\n')
    assert len(plan.warnings) == 1
    assert "r.toml:4:17: warning:" in plan.warnings[0] and "4096" in plan.warnings[0]


# -- Hugging Face directories -----------------------------------------------------------------

def test_hf_dir(tmp_path):
    d = write_hf_dir(tmp_path / "Qwen3.5-Tiny")
    plan = plan_of(tmp_path, '[model]\nsource = "Qwen3.5-Tiny"\n')
    assert plan.model_format == "hf" and plan.model_path == d and plan.quantization == "none"
    assert plan.architecture == "Qwen3_5ForConditionalGeneration"
    assert d / "model.safetensors" in plan.model_files and d / "config.json" in plan.model_files
    assert d / "tokenizer.json" in plan.model_files
    assert plan.model_facts["num_hidden_layers"] == 4 and plan.model_facts["context_length"] == 8192
    assert plan.served_model_name == "Qwen3.5-Tiny" and plan.gguf_tensor_types == {}


@pytest.mark.parametrize("quant_method, recipe_q, ok, plan_q", [
    ("gptq", "auto", True, "gptq"),
    ("awq", "awq", True, "awq"),
    ("gptq", "awq", False, None),
    (None, "gptq", False, None),
    ("gptq", "none", False, None),
    (None, "gguf", False, None),
    ("fp8", "auto", False, None),
])
def test_hf_quantization(tmp_path, quant_method, recipe_q, ok, plan_q):
    write_hf_dir(tmp_path / "m", quant_method=quant_method)
    body = f'[model]\nsource = "m"\nquantization = "{recipe_q}"\n'
    if ok:
        assert plan_of(tmp_path, body).quantization == plan_q
    else:
        errs = errors_of(tmp_path, body)
        assert errs[0]["line"] in (2, 3)


def test_hf_images_need_a_vision_tower(tmp_path):
    write_hf_dir(tmp_path / "text")
    (tmp_path / "text" / "config.json").write_text(json.dumps({"architectures": ["Qwen3_5ForCausalLM"]}))
    errs = errors_of(tmp_path, '[model]\nsource = "text"\n[multimodal]\nimage = 1\n')
    assert "no vision tower" in errs[0]["message"] and errs[0]["line"] == 4
    write_hf_dir(tmp_path / "vl", vision=True)
    assert plan_of(tmp_path, '[model]\nsource = "vl"\n[multimodal]\nimage = 1\n').images_enabled


@pytest.mark.parametrize("damage, says", [
    (lambda d: (d / "config.json").unlink(), "has no config.json"),
    (lambda d: (d / "config.json").write_text('{"architectures": [,]}'), "config.json:1:"),
    (lambda d: (d / "config.json").write_text("[1, 2]"), "does not hold a JSON object"),
    (lambda d: (d / "model.safetensors").unlink(), "no *.safetensors"),
    (lambda d: (d / "model.safetensors").write_bytes(b"\xff" * 20), "not a safetensors file"),
    (lambda d: (d / "model.safetensors.index.json").write_text(
        json.dumps({"weight_map": {"a": "model-00001-of-00002.safetensors"}})), "missing 1 of 1 weight files"),
])
def test_broken_hf_dirs(tmp_path, damage, says):
    d = write_hf_dir(tmp_path / "m")
    damage(d)
    errs = errors_of(tmp_path, '[model]\nsource = "m"\n')
    assert says in errs[0]["message"] and errs[0]["key"] == "model.source"


def test_hf_dir_with_gguf_mmproj_setting(tmp_path):
    write_hf_dir(tmp_path / "m", vision=True)
    errs = errors_of(tmp_path, '[model]\nsource = "m"\nmmproj = "x.gguf"\n')
    assert "applies to GGUF models" in errs[0]["message"] and errs[0]["line"] == 3


def test_hf_dir_without_tokenizer_is_a_warning(tmp_path):
    write_hf_dir(tmp_path / "m", tokenizer=False)
    plan = plan_of(tmp_path, '[model]\nsource = "m"\n')
    assert any("tokenizer.json" in w for w in plan.warnings)


# -- paths, builtin, missing files ------------------------------------------------------------

def test_paths_are_relative_to_the_recipe_and_expand_home(tmp_path, monkeypatch):
    write_gguf(tmp_path / "m.gguf")
    (tmp_path / "t.jinja").write_text("{{ messages }}")
    sub = tmp_path / "recipes"
    sub.mkdir()
    plan = plan_of(sub, '[model]\nsource = "../m.gguf"\nchat_template = "../t.jinja"\n')
    assert plan.model_path == tmp_path / "m.gguf"
    assert plan.chat_template_path == tmp_path / "t.jinja" and plan.chat_template_path in plan.model_files
    monkeypatch.setenv("HOME", str(tmp_path))
    assert plan_of(sub, '[model]\nsource = "~/m.gguf"\n').model_path == tmp_path / "m.gguf"
    monkeypatch.chdir(sub)
    assert resolve(load_recipe("r.toml"), "r.toml").model_path == tmp_path / "m.gguf"


def test_builtin(tmp_path):
    plan = plan_of(tmp_path, '[model]\nsource = "builtin:tiny-qwen35"\n')
    assert (plan.model_format, plan.model_path, plan.model_files, plan.served_model_name) == \
        ("builtin", None, [], "tiny-qwen35")
    errs = errors_of(tmp_path, '[model]\nsource = "builtin:tiny"\n')
    assert 'did you mean "builtin:tiny-qwen35"' in errs[0]["help"]


def test_missing_files(tmp_path):
    body = '[model]\nsource = "models/nothing.gguf"\nchat_template = "t.jinja"\n[parallel]\nrccl = "rccl.tgz"\n'
    errs = errors_of(tmp_path, body)
    assert [e["line"] for e in errs] == [2, 3, 5]
    plan = plan_of(tmp_path, body, check_files=False)
    assert plan.missing_files == [tmp_path / "models/nothing.gguf", tmp_path / "t.jinja", tmp_path / "rccl.tgz"]
    assert plan.model_format == "gguf" and plan.quantization == "gguf"
    assert any("rccl is only used" in w for w in plan.warnings)


def test_hub_ids(tmp_path):
    plan = plan_of(tmp_path, '[model]\nsource = "Qwen/Qwen3.5-9B"\n[engine]\nkind = "vllm"\n')
    assert (plan.model_format, plan.model_path, plan.served_model_name, plan.warnings) == \
        ("hf", None, "Qwen/Qwen3.5-9B", [])
    errs = errors_of(tmp_path, '[model]\nsource = "Qwen/Qwen3.5-9B"\n')
    assert "hf download" in errs[0]["help"]


def test_resolve_without_a_loader(tmp_path):
    """Recipes built in code (no file, no positions) resolve too; errors carry no line."""
    from g906.recipe.schema import Recipe

    recipe = Recipe.model_validate({"model": {"source": str(tmp_path / "nope.gguf")}})
    with pytest.raises(RecipeError) as info:
        resolve(recipe)
    assert info.value.issues[0].line is None
    assert resolve(recipe, check_files=False).missing_files == [tmp_path / "nope.gguf"]


def test_directory_of_ggufs_suggests_the_file(tmp_path):
    (tmp_path / "Qwen-GGUF").mkdir()
    write_gguf(tmp_path / "Qwen-GGUF" / "Qwen-Q4_K_M.gguf")
    errs = errors_of(tmp_path, '[model]\nsource = "Qwen-GGUF"\n')
    assert "has no config.json" in errs[0]["message"] and "Qwen-GGUF/Qwen-Q4_K_M.gguf" in errs[0]["help"]
