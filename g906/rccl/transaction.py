"""The RCCL swap as a transaction: install, rollback and status of one torch/lib folder.

Shape (after pip's stashed uninstall): back up first, then swap each file with one atomic
os.replace, and write down every state change in a checksummed manifest before moving on.
The named steps in faults.py mark the points a kill can land between; whatever the step,
each destination holds one complete library (the original or the new one), the backup is
complete whenever the manifest names it, and re-running install or rollback finishes the job.

The steps live here; stash.py takes and verifies the backup, inventory.py compares torch/lib with
the manifest (state.py), guards.py refuses early (permissions, disk space).
"""

from __future__ import annotations

import os
import sys
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any, Callable

from g906.errors import G906Error, UsageError
from g906.rccl import state as st
from g906.rccl.faults import fault
from g906.rccl.fsutil import copy_durable, fsync_dir, sha256_file, symlink_atomic
from g906.rccl.guards import check_space, check_writable, os_errors
from g906.rccl.inventory import (changed_message, clean_lib_temps, file_mode, require_rccl, rollback_plan, snapshot,
                                 why_inconsistent)
from g906.rccl.libinfo import LibraryInfo, describe, inspect_library, validate_new_library
from g906.rccl.lock import TargetLock
from g906.rccl.probe import OK, UNAVAILABLE, run_probe
from g906.rccl.source import clean_stale_staging, open_source
from g906.rccl.stash import stash_originals, txn_id, verify_backup
from g906.rccl.target import Target, list_rccl_entries, locate_torch

Log = Callable[[str], None]


def _nolog(_: str) -> None:
    pass


class NoBackup(G906Error):
    pass


class ProbeFailed(G906Error):
    def __init__(self, message: str, hint: str | None, *, details: list[str], result: dict[str, Any]):
        super().__init__(message, hint, details=details)
        self.result = result

    def to_json(self) -> dict:
        d = super().to_json()
        d["result"] = self.result
        return d


@dataclass
class InstallResult:
    action: str                       # installed | dry_run | already_installed
    lib_dir: str
    python: str | None
    torch_version: str | None
    source: str
    new: dict[str, Any]
    destinations: list[str]
    original: list[dict[str, Any]]
    backup_dir: str | None
    manifest: str | None
    resumed: bool = False
    probe: dict[str, Any] | None = None
    warnings: list[str] = field(default_factory=list)
    notes: list[str] = field(default_factory=list)

    def to_json(self) -> dict[str, Any]:
        return asdict(self)


@dataclass
class RollbackResult:
    action: str                       # rolled_back | already_rolled_back | dry_run
    lib_dir: str
    files: list[dict[str, Any]]       # name, kind, status before, action
    backup_dir: str | None
    manifest: str | None
    displaced: list[str] = field(default_factory=list)
    warnings: list[str] = field(default_factory=list)

    def to_json(self) -> dict[str, Any]:
        return asdict(self)


def _probe_python(target: Target, log: Log) -> str | None:
    if target.python:
        return target.python
    try:
        if os.path.realpath(locate_torch(sys.executable) / "lib") == os.path.realpath(target.lib_dir):
            return sys.executable
    except G906Error:
        pass
    return None


# --- install ---------------------------------------------------------------------------------

