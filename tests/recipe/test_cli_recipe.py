"""`g906 recipe schema` and `g906 recipe new`."""

from __future__ import annotations

import json

import pytest
from typer.testing import CliRunner

from g906.cli.app import app
from g906.recipe.load import load_recipe
from g906.recipe.resolve import resolve

from .helpers import run_g906, write_gguf, write_hf_dir


def _walk_properties(schema: dict, node: dict, where: str = ""):
    node = schema["$defs"][node["$ref"].split("/")[-1]] if "$ref" in node else node
    for key, prop in node.get("properties", {}).items():
        yield f"{where}.{key}".lstrip("."), prop
        if "$ref" in prop:
            yield from _walk_properties(schema, prop, f"{where}.{key}")


def test_schema():
    result = CliRunner().invoke(app, ["recipe", "schema"])
    assert result.exit_code == 0
    schema = json.loads(result.stdout)
    assert schema["$schema"].startswith("https://json-schema.org/")
    assert schema["title"] == "g906 recipe" and schema["required"] == ["model"]
    assert schema["additionalProperties"] is False
    props = dict(_walk_properties(schema, schema))
    assert {"model.source", "parallel.devices", "limits.max_model_len", "multimodal.image", "engine.kind",
            "engine.vllm.extra_args", "server.port", "env"} <= set(props)
    undocumented = [k for k, p in props.items() if not p.get("description")]
    assert undocumented == []
    # editors must accept "32k" for a token count
    assert any(alt.get("type") == "string" for alt in props["limits.max_model_len"]["anyOf"])


def test_schema_to_a_file(tmp_path):
    out = tmp_path / "recipe.schema.json"
    assert CliRunner().invoke(app, ["recipe", "schema", "-o", str(out)]).exit_code == 0
    assert json.loads(out.read_text())["title"] == "g906 recipe"
    r = CliRunner().invoke(app, ["recipe", "schema", "-o", str(out)])
    assert r.exit_code == 2 and "already exists" in r.stderr


@pytest.mark.parametrize("kind", ["builtin", "gguf", "gguf-vision", "hf"])
def test_new_scaffold_validates(tmp_path, kind):
    if kind == "builtin":
        model = "builtin:tiny-qwen35"
    elif kind.startswith("gguf"):
        (tmp_path / "models").mkdir()
        model = str(write_gguf(tmp_path / "models" / "Tiny.gguf"))
        if kind == "gguf-vision":
            write_gguf(tmp_path / "models" / "mmproj-Tiny-F16.gguf", arch="clip", quant=False)
    else:
        model = str(write_hf_dir(tmp_path / "models" / "Tiny-HF"))
    out = tmp_path / "recipes" / "tiny.toml"
    out.parent.mkdir()
    r = CliRunner().invoke(app, ["recipe", "new", model, "-o", str(out)])
    assert r.exit_code == 0, r.output
    text = out.read_text()
    assert text.startswith("# g906 recipe for ")
    plan = resolve(load_recipe(out), out)  # valid, files and all
    if kind != "builtin":
        assert 'source = "../models/' in text  # relative to the recipe, so the pair can move together
        assert plan.model_path is not None and plan.max_model_len is not None
        assert 'reasoning_parser = "qwen3"' in text
    if kind == "gguf-vision":
        assert "mmproj-Tiny-F16.gguf" in text and "can take images" in text

    again = CliRunner().invoke(app, ["recipe", "new", model, "-o", str(out)])
    assert again.exit_code == 2 and "already exists" in again.stderr and "--force" in again.stderr
    out.write_text("mine")
    assert CliRunner().invoke(app, ["recipe", "new", model, "-o", str(out), "--force"]).exit_code == 0
    assert out.read_text() == text


def test_new_to_stdout_and_bad_models(tmp_path):
    r = CliRunner().invoke(app, ["recipe", "new", "builtin:tiny-qwen35"])
    assert r.exit_code == 0 and 'source = "builtin:tiny-qwen35"' in r.stdout
    proc = run_g906("recipe", "new", str(tmp_path / "nope.gguf"))
    assert proc.returncode == 2 and "no such file" in proc.stderr and "Traceback" not in proc.stderr
    (tmp_path / "junk.gguf").write_bytes(b"junk")
    proc = run_g906("recipe", "new", str(tmp_path / "junk.gguf"))
    assert proc.returncode == 2 and "not a GGUF file" in proc.stderr and "Traceback" not in proc.stderr


def test_help_lists_the_commands():
    proc = run_g906("--help")
    assert proc.returncode == 0
    assert "validate" in proc.stdout and "recipe" in proc.stdout
