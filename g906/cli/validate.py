"""`g906 validate RECIPE [--json] [--check-files]`: check a recipe and show it resolved.

Exit status 0 when valid (warnings allowed), 2 when not. Missing model files are warnings
unless --check-files (the recipes of a repository name models that live elsewhere);
`g906 up` always treats them as errors."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import typer
from rich.text import Text

from g906.errors import UsageError
from g906.recipe.scaffold import toml_value
from g906.cli.output import console, err_console, print_json, report_error


def _render_recipe(recipe) -> Text:
    """The recipe as TOML, every default filled in; keys the file set are bold."""
    from pydantic import BaseModel

    out = Text()
    data = recipe.model_dump(mode="json")

    def section(name: str, model, values: dict) -> None:
        out.append(f"[{name}]\n", style="bold cyan")
        nested = []
        for key, value in values.items():
            sub = getattr(model, key, None) if model is not None else None
            if isinstance(value, dict) and isinstance(sub, BaseModel) and key not in ("image", "video"):
                nested.append((f"{name}.{key}", sub, value))
                continue
            is_set = model is None or key in model.model_fields_set
            if value is None:
                out.append(f"# {key} = (unset)\n", style="dim")
            else:
                out.append(f"{key} = {toml_value(value)}", style="bold" if is_set else "")
                out.append("\n" if is_set else "    # default\n", style="dim")
        out.append("\n")
        for args in nested:
            section(*args)

    for name, values in data.items():
        if name == "env":
            out.append("[env]\n", style="bold cyan")
            for k, v in values.items():
                out.append(f"{k} = {toml_value(v)}\n", style="bold")
            if not values:
                out.append("# (no extra variables)\n", style="dim")
            out.append("\n")
            continue
        section(name, getattr(recipe, name), values)
    return out


def _size(n: int) -> str:
    for unit in ("B", "KiB", "MiB", "GiB", "TiB"):
        if n < 1024 or unit == "TiB":
            return f"{n:.1f} {unit}" if unit != "B" else f"{n} B"
        n /= 1024
    return str(n)


def _render_plan(plan) -> Text:
    out = Text()

    def row(label: str, value: Any) -> None:
        out.append(f"  {label:<18}", style="dim")
        out.append(f"{value}\n")

    row("format", plan.model_format)
    row("model", plan.model_path or plan.model_source)
    if plan.architecture:
        row("architecture", plan.architecture)
    quant = plan.quantization
    if plan.gguf_tensor_types:
        quant += " (" + ", ".join(f"{k}: {v}" for k, v in plan.gguf_tensor_types.items()) + " tensors)"
    if getattr(plan, "quant_detail", None):
        quant = plan.quant_detail
    row("quantization", quant)
    row("served as", plan.served_model_name)
    if plan.model_files:
        present = [p for p in plan.model_files if p.exists()]
        size = sum(p.stat().st_size for p in present)
        row("files", f"{len(plan.model_files)} ({_size(size)} present)")
    if plan.mmproj_path:
        row("mmproj", plan.mmproj_path)
    ctx = plan.model_facts.get("context_length")
    row("context", f"{plan.max_model_len or 'model default'}" + (f" (model: {ctx})" if ctx else ""))
    row("images", "on" if plan.images_enabled else "off")
    row("GPUs", f"tensor_parallel_size {plan.tensor_parallel_size}"
        + (f", devices {plan.devices}" if plan.devices is not None else ""))
    row("engine", plan.engine_kind)
    row("listens on", f"http://{plan.host}:{plan.port}/v1")
    return out


def validate(
    recipe: Path = typer.Argument(..., help="The recipe TOML file.", show_default=False),
    as_json: bool = typer.Option(False, "--json", help="Print a JSON document instead (see docs/recipes.md)."),
    check_files: bool = typer.Option(
        False, "--check-files", help="Treat missing model, mmproj, template and RCCL files as errors."
    ),
) -> None:
    """Check a recipe and print it resolved, defaults filled in (exit 2 when invalid)."""
    from g906.recipe.errors import RecipeError
    from g906.recipe.load import load_recipe
    from g906.recipe.resolve import resolve

    try:
        loaded = load_recipe(recipe)
        plan = resolve(loaded, recipe, check_files=check_files)
    except RecipeError as exc:
        if as_json:
            print_json(exc.to_json())
        else:
            report_error(exc)
        raise typer.Exit(exc.exit_code) from None

    if plan.engine_kind == "vllm":
        problems = _vllm_problems(plan)
        if problems:
            err = UsageError(f"{recipe}: the installed vLLM cannot run this recipe", details=[f"  - {p}" for p in problems],
                             hint="change the recipe, or install a vLLM that supports it")
            if as_json:
                print_json({"ok": False, "file": str(recipe), "errors": [{"message": p} for p in problems]})
            else:
                report_error(err)
            raise typer.Exit(err.exit_code)

    if as_json:
        plan_json = plan.to_json()
        plan_json.pop("recipe", None)
        print_json({
            "ok": True,
            "file": str(recipe),
            "recipe": loaded.model_dump(mode="json"),
            "plan": plan_json,
            "warnings": plan.warnings,
        })
        return
    console.print(Text.assemble(("✓ ", "bold green"), (f"{recipe}", "bold"), " is a valid recipe"))
    console.print()
    console.print(_render_recipe(loaded), end="")
    console.print(Text("# plan\n", style="bold cyan"), end="")
    console.print(_render_plan(plan))
    for w in plan.warnings:
        err_console.print(Text(w, style="yellow"), soft_wrap=True)


def _vllm_problems(plan) -> list[str]:
    """engine.kind = "vllm": check the plan against the installed vLLM's flags. A vLLM that is not
    installed here is a warning (the recipe may be meant for another machine), not an error."""
    from g906.backends.vllm import check_plan_against_vllm, detect_vllm_for_plan
    from g906.errors import G906Error

    try:
        install = detect_vllm_for_plan(plan)
    except G906Error as exc:
        plan.warnings.append(f"vLLM not checked: {exc.message}")
        return []
    return check_plan_against_vllm(plan, install)


def register(app: typer.Typer) -> None:
    app.command("validate")(validate)