def install(
    source: str | os.PathLike,
    target: Target,
    *,
    force: bool = False,
    dry_run: bool = False,
    probe: bool = True,
    probe_backend: str = "nccl",
    probe_world_size: int = 2,
    probe_timeout: float = 180,
    root: Path | None = None,
    log: Log = _nolog,
) -> InstallResult:
    if probe and probe_backend not in ("nccl", "gloo"):
        raise UsageError(f"unknown probe backend {probe_backend!r}.",
                         hint="use --probe-backend nccl (RCCL on ROCm) or gloo.")
    lib_dir = target.lib_dir
    area = st.area_for(lib_dir, root)
    src = open_source(source, area / "staging")
    try:
        new = inspect_library(src.path)
        warnings = validate_new_library(new, source=src.display, force=force)
        for w in warnings:
            log(w)
        entries, shas = snapshot(lib_dir)
        require_rccl(lib_dir, entries)
        manifest = st.load_manifest(area)
        dests = [e.name for e in entries if e.kind == "file"]
        settled = manifest is None or manifest.state in (st.INSTALLED, st.ROLLED_BACK)
        already = settled and all(shas[d] == new.sha256 for d in dests)
        result = InstallResult(
            action="already_installed" if already else "dry_run" if dry_run else "installed", lib_dir=str(lib_dir), python=target.python,
            torch_version=target.torch_version, source=src.display, new=new.to_json(), destinations=dests,
            original=[{"name": e.name, "kind": e.kind, "link": e.link, "sha256": shas.get(e.name)} for e in entries],
            backup_dir=None, manifest=str(st.manifest_path(area)), warnings=list(warnings),
        )
        if already:   # the wanted end state holds: success, and nothing is touched
            result.notes.append(f"{lib_dir / dests[0]} is already this library (sha256 {new.sha256[:12]}); "
                                "nothing to do. `g906 rccl status` shows what is installed; `g906 rccl rollback` "
                                "restores the original.")
            return result
        if dry_run:
            if manifest is not None and why_inconsistent(manifest, entries, shas) is None:
                result.notes.append(f"the existing backup ({manifest.state}) of the original library would be kept")
                result.backup_dir = str(manifest.backup_dir(area))
            else:
                result.notes.append(f"would back up {', '.join(e.name for e in entries)} to {area / 'backup'}")
            result.notes.append(f"would replace {', '.join(dests)} with {src.display} ({describe(new)})")
            if probe:
                result.notes.append(f"would then run the probe (backend {probe_backend}, world size {probe_world_size})")
            return result
        check_writable(lib_dir, area)
        check_space(lib_dir, new.size or 0, "the new library")
        check_space(area, sum(os.path.getsize(lib_dir / e.name) for e in entries if e.kind == "file"),
                     "the backup" if manifest is None or why_inconsistent(manifest, entries, shas) else None)
        with TargetLock(area, lib_dir), os_errors("install", lib_dir):
            fault("install_locked")
            m = _install_locked(src.path, src.display, new, target, area, result, log)
            if probe:
                _probe_after_install(target, area, m, result, probe_backend, probe_world_size, probe_timeout, log)
        return result
    finally:
        src.cleanup()


