"""The RCCL step of `g906 up`: decide whether a TP>1 recipe on gfx906 needs the swap, and do it.

    decision = ensure_rccl_for_plan(plan, facts, assume_yes=args.yes, dry_run=args.dry_run,
                                    interactive=sys.stdin.isatty())
    if decision.blocking:
        raise G906Error(decision.reason, hint=decision.hint)

Facts: the doctor's Facts (its visible_amd_gpus(), torch, python and rccl fields are read), or
any dict of the same shape, every key optional:

    gpus: [{"gfx": "gfx906", ...}, ...]              (keys tried: gfx, arch, gfx_target, gcn_arch_name, name)
    gpu_archs: ["gfx906", ...]                       (a flat alternative)
    torch: {"lib_dir": ".../torch/lib", ...}         or torch_lib_dir: "..."
    python: {"executable": "/path/bin/python"}       or torch.python / a plain string
    rccl: {"has_gfx906": false, "gfx_targets": [...], "offload_targets": [...]}

Without facts (None), the GPUs are read from the KFD topology here (g906.kfd): the swap sits
below the doctor and never imports it. When facts say nothing about RCCL, the library in
torch/lib is inspected directly; when they say nothing about torch, the current interpreter's
torch is located (in a subprocess).
"""

from __future__ import annotations

import dataclasses
import os
import shlex
import sys
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Callable, Mapping

from g906.errors import G906Error
from g906.kfd import topology_gpus, visible_gpus
from g906.rccl.libinfo import inspect_library, validate_new_library
from g906.rccl.target import Target, read_torch_version, resolve_target

NOT_NEEDED, OK, INSTALL, INSTALLED, STOP = "not_needed", "ok", "install", "installed", "stop"
PLACEHOLDER = "PATH/TO/rccl-gfx906.tar.gz"


@dataclass
class RcclDecision:
    action: str                      # not_needed | ok | install (dry run) | installed | stop
    reason: str
    package: str | None = None
    lib_dir: str | None = None
    python: str | None = None
    command: str | None = None       # the exact `g906 rccl install ...` for the user
    hint: str | None = None
    result: dict[str, Any] | None = None
    warnings: list[str] = field(default_factory=list)

    @property
    def blocking(self) -> bool:
        return self.action == STOP

    def plan_line(self) -> str:
        """One line for `g906 up --dry-run`'s plan."""
        if self.action == INSTALL:
            return f"RCCL: will install {self.package} into {self.lib_dir} ({self.reason}) — {self.command}"
        if self.action == STOP:
            return f"RCCL: STOP — {self.reason}; run: {self.command}" if self.command else f"RCCL: STOP — {self.reason}"
        return f"RCCL: {self.reason}"

    def to_json(self) -> dict[str, Any]:
        d = dataclasses.asdict(self)
        d["blocking"] = self.blocking
        return d


def _as_dict(facts: Any) -> dict[str, Any]:
    if facts is None:
        return {}
    if isinstance(facts, Mapping):
        return dict(facts)
    if hasattr(facts, "to_json"):
        return dict(facts.to_json())
    if dataclasses.is_dataclass(facts):
        return dataclasses.asdict(facts)
    return dict(vars(facts))


def _get(d: Any, *path: str) -> Any:
    for key in path:
        if isinstance(d, Mapping):
            d = d.get(key)
        else:
            d = getattr(d, key, None)
        if d is None:
            return None
    return d


def gpu_archs(facts: Mapping[str, Any]) -> list[str]:
    archs: list[str] = []
    for a in facts.get("gpu_archs") or []:
        archs.append(str(a))
    for g in facts.get("gpus") or []:
        for key in ("gfx", "arch", "gfx_target", "gcn_arch_name", "name"):
            v = _get(g, key)
            if isinstance(v, str) and v.startswith("gfx"):
                archs.append(v)
                break
    return [a.split(":", 1)[0] for a in archs]


def _command(package: str | None, python: str | None, lib_dir: str | None) -> str:
    parts = ["g906", "rccl", "install", package or PLACEHOLDER]
    if python:
        parts += ["--python", python]
    elif lib_dir:
        parts += ["--lib-dir", lib_dir]
    return " ".join(shlex.quote(p) for p in parts)


def _ask(question: str) -> bool:
    try:
        answer = input(f"{question} [y/N] ")
    except EOFError:
        return False
    return answer.strip().lower() in ("y", "yes")


