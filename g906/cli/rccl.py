"""`g906 rccl install | rollback | status | probe`: swap torch's RCCL for a gfx906 build, safely."""

from __future__ import annotations

import sys
from pathlib import Path
from typing import Optional

import typer

from g906.cli.output import console, err_console, print_json

rccl_app = typer.Typer(
    name="rccl",
    help="Install a gfx906 RCCL into torch/lib as a transaction; roll back; check it with a probe.",
    no_args_is_help=True,
)

PythonOpt = typer.Option(None, "--python", help="Interpreter of the environment to change (default: this one).")
LibDirOpt = typer.Option(None, "--lib-dir", help="The torch/lib folder to change, given directly.")
JsonOpt = typer.Option(False, "--json", help="Print a JSON result on stdout (progress goes to stderr).")


def _log(as_json: bool):
    def log(msg: str) -> None:
        (err_console if as_json or msg.startswith("WARNING") else console).print(msg, markup=False, soft_wrap=True)
    return log


def _target(python: Optional[str], lib_dir: Optional[Path]):
    from g906.rccl.target import resolve_target

    return resolve_target(python, lib_dir)


@rccl_app.command("install")
def install_cmd(
    source: str = typer.Argument(..., help="A release tarball (.tar.gz/.tar.xz), a folder holding librccl.so.1, or the .so."),
    python: Optional[str] = PythonOpt,
    lib_dir: Optional[Path] = LibDirOpt,
    force: bool = typer.Option(False, "--force", help="Install even without gfx906 device code (loud warning)."),
    dry_run: bool = typer.Option(False, "--dry-run", help="Validate and show what would change; change nothing."),
    no_probe: bool = typer.Option(False, "--no-probe", help="Do not run the probe after installing."),
    probe_backend: str = typer.Option("nccl", "--probe-backend", help="Backend of the post-install probe: nccl (RCCL) or gloo."),
    probe_world_size: int = typer.Option(2, "--probe-world-size", min=1, help="Processes (GPUs) for the probe."),
    probe_timeout: float = typer.Option(180, "--probe-timeout", min=1, help="Seconds before the probe counts as hung."),
    as_json: bool = JsonOpt,
) -> None:
    """Back up torch's librccl, swap in SOURCE atomically, verify it, probe it (rolls back if the probe fails)."""
    from g906.rccl.transaction import install

    log = _log(as_json)
    target = _target(python, lib_dir)
    res = install(source, target, force=force, dry_run=dry_run, probe=not no_probe, probe_backend=probe_backend,
                  probe_world_size=probe_world_size, probe_timeout=probe_timeout, log=log)
    if as_json:
        print_json(res.to_json())
        return
    if res.action == "dry_run":
        console.print(f"Dry run: nothing changed in {res.lib_dir}", markup=False)
    if res.action == "already_installed":
        console.print(res.notes[0], markup=False, soft_wrap=True)
        return
    for note in res.notes:
        console.print(f"  - {note}", markup=False, soft_wrap=True)
    if res.action == "installed":
        console.print(f"Done. Backup: {res.backup_dir}. Undo with: g906 rccl rollback"
                      + (f" --python {target.python}" if python else f" --lib-dir {target.lib_dir}" if lib_dir else ""),
                      markup=False, soft_wrap=True)


@rccl_app.command("rollback")
def rollback_cmd(
    python: Optional[str] = PythonOpt,
    lib_dir: Optional[Path] = LibDirOpt,
    force: bool = typer.Option(False, "--force", help="Restore even over a file that changed since the install (it is saved first)."),
    dry_run: bool = typer.Option(False, "--dry-run", help="Show what would be restored; change nothing."),
    as_json: bool = JsonOpt,
) -> None:
    """Restore the original librccl files byte for byte from g906's backup."""
    from g906.rccl.transaction import rollback

    log = _log(as_json)
    res = rollback(_target(python, lib_dir), force=force, dry_run=dry_run, log=log)
    if as_json:
        print_json(res.to_json())
        return
    if res.action == "dry_run":
        console.print(f"Dry run: nothing changed in {res.lib_dir}", markup=False)
        for row in res.files:
            console.print(f"  {row['name']}: {row['status']} -> {row['action']}", markup=False)
    for w in res.warnings:
        err_console.print(f"WARNING: {w}", markup=False, soft_wrap=True)