def _install_locked(src_path: Path, display: str, new: LibraryInfo, target: Target, area: Path,
                    result: InstallResult, log: Log) -> st.Manifest:
    lib_dir = target.lib_dir
    clean_stale_staging(area / "staging")
    clean_lib_temps(lib_dir)
    entries, shas = snapshot(lib_dir)          # again, under the lock
    require_rccl(lib_dir, entries)
    old = st.load_manifest(area)
    why = why_inconsistent(old, entries, shas) if old else "no manifest"
    new_info = {k: v for k, v in new.to_json().items() if k != "path"}
    new_info["source"] = display

    if old is not None and why is None:
        m = old
        verify_backup(area, m)
        result.resumed = m.state in (st.INSTALLING, st.ROLLING_BACK)
        if result.resumed:
            result.notes.append(f"finishing an interrupted {m.state.replace('_', ' ')} (step {m.step})")
        if new.sha256 not in m.g906_sha256:
            m.g906_sha256.append(new.sha256)
        m.new, m.source, m.state = new_info, display, st.INSTALLING
        m.python, m.torch_version = target.python or m.python, target.torch_version or m.torch_version
        m.event("install", source=display, sha256=new.sha256)
        log(f"keeping the existing backup of the original library ({m.backup_dir(area)})")
    else:
        if old is not None:
            result.notes.append(f"torch's RCCL changed since g906's last swap ({why}); backing up the current "
                                f"files as the new original (the earlier record is kept in {area / 'history' / old.txn})")
            st.archive_manifest(area, old)
        txn, records = stash_originals(lib_dir, area, entries, shas, log)
        now = st.now_iso()
        m = st.Manifest(
            txn=txn, state=st.INSTALLING, step="", lib_dir=str(lib_dir), python=target.python,
            torch_version=target.torch_version, source=display, created=now, updated=now, original=records,
            destinations=[e.name for e in entries if e.kind == "file"], new=new_info, g906_sha256=[new.sha256],
        )
        m.event("backup", files=[r.name for r in records])
        m.event("install", source=display, sha256=new.sha256)
    st.save_manifest(area, m, step="manifest_written")
    fault("manifest_written")
    st.collect_garbage(area, m)
    result.backup_dir = str(m.backup_dir(area))
    result.original = [asdict(r) for r in m.original]
    result.destinations = list(m.destinations)

    orig = m.original_by_name()
    for name in m.destinations:
        dest = lib_dir / name
        mode = orig[name].mode if name in orig and orig[name].mode is not None else 0o755
        if sha256_file(dest) == new.sha256:
            if file_mode(dest) != mode:
                os.chmod(dest, mode)
            continue
        tmp = lib_dir / f".{name}.g906-new"
        log(f"writing {dest}")
        sha = copy_durable(src_path, tmp, mode=mode)
        if sha != new.sha256:
            os.unlink(tmp)
            raise G906Error(f"{display} changed while g906 was reading it.", hint="retry once the file is complete.")
        fault("staged")
        os.replace(tmp, dest)
        fault("replaced")
        fsync_dir(lib_dir)
    for name in m.destinations:
        got = sha256_file(lib_dir / name)
        if got != new.sha256:  # pragma: no cover - would mean the disk lies
            raise G906Error(f"{lib_dir / name} does not hold what g906 wrote (sha256 {got[:12]}).",
                            hint="run `g906 rccl rollback` to restore the original, then check the disk.")
    fault("verified")
    m.state = st.INSTALLED
    m.event("installed", sha256=new.sha256)
    st.save_manifest(area, m, step="recorded")
    fault("recorded")
    log(f"installed {display} into {lib_dir} ({describe(new)})")
    return m


def _probe_after_install(target: Target, area: Path, m: st.Manifest, result: InstallResult, backend: str,
                         world_size: int, timeout: float, log: Log) -> None:
    python = _probe_python(target, log)
    if python is None:
        msg = (f"not probing: no Python interpreter is known for {target.lib_dir}; "
               f"run `g906 rccl probe --python <that env's python>` to check it")
        result.warnings.append(msg)
        log(msg)
        return
    fault("probe_started")
    log(f"probing with {python} (backend {backend}, world size {world_size}) ...")
    res = run_probe(python, world_size=world_size, backend=backend, timeout=timeout)
    result.probe = res.to_json()
    if res.status == OK:
        log(res.summary)
        return
    if res.status == UNAVAILABLE:
        msg = f"the probe could not run ({res.summary}); the new library stays installed, run `g906 rccl probe` where the GPUs are"
        result.warnings.append(msg)
        log(msg)
        return
    log(f"probe failed: {res.summary}; rolling back")
    tail = res.output.strip().splitlines()[-40:]
    try:
        rb = _rollback_locked(target.lib_dir, area, m, force=False, log=log)
    except G906Error as exc:
        raise G906Error(
            f"the probe failed after installing ({res.summary}), and the automatic rollback failed too: {exc.message}",
            hint=exc.hint or "run `g906 rccl rollback` to restore the original library.",
            details=["probe output (last lines):", *tail],
        ) from None
    raise ProbeFailed(
        f"the probe failed after installing, so g906 restored the original library: {res.summary}.",
        hint=(res.hint + "; then run the install again" if res.hint else
              "fix the library, then run the install again (or skip the check with --no-probe)"),
        details=["probe output (last lines):", *tail, f"rollback: {rb.action}"],
        result={"install": result.to_json(), "probe": res.to_json(), "rollback": rb.to_json()},
    )


# --- rollback --------------------------------------------------------------------------------

