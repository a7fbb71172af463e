"""Golden argv/env for every recipe in recipes/, handed to the (fake) gfx906 vLLM fork.

Each recipe is loaded and resolved the way `g906 up` does (files need not exist here; HOME is
pinned so `~` paths are stable) with engine.kind switched to "vllm" — the one key a user changes to
move a deployment from the embedded engine to vLLM. After an intended change to a recipe or to the
translation, regenerate with:  G906_UPDATE_GOLDEN=1 python -m pytest tests/backends/test_vllm_recipes.py
and review the diff of tests/backends/golden/vllm_recipes.json."""

from __future__ import annotations

import json
import os
import tomllib
from pathlib import Path

import pytest

from g906.backends.errors import VllmUnsupportedError
from g906.backends.vllm import build_vllm_command, check_plan_against_vllm, format_dry_run

ROOT = Path(__file__).resolve().parents[2]
RECIPES = sorted((ROOT / "recipes").glob("*.toml"))
GOLDEN = Path(__file__).with_name("golden") / "vllm_recipes.json"
HOME = "/home/g906"

resolve_mod = pytest.importorskip("g906.recipe.resolve")


def _plan(path: Path):
    from g906.recipe.schema import Recipe

    data = tomllib.loads(path.read_text())
    data.setdefault("engine", {})["kind"] = "vllm"
    recipe = Recipe.model_validate(data)
    return resolve_mod.resolve(recipe, path, check_files=False)


def _golden() -> dict:
    return json.loads(GOLDEN.read_text()) if GOLDEN.exists() else {}


@pytest.fixture(autouse=True)
def _home(monkeypatch):
    monkeypatch.setenv("HOME", HOME)


def _entry(path: Path, vllm) -> dict:
    try:
        plan = _plan(path)
    except Exception as exc:                          # e.g. a builtin model: the schema refuses vLLM
        lines = [l.strip() for l in str(exc).splitlines() if l.strip()]
        return {"refused": type(exc).__name__,
                "message": next((l for l in lines if "builtin" in l), lines[0]).split(" [type=")[0]}
    problems = check_plan_against_vllm(plan, vllm)
    if problems:
        return {"problems": problems}
    cmd = build_vllm_command(plan, vllm, environ={"HOME": HOME}, allow_missing_secret=True)
    return {"argv": cmd.argv[1:], "env": cmd.env}


def test_recipes_exist():
    assert RECIPES, "recipes/ is empty"


@pytest.mark.parametrize("path", RECIPES, ids=[p.name for p in RECIPES])
def test_recipe_golden(path, vllm):
    got = _entry(path, vllm)
    if os.environ.get("G906_UPDATE_GOLDEN") == "1":
        data = _golden()
        data[path.name] = got
        GOLDEN.parent.mkdir(exist_ok=True)
        GOLDEN.write_text(json.dumps(dict(sorted(data.items())), indent=2) + "\n")
        return
    golden = _golden()
    assert path.name in golden, f"no golden entry for {path.name}: regenerate (see the module docstring)"
    assert got == golden[path.name]


def test_every_golden_entry_has_a_recipe():
    stale = set(_golden()) - {p.name for p in RECIPES}
    assert not stale, f"golden entries without a recipe: {sorted(stale)}"


def test_vllm_recipe_as_written(vllm):
    """recipes/ holds one recipe written for the vLLM handoff: it needs no switching."""
    written = [p for p in RECIPES if tomllib.loads(p.read_text()).get("engine", {}).get("kind") == "vllm"]
    assert written
    for path in written:
        from g906.recipe.load import load_recipe

        plan = resolve_mod.resolve(load_recipe(path), path, check_files=False)
        cmd = build_vllm_command(plan, vllm, environ={}, allow_missing_secret=True)
        assert "--dtype" in cmd.argv and format_dry_run(cmd).count("vllm serve") == 1


def test_builtin_recipe_refused_by_the_handoff(vllm):
    demo = ROOT / "recipes" / "demo.toml"
    if not demo.exists():
        pytest.skip("no demo recipe")
    from g906.recipe.load import load_recipe

    plan = resolve_mod.resolve(load_recipe(demo), demo, check_files=False)
    (problem,) = check_plan_against_vllm(plan, vllm)
    assert "builtin" in problem
    with pytest.raises(VllmUnsupportedError):
        build_vllm_command(plan, vllm, environ={})