@rccl_app.command("status")
def status_cmd(
    python: Optional[str] = PythonOpt,
    lib_dir: Optional[Path] = LibDirOpt,
    as_json: bool = JsonOpt,
) -> None:
    """Which librccl torch loads, whether it holds gfx906 code, whether it is g906's swap, and the backup."""
    from g906.rccl.libinfo import LibraryInfo, describe
    from g906.rccl.transaction import status

    s = status(_target(python, lib_dir))
    if as_json:
        print_json(s)
        return
    console.print(f"torch/lib: {s['lib_dir']}" + (f"  (torch {s['torch_version']})" if s["torch_version"] else ""),
                  markup=False, soft_wrap=True)
    for row in s["files"]:
        if row["kind"] == "symlink":
            console.print(f"  {row['name']} -> {row['link']}", markup=False)
        elif row.get("library"):
            lib = row["library"]
            extra = f"problem: {lib['problem']}" if lib.get("problem") else describe(LibraryInfo(**lib))
            console.print(f"  {row['name']}  sha256 {str(lib.get('sha256'))[:12]}  {extra}", markup=False, soft_wrap=True)
    mark = "[green]yes[/]" if s["has_gfx906"] else "[red]no[/]"
    console.print(f"gfx906 device code: {mark}")
    console.print(f"g906 swap in place: {'yes' if s['g906_swap'] else 'no'}"
                  + (f" (state: {s['state']})" if s["state"] else ""), markup=False)
    b = s.get("backup")
    if b:
        console.print(f"backup: {b['dir']} ({'verified' if b['ok'] else 'DAMAGED'})", markup=False, soft_wrap=True)
    else:
        console.print("backup: none", markup=False)
    for msg in s["messages"]:
        console.print(f"note: {msg}", markup=False, soft_wrap=True)


@rccl_app.command("probe")
def probe_cmd(
    python: Optional[str] = PythonOpt,
    world_size: int = typer.Option(2, "--world-size", min=1, help="Number of processes (one GPU each for nccl)."),
    backend: str = typer.Option("nccl", "--backend", help="nccl (RCCL on ROCm) or gloo (CPU)."),
    timeout: float = typer.Option(180, "--timeout", min=1, help="Seconds before the probe counts as hung."),
    verbose: bool = typer.Option(False, "--verbose", "-v", help="Print every rank's output."),
    as_json: bool = JsonOpt,
) -> None:
    """All-reduce and all-gather over N processes (sizes 1/4096/1M, fp32/fp16); prints ALLREDUCE_OK or a diagnosis."""
    from g906.errors import G906Error
    from g906.rccl.probe import OK, run_probe

    res = run_probe(python, world_size=world_size, backend=backend, timeout=timeout)
    if as_json:
        print_json(res.to_json())
    else:
        if verbose or not res.ok:
            err_console.print(res.output, markup=False, soft_wrap=True)
        if res.ok:
            console.print(res.summary, markup=False, soft_wrap=True)
    if res.status != OK:
        if as_json:
            raise typer.Exit(1)
        hint = res.hint or "run with --verbose to see every rank's output"
        if res.status != "unavailable":
            hint += "; if this began after `g906 rccl install`, `g906 rccl rollback` restores torch's original RCCL"
        raise G906Error(f"probe {res.status}: {res.summary}.", hint=hint)


def register(app: typer.Typer) -> None:
    app.add_typer(rccl_app, name="rccl")


def main() -> None:
    """`python -m g906.cli.rccl ...`: the rccl commands alone, with the root app's error handling."""
    from g906.cli.output import report_error

    as_json = "--json" in sys.argv
    try:
        rccl_app(prog_name="g906 rccl", standalone_mode=True)
    except SystemExit:
        raise
    except KeyboardInterrupt:
        sys.exit(130)
    except BaseException as exc:  # noqa: BLE001 - turn every failure into a message
        sys.exit(report_error(exc, as_json=as_json))


if __name__ == "__main__":
    main()