def _no_backup(lib_dir: Path, area: Path) -> NoBackup:
    return NoBackup(
        f"there is no g906 backup for {lib_dir}: g906 has not swapped its RCCL (looked in {area}).",
        hint="`g906 rccl status` shows what is in place; if you installed with another G906_STATE_DIR, set it again.",
    )


def rollback(target: Target, *, force: bool = False, dry_run: bool = False, root: Path | None = None,
             log: Log = _nolog) -> RollbackResult:
    lib_dir = target.lib_dir
    area = st.area_for(lib_dir, root)
    m = st.load_manifest(area)
    if m is None:
        raise _no_backup(lib_dir, area)
    if dry_run:
        verify_backup(area, m)
        rows = rollback_plan(lib_dir, m)
        res = RollbackResult("dry_run", str(lib_dir), rows, str(m.backup_dir(area)), str(st.manifest_path(area)))
        unknown = [r["name"] for r in rows if r["status"] == "unknown"]
        if unknown and not force:
            res.warnings.append(changed_message(lib_dir, m, unknown, target))
        return res
    check_writable(lib_dir, area)
    with TargetLock(area, lib_dir), os_errors("rollback", lib_dir):
        fault("rollback_locked")
        m = st.load_manifest(area)
        if m is None:
            raise _no_backup(lib_dir, area)
        return _rollback_locked(lib_dir, area, m, force=force, log=log, target=target)


def _rollback_locked(lib_dir: Path, area: Path, m: st.Manifest, *, force: bool, log: Log,
                     target: Target | None = None) -> RollbackResult:
    verify_backup(area, m)
    clean_lib_temps(lib_dir)
    rows = rollback_plan(lib_dir, m)
    res = RollbackResult("rolled_back", str(lib_dir), rows, str(m.backup_dir(area)), str(st.manifest_path(area)))
    unknown = [r["name"] for r in rows if r["status"] == "unknown"]
    if unknown and not force:
        raise G906Error(
            changed_message(lib_dir, m, unknown, target) + "; g906 will not overwrite it.",
            hint="if the current torch works, there is nothing to roll back (check `g906 rccl status`); to put the "
                 "backed-up original back anyway, rerun with --force (the current file is saved first).",
        )
    if all(r["action"] == "keep" for r in rows):
        res.action = "already_rolled_back"
        if m.state != st.ROLLED_BACK:
            m.state = st.ROLLED_BACK
            m.event("rolled_back", note="originals were already in place")
            st.save_manifest(area, m, step="rollback_recorded")
        log(f"the original library is already in place in {lib_dir}")
        return res
    m.state = st.ROLLING_BACK
    m.event("rollback")
    st.save_manifest(area, m, step="rollback_marked")
    fault("rollback_marked")
    if unknown:
        ddir = area / "displaced" / txn_id()
        ddir.mkdir(parents=True, exist_ok=True)
        for name in unknown:
            p = lib_dir / name
            kept = ddir / name
            if p.is_symlink():
                os.symlink(os.readlink(p), kept)
            else:
                copy_durable(p, kept)
            res.displaced.append(str(kept))
            log(f"--force: saved the current {p} to {kept}")
        fsync_dir(ddir)
        m.event("displaced", files=res.displaced)
    for rec, row in zip(m.original, rows):
        dest = lib_dir / rec.name
        if row["action"] == "keep":
            continue
        if rec.kind == "symlink":
            if os.path.isdir(dest) and not dest.is_symlink():
                raise G906Error(f"{dest} is now a folder.", hint="move it away by hand, then rerun the rollback.")
            symlink_atomic(rec.link, dest)
            continue
        if row["action"] == "chmod":
            os.chmod(dest, rec.mode)
            continue
        tmp = lib_dir / f".{rec.name}.g906-restore"
        log(f"restoring {dest}")
        sha = copy_durable(area / rec.backup, tmp, mode=rec.mode)
        if sha != rec.sha256:
            os.unlink(tmp)
            raise G906Error(f"the backup of {rec.name} changed while g906 was reading it.",
                            hint="check the disk of the g906 state folder, then rerun the rollback.")
        fault("restore_staged")
        if os.path.isdir(dest) and not dest.is_symlink():
            os.unlink(tmp)
            raise G906Error(f"{dest} is now a folder.", hint="move it away by hand, then rerun the rollback.")
        os.replace(tmp, dest)
        fault("restored")
        fsync_dir(lib_dir)
    for rec in m.original:
        dest = lib_dir / rec.name
        ok = (dest.is_symlink() and os.readlink(dest) == rec.link) if rec.kind == "symlink" else (
            dest.is_file() and not dest.is_symlink() and sha256_file(dest) == rec.sha256)
        if not ok:  # pragma: no cover - would mean the disk lies
            raise G906Error(f"{dest} does not match the backup after restoring it.",
                            hint="rerun `g906 rccl rollback`; if it persists, check the disk.")
    fault("rollback_verified")
    m.state = st.ROLLED_BACK
    m.event("rolled_back")
    st.save_manifest(area, m, step="rollback_recorded")
    fault("rollback_recorded")
    log(f"restored the original library in {lib_dir}")
    return res


