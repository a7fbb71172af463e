"""The JSON Schema of recipes, for editors (taplo, Even Better TOML) and tools."""

from __future__ import annotations

from typing import Any

from g906.recipe.schema import Recipe

SCHEMA_DIALECT = "https://json-schema.org/draft/2020-12/schema"


def recipe_json_schema() -> dict[str, Any]:
    body = Recipe.model_json_schema(mode="validation")
    body.pop("title", None)
    body.pop("description", None)
    return {
        "$schema": SCHEMA_DIALECT,
        "title": "g906 recipe",
        "description": "A g906 deployment recipe (TOML): the model, GPUs, limits, engine and server. "
        "Reference: docs/recipes.md.",
        **body,
    }
