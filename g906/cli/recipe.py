"""`g906 recipe schema` and `g906 recipe new MODEL_PATH`."""

from __future__ import annotations

import functools
import json
import os
from pathlib import Path

import typer

from g906.cli.output import err_console, report_error
from g906.errors import G906Error

recipe_app = typer.Typer(help="Recipe tools: JSON Schema for editors, scaffolds for models.", no_args_is_help=True)


def _reporting(fn):
    """Known errors become "Error: ... / Hint: ..." and their exit status, here in the command."""

    @functools.wraps(fn)
    def wrapper(*args, **kwargs):
        try:
            return fn(*args, **kwargs)
        except G906Error as exc:
            raise typer.Exit(report_error(exc)) from None

    return wrapper


def _write(path: Path, text: str, force: bool) -> None:
    from g906.errors import UsageError

    if path.exists() and not force:
        raise UsageError(f"{path} already exists", "pass --force to overwrite it")
    if path.is_dir():
        raise UsageError(f"{path} is a directory", "give a file name, e.g. -o recipe.toml")
    tmp = path.with_name(f".{path.name}.tmp{os.getpid()}")
    try:
        tmp.write_text(text, encoding="utf-8")
        os.replace(tmp, path)
    except OSError as exc:
        tmp.unlink(missing_ok=True)
        raise UsageError(f"cannot write {path}: {exc.strerror or exc}") from None


@recipe_app.command("schema")
@_reporting
def schema(
    output: Path = typer.Option(None, "-o", "--output", help="Write to this file instead of stdout."),
    force: bool = typer.Option(False, "--force", help="Overwrite an existing output file."),
) -> None:
    """Print the JSON Schema of recipes (for taplo / Even Better TOML)."""
    from g906.recipe.jsonschema import recipe_json_schema

    text = json.dumps(recipe_json_schema(), indent=2) + "\n"
    if output is None:
        typer.echo(text, nl=False)
    else:
        _write(output, text, force)
        err_console.print(f"wrote {output}")


@recipe_app.command("new")
@_reporting
def new(
    model_path: str = typer.Argument(..., help="A GGUF file, a Hugging Face model directory, or builtin:<name>."),
    output: Path = typer.Option(None, "-o", "--output", help="Write the recipe here instead of stdout."),
    force: bool = typer.Option(False, "--force", help="Overwrite an existing output file."),
) -> None:
    """Write a commented recipe for a model (it validates as written)."""
    from g906.recipe.scaffold import scaffold

    if output is not None and output.exists() and not force:
        from g906.errors import UsageError

        raise UsageError(f"{output} already exists", "pass --force to overwrite it")
    text = scaffold(model_path, output)
    if output is None:
        typer.echo(text, nl=False)
    else:
        _write(output, text, force)
        err_console.print(f"wrote {output}; check it with: g906 validate {output}")


def register(app: typer.Typer) -> None:
    app.add_typer(recipe_app, name="recipe")
