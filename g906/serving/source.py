"""`g906 up SOURCE`: any model source becomes a Plan.

    plan, data = plan_for_source("unsloth/Qwen3.5-0.8B-GGUF:Q4_K_M", {"server.port": 9000})

A recipe file is read as it is; a GGUF file, a Hugging Face folder, a Hub id or builtin:NAME gets
a recipe synthesised from the defaults (g906.recipe.source); overrides (recipe key -> value,
None = not given) come from the command line. Hub ids are fetched into the Hugging Face cache
first (the cache alone under HF_HUB_OFFLINE=1). No torch here."""

from __future__ import annotations

from typing import Any

from g906.errors import UsageError
from g906.recipe.errors import RecipeError


def plan_for_source(text: str, overrides: dict[str, Any] | None = None, *, download: bool = True):
    """(Plan, the recipe data that --print-recipe shows)."""
    from g906.recipe.hub import fetch_model
    from g906.recipe.resolve import resolve
    from g906.recipe.source import classify, recipe_for

    src = classify(text)
    if src.kind == "hub" and download:
        fetch_model(src.hub)
    recipe, data, path = recipe_for(src, overrides or {})
    try:
        plan = resolve(recipe, path)
    except RecipeError as exc:
        if src.kind == "recipe":
            raise
        first = exc.issues[0]
        raise UsageError(f"cannot serve {text}: {first.message}", first.help,
                         details=[i.message for i in exc.issues[1:]]) from None
    return plan, data


def print_recipe_text(text: str, overrides: dict[str, Any] | None = None) -> str:
    """`g906 up SOURCE --print-recipe`: the recipe `g906 up` would serve, as TOML (nothing is
    downloaded or loaded; a Hub id is written as the id)."""
    from g906.recipe.source import classify, recipe_for, recipe_toml

    src = classify(text)
    _, data, path = recipe_for(src, overrides or {})
    head = (f"g906 recipe for `g906 up {text}`" + (f" (from {path})" if path is not None else "")
            + "\nEvery key not shown has its default: docs/recipes.md.")
    return recipe_toml(data, header=head)
