"""The `g906` command: a root Typer app with one module per command group."""

from __future__ import annotations

import importlib
import sys

import typer

from g906 import __version__
from g906.cli.output import report_error

app = typer.Typer(
    name="g906",
    help="Serve Qwen3.5-family LLMs on AMD gfx906 GPUs with one checked command.",
    no_args_is_help=True,
    pretty_exceptions_enable=False,
    add_completion=True,
)

# Each module defines register(app). Keep imports in them light: no torch at import time.
COMMAND_MODULES: list[str] = [
    "g906.cli.doctor",
    "g906.cli.validate",
    "g906.cli.recipe",
    "g906.cli.rccl",
    "g906.cli.up",
    "g906.cli.pull",
    "g906.cli.generate",
    "g906.cli.bench",
]


def _version_callback(value: bool) -> None:
    if value:
        typer.echo(f"g906 {__version__}")
        raise typer.Exit()


@app.callback()
def _root(
    version: bool = typer.Option(
        False, "--version", callback=_version_callback, is_eager=True, help="Print the version and exit."
    ),
) -> None:
    """g906: doctor, rccl, up — declarative LLM serving for gfx906."""


for _name in COMMAND_MODULES:
    importlib.import_module(_name).register(app)


def main() -> None:
    as_json = "--json" in sys.argv
    try:
        app(standalone_mode=True)
    except SystemExit:
        raise
    except KeyboardInterrupt:
        sys.exit(130)
    except BaseException as exc:  # noqa: BLE001 - the one place that turns crashes into messages
        sys.exit(report_error(exc, as_json=as_json))