def ensure_rccl_for_plan(plan: Any, facts: Any, *, assume_yes: bool, dry_run: bool, interactive: bool,
                         confirm: Callable[[str], bool] | None = None,
                         log: Callable[[str], None] | None = None) -> RcclDecision:
    """Make sure a TP>1 plan on gfx906 has a gfx906 RCCL in torch/lib (see the module doc)."""
    tp = int(getattr(plan, "tensor_parallel_size", 1) or 1)
    if tp <= 1:
        return RcclDecision(NOT_NEEDED, "single GPU (tensor_parallel_size = 1): RCCL is not used")
    f = _as_dict(facts)
    if facts is None:                               # nothing given: the GPUs HIP would see here
        f["gpus"] = visible_gpus(topology_gpus(), os.environ)
    elif hasattr(facts, "visible_amd_gpus"):        # the doctor's Facts: the GPUs HIP would see
        f["gpus"] = facts.visible_amd_gpus()
    archs = gpu_archs(f)
    if "gfx906" not in archs:
        seen = ", ".join(sorted(set(archs))) or "no AMD GPU reported"
        return RcclDecision(NOT_NEEDED, f"not a gfx906 machine ({seen}): torch's own RCCL/NCCL is used")

    package = getattr(plan, "rccl_package", None)
    package = str(package) if package else None
    python = _get(f, "torch", "python") or _get(f, "torch", "executable") or _get(f, "python", "executable") \
        or (f.get("python") if isinstance(f.get("python"), str) else None)
    lib_dir = _get(f, "torch", "lib_dir") or f.get("torch_lib_dir")
    target: Target | None = None
    if lib_dir is None:
        try:
            target = resolve_target(python)
            lib_dir, python = str(target.lib_dir), target.python
        except G906Error as exc:
            return RcclDecision(STOP, f"cannot find torch to check its RCCL: {exc.message}", package=package,
                                hint=exc.hint)
    lib_dir = str(lib_dir)
    command = _command(package, python, lib_dir)

    has_gfx906 = _get(f, "rccl", "has_gfx906")
    if has_gfx906 is None:
        targets = (_get(f, "rccl", "offload_targets") or _get(f, "rccl", "gfx_targets")
                   or _get(f, "rccl", "gfx_archs"))
        if targets:
            has_gfx906 = any("gfx906" in str(t) for t in targets)
    if has_gfx906 is None:
        loaded = Path(lib_dir) / "librccl.so.1"
        if not loaded.exists():
            return RcclDecision(STOP, f"{loaded} does not exist, so g906 cannot give this torch a gfx906 RCCL",
                                package=package, lib_dir=lib_dir, python=python,
                                hint="install a ROCm build of torch (it bundles librccl.so.1), then rerun.")
        info = inspect_library(loaded, checksum=False)
        has_gfx906 = info.has_gfx906
    if has_gfx906:
        return RcclDecision(OK, "torch's RCCL has gfx906 code", package=package, lib_dir=lib_dir, python=python)

    why = f"tensor_parallel_size = {tp} on gfx906 needs an RCCL with gfx906 code; torch's bundled one has none"
    if not package:
        return RcclDecision(
            STOP, why, lib_dir=lib_dir, python=python, command=command,
            hint=f"run `{command}` with a gfx906 RCCL release, or name it in the recipe: "
                 f"[parallel] rccl = \"/path/rccl-gfx906-....tar.gz\"",
        )
    if not os.path.exists(package):
        return RcclDecision(STOP, f"the recipe's RCCL package {package} does not exist", package=package,
                            lib_dir=lib_dir, python=python, command=command,
                            hint="fix [parallel] rccl in the recipe (a tarball, folder or .so).")
    if dry_run:
        warnings = _check_package(package)
        return RcclDecision(INSTALL, why, package=package, lib_dir=lib_dir, python=python, command=command,
                            warnings=warnings)
    if not assume_yes:
        if not interactive:
            return RcclDecision(STOP, why + f"; installing {package} needs your confirmation", package=package,
                                lib_dir=lib_dir, python=python, command=command,
                                hint=f"rerun with --yes to let g906 install it, or run `{command}` first.")
        ask = confirm or _ask
        if not ask(f"Install {package} into {lib_dir} (the original is backed up; `g906 rccl rollback` restores it)?"):
            return RcclDecision(STOP, "RCCL install declined", package=package, lib_dir=lib_dir, python=python,
                                command=command, hint=f"run `{command}` when you are ready.")
    from g906.rccl.transaction import install

    if target is None:
        target = _target_from(lib_dir, python)
    res = install(package, target, probe=True, probe_backend="nccl", probe_world_size=tp,
                  log=log or (lambda s: print(s, file=sys.stderr)))
    return RcclDecision(INSTALLED, f"installed {package} into {lib_dir}", package=package, lib_dir=lib_dir,
                        python=python, command=command, result=res.to_json(), warnings=res.warnings)


def _target_from(lib_dir: str, python: str | None) -> Target:
    ld = Path(lib_dir)
    ver = read_torch_version(ld.parent)
    return Target(lib_dir=ld, python=python, torch_dir=ld.parent, torch_version=ver["version"],
                  hip_version=ver["hip"], cuda_version=ver["cuda"])


def _check_package(package: str) -> list[str]:
    """Validate the package now so a dry run shows a bad one (raises G906Error)."""
    import tempfile

    from g906.rccl.source import open_source

    with tempfile.TemporaryDirectory(prefix="g906-rccl-check-") as tmp:
        src = open_source(package, Path(tmp))
        try:
            return validate_new_library(inspect_library(src.path, checksum=False), source=src.display, force=False)
        finally:
            src.cleanup()
