"""The server's default max_tokens (g906/serving/generation_defaults.py): the recipe's value, else
an HF directory's generation_config.json max_new_tokens, else none."""

from __future__ import annotations

import json
from pathlib import Path
from types import SimpleNamespace

import pytest

from g906.errors import G906Error
from g906.recipe.schema import LimitsSection
from g906.serving.generation_defaults import default_max_tokens


def plan(tmp: Path | None, value=None, fmt="hf"):
    return SimpleNamespace(default_max_tokens=value, model_format=fmt, model_path=tmp)


def test_sources(tmp_path):
    assert default_max_tokens(plan(tmp_path)) is None                      # no generation_config.json
    (tmp_path / "generation_config.json").write_text(json.dumps({"max_new_tokens": 77, "eos_token_id": 1}))
    assert default_max_tokens(plan(tmp_path)) == 77
    assert default_max_tokens(plan(tmp_path, 5)) == 5                        # the recipe wins
    assert default_max_tokens(plan(tmp_path, "context")) is None
    assert default_max_tokens(plan(tmp_path, fmt="gguf")) is None
    assert default_max_tokens(plan(None, fmt="builtin")) is None
    (tmp_path / "generation_config.json").write_text(json.dumps({"do_sample": True}))
    assert default_max_tokens(plan(tmp_path)) is None


@pytest.mark.parametrize("text,msg", [("{", "cannot read"), ('{"max_new_tokens": 0}', "positive integer"),
                                      ('{"max_new_tokens": "5"}', "positive integer")])
def test_bad_generation_config(tmp_path, text, msg):
    (tmp_path / "generation_config.json").write_text(text)
    with pytest.raises(G906Error, match=msg):
        default_max_tokens(plan(tmp_path))


def test_recipe_field():
    assert LimitsSection(default_max_tokens="2k").default_max_tokens == 2048
    assert LimitsSection(default_max_tokens="context").default_max_tokens == "context"
    for bad in (0, "lots", -3):
        with pytest.raises(ValueError):
            LimitsSection(default_max_tokens=bad)
