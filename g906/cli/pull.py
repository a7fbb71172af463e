"""`g906 pull ORG/NAME[:REVISION|:QUANT]`: fetch a model from the Hugging Face Hub into the local
cache ahead of time (what `g906 up ORG/NAME` would download), then print where it is."""

from __future__ import annotations

import typer

from g906.cli.output import console, print_json
from g906.errors import UsageError


def register(app: typer.Typer) -> None:
    @app.command("pull")
    def pull(
        model: str = typer.Argument(..., metavar="ORG/NAME[:TAG]",
                                    help="A Hub id; :TAG is a revision, or for GGUF repos a quant (Q4_K_M, Q8_0, ...)."),
        as_json: bool = typer.Option(False, "--json", help="Print {model, path} as JSON."),
    ) -> None:
        """Download a model into the Hugging Face cache (HF_HOME); `g906 up ORG/NAME` then starts offline."""
        from g906.cli.up import _setup_logging
        from g906.recipe.hub import fetch_model, parse_hub_id

        _setup_logging()           # the download's summary line
        spec = parse_hub_id(model)
        if spec is None:
            raise UsageError(f"{model!r} is not a Hugging Face Hub id",
                             hint="write it as org/name, org/name:REVISION or org/name:Q4_K_M")
        path = fetch_model(spec)
        if as_json:
            print_json({"model": str(spec), "path": str(path)})
            return
        console.print(f"{spec}: {path}", markup=False, soft_wrap=True)
        console.print(f"Serve it with:  g906 up {spec}", markup=False, soft_wrap=True)