# --- status ----------------------------------------------------------------------------------

def status(target: Target, *, root: Path | None = None) -> dict[str, Any]:
    lib_dir = target.lib_dir
    area = st.area_for(lib_dir, root)
    entries = list_rccl_entries(lib_dir)
    files = []
    for e in entries:
        row: dict[str, Any] = {"name": e.name, "kind": e.kind, "link": e.link}
        if e.kind == "file":
            row["library"] = inspect_library(lib_dir / e.name).to_json()
        files.append(row)
    loaded = lib_dir / "librccl.so.1"
    active: LibraryInfo | None = None
    if loaded.exists():
        active = inspect_library(Path(os.path.realpath(loaded)))
    out: dict[str, Any] = {
        "lib_dir": str(lib_dir), "python": target.python, "torch_version": target.torch_version,
        "hip_version": target.hip_version, "files": files,
        "active": active.to_json() if active else None,
        "has_gfx906": bool(active and active.has_gfx906),
        "g906_swap": False, "backup": None, "state": None, "messages": [], "manifest": str(st.manifest_path(area)),
    }
    if active is None:
        out["messages"].append(
            f"{loaded} does not exist: this torch does not bundle RCCL" if not entries else f"{loaded} is missing or a broken link")
    try:
        m = st.load_manifest(area)
    except st.DamagedManifest as exc:
        out["state"] = "damaged"
        out["messages"].append(exc.message)
        return out
    if m is None:
        out["messages"].append("g906 has not swapped this RCCL (no backup)")
        return out
    out["state"] = m.state
    out["transaction"] = {"txn": m.txn, "created": m.created, "updated": m.updated, "step": m.step,
                          "source": m.source, "torch_version": m.torch_version, "new_sha256": m.new.get("sha256"),
                          "new_rccl_version": m.new.get("rccl_version")}
    try:
        verify_backup(area, m)
        out["backup"] = {"dir": str(m.backup_dir(area)), "ok": True, "files": [r.name for r in m.original]}
    except G906Error as exc:
        out["backup"] = {"dir": str(m.backup_dir(area)), "ok": False, "error": exc.message}
        out["messages"].append(exc.message)
    rows = rollback_plan(lib_dir, m)
    out["g906_swap"] = bool(active and active.sha256 in m.g906_sha256 and m.state == st.INSTALLED)
    unknown = [r["name"] for r in rows if r["status"] == "unknown"]
    if unknown:
        out["messages"].append(changed_message(lib_dir, m, unknown, target))
    if m.state in (st.INSTALLING, st.ROLLING_BACK):
        what = "an install" if m.state == st.INSTALLING else "a rollback"
        out["messages"].append(f"{what} was interrupted at step {m.step!r}: rerun `g906 rccl install SOURCE` to "
                               f"finish it, or `g906 rccl rollback` to restore the original")
    return out
