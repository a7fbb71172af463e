"""`g906 doctor`: check, one finding per row, whether this machine's ROCm / PyTorch / Triton /
rocBLAS / RCCL stack can run g906 (and a recipe), and how to fix what cannot.

Exit status: 0 when nothing fails, 1 when a check fails (with --strict also on warnings),
2 on usage errors (unknown check id, unreadable --from file, bad recipe)."""

from __future__ import annotations

from pathlib import Path
from typing import List, Optional

import typer

from g906.cli.output import console, err_console, print_json


def _load_plan(recipe_path: Path):
    from g906.recipe.load import load_recipe
    from g906.recipe.resolve import resolve

    recipe = load_recipe(recipe_path)
    return resolve(recipe, recipe_path, check_files=False)


def doctor(
    check_ids: Optional[List[str]] = typer.Argument(None, metavar="[CHECK_ID]...",
                                                    help="Run only these checks (an id, or a prefix such as 'rccl')."),
    recipe: Optional[Path] = typer.Option(None, "--recipe", "-r", help="Also check this recipe: files, types, memory, TP."),
    as_json: bool = typer.Option(False, "--json", help="Print a stable JSON document instead of the report."),
    strict: bool = typer.Option(False, "--strict", help="Exit 1 on warnings too."),
    verbose: bool = typer.Option(False, "--verbose", "-v", help="Show details and skipped checks."),
    list_checks: bool = typer.Option(False, "--list-checks", help="List the check ids and exit."),
    collect: Optional[Path] = typer.Option(None, "--collect", help="Write the collected facts to FILE (attach it to bug reports)."),
    from_file: Optional[Path] = typer.Option(None, "--from", help="Evaluate facts saved with --collect instead of this machine."),
    root: Path = typer.Option(Path("/"), "--root", help="Read all file-system facts under this sysroot."),
    python: Optional[str] = typer.Option(None, "--python", help="Inspect the torch/triton of this interpreter (default: this one)."),
    deep: bool = typer.Option(False, "--deep", help="Also run a tiny matmul on each GPU and an all-reduce over 2."),
    timeout: float = typer.Option(60.0, "--timeout", min=1.0, help="Seconds allowed for the torch probe."),
) -> None:
    """Check this machine (and optionally a recipe) for running g906; print fixes for what fails."""
    from g906.doctor.checks import all_checks, exit_code, run_checks, select
    from g906.doctor.facts import Facts, collect_facts
    from g906.doctor.report import render, render_list, to_json
    from g906.errors import UsageError

    if list_checks:
        specs = all_checks()
        if as_json:
            print_json({"checks": [{"id": s.id, "group": s.group, "title": s.title,
                                    "needs_recipe": s.needs_plan, "deep": s.deep} for s in specs]})
        else:
            render_list(specs, console)
        raise typer.Exit(0)
    if from_file is not None and (collect is not None or deep or python or str(root) != "/"):
        raise UsageError("--from evaluates saved facts; it cannot be combined with --collect, --root, --python or --deep")
    if check_ids:
        select(check_ids)  # unknown ids are a usage error before any work is done
    plan = _load_plan(recipe) if recipe is not None else None

    if from_file is not None:
        facts = Facts.load(from_file)
    else:
        if not root.is_dir():
            raise UsageError(f"--root {root}: not a directory")
        status = None if as_json else err_console.status("collecting facts...", spinner="dots")
        if status is not None:
            status.start()
        try:
            facts = collect_facts(root, python=python, timeout_s=timeout, deep=deep)
        finally:
            if status is not None:
                status.stop()
        if collect is not None:
            facts.save(collect)
            if not as_json:
                err_console.print(f"facts written to {collect}", markup=False)

    findings = run_checks(facts, plan, only=check_ids or None)
    code = exit_code(findings, strict=strict)
    if as_json:
        print_json(to_json(findings, facts, strict=strict, recipe=str(recipe) if recipe else None))
    else:
        render(findings, facts, console, verbose=verbose or bool(check_ids), strict=strict)
        if facts.errors:
            for e in facts.errors:
                err_console.print(f"note: a fact collector failed: {e}", markup=False, soft_wrap=True)
    raise typer.Exit(code)


def register(app: typer.Typer) -> None:
    app.command("doctor", help="Check the ROCm / PyTorch / Triton / rocBLAS / RCCL stack (and a recipe); show fixes.")(doctor)
