"""Paths the file system refuses (issue 43, finding 10): a 300-character name in a recipe is a
recipe error at its line:col (exit 2), never "internal error: OSError"."""

from __future__ import annotations

import pytest

from g906.recipe.errors import RecipeError
from g906.recipe.load import load_recipe
from g906.recipe.resolve import resolve

from .helpers import run_g906

LONG = "a" * 300


@pytest.mark.parametrize("recipe,key,line,col", [
    (f'[model]\nsource = "/tmp/{LONG}/m.gguf"\n', "model.source", 2, 10),
    (f'[model]\nsource = "{LONG}.gguf"\n', "model.source", 2, 10),
    (f'[model]\nsource = "builtin:tiny-qwen35"\nchat_template = "{LONG}.jinja"\n', "model.chat_template", 3, 17),
    (f'[model]\nsource = "builtin:tiny-qwen35"\n\n[parallel]\nrccl = "{LONG}.tar.gz"\n', "parallel.rccl", 5, 8),
])
def test_name_too_long_is_a_located_recipe_error(tmp_path, recipe, key, line, col):
    p = tmp_path / "r.toml"
    p.write_text(recipe)
    with pytest.raises(RecipeError) as e:
        resolve(load_recipe(p), p)
    issue = e.value.issues[0]
    assert (issue.key, issue.line, issue.column) == (key, line, col)
    assert "too long" in issue.message and "characters" in (issue.help or "")
    r = run_g906("validate", str(p))
    assert r.returncode == 2, r.stderr
    assert f"r.toml:{line}:{col}" in r.stdout + r.stderr and "internal error" not in r.stdout + r.stderr
    assert "Traceback" not in r.stderr
