"""`g906 recipe new MODEL_PATH`: a commented recipe for one model, written from the schema
(every key, its meaning and default) and from what the model files say (architecture,
context length, vision projector). The result is validated before it is returned."""

from __future__ import annotations

import json
import os
import textwrap
from pathlib import Path
from typing import Any

from pydantic import BaseModel

from g906.errors import G906Error, UsageError
from g906.recipe import registry
from g906.recipe.errors import RecipeError
from g906.recipe.schema import EngineSection, Recipe

# Example values shown (commented out) for keys whose default is "unset".
_EXAMPLES: dict[tuple[str, str], Any] = {
    ("model", "chat_template"): "chat_template.jinja",
    ("parallel", "devices"): [0],
    ("parallel", "rccl"): "path/to/rccl-gfx906.tar.gz",
    ("limits", "max_model_len"): "32k",
    ("limits", "max_num_batched_tokens"): "8k",
    ("multimodal", "image"): {"count": 1, "width": 512, "height": 512},
    ("multimodal", "video"): 1,
    ("server", "api_key_env"): "G906_API_KEY",
    ("engine.vllm", "python"): "/opt/vllm/bin/python",
    ("engine.vllm", "executable"): "/opt/vllm/bin/vllm",
}


def toml_value(v: Any) -> str:
    """A TOML literal for a JSON-like value (None members of tables are left out: TOML has no null)."""
    if isinstance(v, bool):
        return "true" if v else "false"
    if isinstance(v, (int, float)):
        return repr(v)
    if isinstance(v, str):
        return json.dumps(v, ensure_ascii=False)
    if isinstance(v, list):
        return "[" + ", ".join(toml_value(x) for x in v) + "]"
    if isinstance(v, dict):
        inner = ", ".join(f"{k} = {toml_value(x)}" for k, x in v.items() if x is not None)
        return "{ " + inner + " }" if inner else "{}"
    raise TypeError(f"no TOML form for {v!r}")


def _comment(text: str) -> list[str]:
    return ["# " + line for line in textwrap.wrap(text, 92)]


def _section(title: str, cls: type[BaseModel], values: dict[str, Any], notes: dict[str, str],
             examples: dict[str, Any] | None = None, commented: bool = False) -> list[str]:
    lead = "# " if commented else ""
    lines = [f"{lead}[{title}]"]
    for name, f in cls.model_fields.items():
        if title == "engine" and name in ("embedded", "vllm"):
            continue
        if f.description:
            lines += _comment(f.description)
        if name in notes:
            lines += _comment(notes[name])
        if name in values and not commented:
            lines.append(f"{name} = {toml_value(values[name])}")
            continue
        default = f.get_default(call_default_factory=True)
        shown = default
        if default is None:
            shown = (examples or {}).get(name, _EXAMPLES.get((title, name), ""))
        if isinstance(shown, BaseModel):
            shown = shown.model_dump()
        lines.append(f"# {name} = {toml_value(shown)}")
    return lines + [""]


def _source_text(model_source: str, output: Path | None) -> tuple[str, Path | None]:
    if model_source.startswith("builtin:"):
        return model_source, None
    p = Path(os.path.abspath(os.path.expanduser(model_source)))
    if not p.exists():
        from g906.recipe.resolve import _similar

        raise UsageError(f"{model_source}: no such file or directory",
                         _similar(p) or "give a GGUF file, a Hugging Face model directory, or builtin:<name>")
    if output is None:
        return str(p), p
    rel = os.path.relpath(p, Path(os.path.abspath(output)).parent)
    return (rel if not rel.startswith(os.pardir + os.sep + os.pardir) else str(p)), p


def scaffold(model_source: str, output: Path | None = None) -> str:
    from g906.recipe.load import loads_recipe
    from g906.recipe.resolve import resolve

    source, _ = _source_text(model_source, output)
    recipe_path = Path(os.path.abspath(output)) if output is not None else Path.cwd() / "recipe.toml"
    try:
        plan = resolve(Recipe.model_validate({"model": {"source": source}}), recipe_path, check_files=True)
    except RecipeError as exc:
        first = exc.issues[0]
        raise UsageError(f"cannot write a recipe for {model_source}: {first.message}", first.help,
                         details=[i.message for i in exc.issues[1:]]) from None

    facts = plan.model_facts
    ctx = facts.get("context_length")
    limits: dict[str, Any] = {}
    if plan.model_format != "builtin":
        limits["max_model_len"] = "32k" if not isinstance(ctx, int) or ctx >= 32768 else ctx
    engine: dict[str, Any] = {}
    family = registry.architecture(plan.architecture)
    if family is not None and family.reasoning_parser:
        engine["reasoning_parser"] = family.reasoning_parser
    vision = plan.mmproj_path is not None or facts.get("multimodal") is True

    head = [f"# g906 recipe for {plan.served_model_name}"]
    desc = {"gguf": "GGUF", "hf": "Hugging Face directory", "builtin": "builtin synthetic model"}[plan.model_format]
    weights = [t for t in plan.gguf_tensor_types if t not in ("F32",)]
    main = max(weights, key=plan.gguf_tensor_types.__getitem__) if weights else None
    detail = (f"mostly {main} tensors" if main else None) if plan.model_format == "gguf" else \
        (plan.quantization if plan.quantization != "none" else facts.get("torch_dtype"))
    bits = [desc] + [b for b in (plan.architecture, detail) if b]
    head.append("#   model: " + ", ".join(bits))
    if isinstance(ctx, int):
        head.append(f"#   context length: {ctx} tokens"
                    + (f", {facts['num_hidden_layers']} layers" if "num_hidden_layers" in facts else ""))
    if plan.mmproj_path is not None:
        head.append(f"#   vision projector: {plan.mmproj_path.name}")
    head += ["# Written by `g906 recipe new`. Check it with `g906 validate`; every key: docs/recipes.md.",
             "# Commented-out keys show their default (or an example); uncomment one to change it.", ""]

    notes_limits = {}
    if isinstance(ctx, int) and "max_model_len" in limits:
        notes_limits["max_model_len"] = (f"The model supports {ctx} tokens; a longer context costs KV-cache "
                                         "memory, so this scaffold starts at most at 32k.")
    mm_note = ({"image": "This model can take images: uncomment `image` to turn them on."} if vision
               else {"image": "This model has no vision support: leave images off."})
    lines = head
    lines += _section("model", Recipe.model_fields["model"].annotation, {"source": source}, {},
                      {"name": plan.served_model_name})
    lines += _section("parallel", Recipe.model_fields["parallel"].annotation, {}, {})
    lines += _section("limits", Recipe.model_fields["limits"].annotation, limits, notes_limits)
    lines += _section("multimodal", Recipe.model_fields["multimodal"].annotation, {}, mm_note)
    lines += _section("engine", EngineSection, engine, {})
    lines += _section("server", Recipe.model_fields["server"].annotation, {}, {})
    lines += ["# Extra environment variables for the engine processes:", "# [env]", '# MY_VARIABLE = "value"', ""]
    text = "\n".join(lines)

    try:  # the scaffold must itself be a valid recipe
        resolve(loads_recipe(text, file=str(recipe_path), path=recipe_path), recipe_path, check_files=True)
    except RecipeError as exc:
        raise G906Error("internal error: the generated recipe does not validate",
                        "please report this", details=exc.details) from None
    return text
