"""The RCCL swap as a transaction: install, rollback and status of one torch/lib folder.

Shape (after pip's stashed uninstall): back up first, then swap each file with one atomic
os.replace, and write down every state change in a checksummed manifest before moving on.
The named steps in faults.py mark the points a kill can land between; whatever the step,
each destination holds one complete library (the original or the new one), the backup is
complete whenever the manifest names it, and re-running install or rollback finishes the job.
"""

from __future__ import annotations

import os
import secrets
import shutil
import stat
import sys
from contextlib import contextmanager
from dataclasses import asdict, dataclass, field
from datetime import datetime, timezone
from pathlib import Path
from typing import Any, Callable

from g906.errors import G906Error, UsageError
from g906.rccl import state as st
from g906.rccl.faults import fault
from g906.rccl.fsutil import copy_durable, fsync_dir, sha256_file, symlink_atomic
from g906.rccl.libinfo import LibraryInfo, describe, inspect_library, validate_new_library
from g906.rccl.lock import TargetLock
from g906.rccl.probe import OK, UNAVAILABLE, run_probe
from g906.rccl.source import clean_stale_staging, open_source
from g906.rccl.target import Entry, Target, list_rccl_entries, locate_torch

Log = Callable[[str], None]
TMP_SUFFIXES = (".g906-new", ".g906-restore")


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
    action: str                       # installed | dry_run
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


# --- helpers ---------------------------------------------------------------------------------

def _txn_id() -> str:
    """Unique per transaction (never reuses the name of an earlier backup or history folder)."""
    return datetime.now(timezone.utc).strftime("%Y%m%dT%H%M%SZ") + f"-{os.getpid()}-{secrets.token_hex(4)}"


def _mode(path: Path) -> int:
    return stat.S_IMODE(os.stat(path).st_mode)


def _clean_lib_temps(lib_dir: Path) -> None:
    """Remove g906's own half-written temporaries (dot-names ending .g906-new/.g906-restore)."""
    try:
        names = os.listdir(lib_dir)
    except OSError:
        return
    for name in names:
        if name.startswith(".librccl") and name.endswith(TMP_SUFFIXES):
            try:
                os.unlink(lib_dir / name)
            except OSError:
                pass


def _check_writable(lib_dir: Path, area: Path) -> None:
    if not os.access(lib_dir, os.W_OK | os.X_OK):
        raise G906Error(
            f"{lib_dir} is not writable by this user.",
            hint="use an environment you own (a venv), or run g906 with the rights to change that torch "
                 "(then also keep G906_STATE_DIR the same for rollback).",
        )
    try:
        area.mkdir(parents=True, exist_ok=True)
    except OSError as exc:
        raise G906Error(f"cannot create the g906 state folder {area}: {exc.strerror or exc}.",
                        hint="set G906_STATE_DIR to a writable folder.") from None


def _check_space(folder: Path, need: int, what: str | None) -> None:
    """Refuse early when *folder*'s file system cannot hold *need* bytes (plus a margin)."""
    if not what or need <= 0:
        return
    probe_dir = folder
    while not probe_dir.exists() and probe_dir != probe_dir.parent:
        probe_dir = probe_dir.parent
    try:
        free = shutil.disk_usage(probe_dir).free
    except OSError:
        return
    if free < need + (16 << 20):
        raise G906Error(
            f"not enough free space in {folder} for {what}: {need / 2**20:.0f} MiB needed, {free / 2**20:.0f} MiB free.",
            hint="free some disk space (or point G906_STATE_DIR at a bigger disk), then rerun; nothing was changed.",
        )


@contextmanager
def _os_errors(what: str, lib_dir: Path):
    """A file-system failure mid-way (disk full, permissions) becomes a message. Each library in
    torch/lib is still one complete file (only os.replace changes them), so a rerun finishes."""
    try:
        yield
    except OSError as exc:
        where = f" ({exc.filename})" if getattr(exc, "filename", None) else ""
        raise G906Error(
            f"{what} stopped: {exc.strerror or exc}{where}. Every library in {lib_dir} is still complete "
            f"(either the original or the new one).",
            hint=f"fix the cause (disk space, permissions), then rerun `g906 rccl {what}` to finish; "
                 f"`g906 rccl status` shows where things stand.",
        ) from None


def _snapshot(lib_dir: Path) -> tuple[list[Entry], dict[str, str]]:
    entries = list_rccl_entries(lib_dir)
    other = [e.name for e in entries if e.kind == "other"]
    if other:
        raise G906Error(f"{lib_dir / other[0]} is neither a file nor a symlink.",
                        hint="remove or fix it by hand; g906 only swaps regular files.")
    shas = {e.name: sha256_file(lib_dir / e.name) for e in entries if e.kind == "file"}
    return entries, shas


def _require_rccl(lib_dir: Path, entries: list[Entry]) -> None:
    if not entries:
        raise G906Error(
            f"{lib_dir} holds no librccl.so*: this torch does not bundle RCCL (not a ROCm wheel, or it uses "
            f"the system's RCCL).",
            hint="g906 swaps the RCCL inside a ROCm build of torch; install torch from the ROCm wheel index, "
                 "or check --python / --lib-dir.",
        )
    if not any(e.kind == "file" for e in entries):
        links = ", ".join(f"{e.name} -> {e.link}" for e in entries)
        raise G906Error(
            f"every librccl in {lib_dir} is a symlink ({links}); there is no bundled copy to swap.",
            hint="g906 only replaces files inside torch/lib; change the linked library with your ROCm packages.",
        )


def _known(m: st.Manifest, name: str) -> set[str]:
    rec = m.original_by_name().get(name)
    out = set(m.g906_sha256)
    if rec and rec.kind == "file" and rec.sha256:
        out.add(rec.sha256)
    return out


def _consistent(m: st.Manifest, entries: list[Entry], shas: dict[str, str]) -> str | None:
    """None when the target is in a state this manifest explains; else why not."""
    orig = m.original_by_name()
    now_files = {e.name for e in entries if e.kind == "file"}
    if set(m.destinations) != now_files:
        return (f"the librccl files are now {', '.join(sorted(now_files)) or 'none'} where g906 recorded "
                f"{', '.join(sorted(m.destinations))}")
    for name, sha in shas.items():
        if sha not in _known(m, name):
            rec = orig.get(name)
            return (f"{name} (sha256 {sha[:12]}) matches neither the original ({(rec.sha256 or '?')[:12] if rec else '?'}) "
                    f"nor a library g906 installed")
    return None


def verify_backup(area: Path, m: st.Manifest) -> None:
    for rec in m.original:
        path = area / rec.backup if rec.backup else None
        if rec.kind == "file":
            if path is None or not path.is_file():
                raise G906Error(
                    f"the backup of {rec.name} is missing ({path}).",
                    hint="g906 cannot restore without it; reinstall torch to get the original library back.",
                )
            got = sha256_file(path)
            if got != rec.sha256:
                raise G906Error(
                    f"the backup of {rec.name} at {path} is damaged (sha256 {got[:12]}, expected {rec.sha256[:12]}).",
                    hint="g906 will not restore a damaged file; reinstall torch to get the original library back.",
                )


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
        entries, shas = _snapshot(lib_dir)
        _require_rccl(lib_dir, entries)
        manifest = st.load_manifest(area)
        dests = [e.name for e in entries if e.kind == "file"]
        settled = manifest is None or manifest.state in (st.INSTALLED, st.ROLLED_BACK)
        if settled and all(shas[d] == new.sha256 for d in dests):
            raise G906Error(
                f"{lib_dir / dests[0]} is already this library (sha256 {new.sha256[:12]}); nothing to do.",
                hint="`g906 rccl status` shows what is installed; `g906 rccl rollback` restores the original.",
            )
        result = InstallResult(
            action="dry_run" if dry_run else "installed", lib_dir=str(lib_dir), python=target.python,
            torch_version=target.torch_version, source=src.display, new=new.to_json(), destinations=dests,
            original=[{"name": e.name, "kind": e.kind, "link": e.link, "sha256": shas.get(e.name)} for e in entries],
            backup_dir=None, manifest=str(st.manifest_path(area)), warnings=list(warnings),
        )
        if dry_run:
            if manifest is not None and _consistent(manifest, entries, shas) is None:
                result.notes.append(f"the existing backup ({manifest.state}) of the original library would be kept")
                result.backup_dir = str(manifest.backup_dir(area))
            else:
                result.notes.append(f"would back up {', '.join(e.name for e in entries)} to {area / 'backup'}")
            result.notes.append(f"would replace {', '.join(dests)} with {src.display} ({describe(new)})")
            if probe:
                result.notes.append(f"would then run the probe (backend {probe_backend}, world size {probe_world_size})")
            return result
        _check_writable(lib_dir, area)
        _check_space(lib_dir, new.size or 0, "the new library")
        _check_space(area, sum(os.path.getsize(lib_dir / e.name) for e in entries if e.kind == "file"),
                     "the backup" if manifest is None or _consistent(manifest, entries, shas) else None)
        with TargetLock(area, lib_dir), _os_errors("install", lib_dir):
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
    _clean_lib_temps(lib_dir)
    entries, shas = _snapshot(lib_dir)          # again, under the lock
    _require_rccl(lib_dir, entries)
    old = st.load_manifest(area)
    why = _consistent(old, entries, shas) if old else "no manifest"
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
        txn = _txn_id()
        bdir = area / "backup" / txn
        bdir.mkdir(parents=True, exist_ok=True)
        records: list[st.FileRecord] = []
        first = True
        for e in entries:
            src = lib_dir / e.name
            if e.kind == "symlink":
                link = bdir / e.name
                if os.path.lexists(link):
                    os.unlink(link)
                os.symlink(e.link, link)
                records.append(st.FileRecord(e.name, "symlink", link=e.link))
                continue
            part = bdir / f".{e.name}.part"
            mode = _mode(src)
            log(f"backing up {src} -> {bdir / e.name}")
            sha = copy_durable(src, part, mode=mode)
            if first:
                fault("backup_partial")
                first = False
            if sha != shas[e.name]:
                raise G906Error(f"{src} changed while g906 was backing it up.",
                                hint="make sure nothing else (pip, uv, conda) is changing this environment, then retry.")
            os.replace(part, bdir / e.name)
            records.append(st.FileRecord(e.name, "file", sha256=sha, size=os.path.getsize(bdir / e.name),
                                         mode=mode, backup=f"backup/{txn}/{e.name}"))
        fsync_dir(bdir)
        fsync_dir(bdir.parent)
        fault("backup_done")
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
            if _mode(dest) != mode:
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


def _rollback_plan(lib_dir: Path, m: st.Manifest) -> list[dict[str, Any]]:
    rows = []
    for rec in m.original:
        p = lib_dir / rec.name
        row: dict[str, Any] = {"name": rec.name, "kind": rec.kind, "sha256": None}
        if not os.path.lexists(p):
            row["status"] = "missing"
        elif rec.kind == "symlink":
            if p.is_symlink() and os.readlink(p) == rec.link:
                row["status"] = "original"
            elif p.is_file() and not p.is_symlink() and sha256_file(p) in m.g906_sha256:
                row["status"] = "g906"
            else:
                row["status"] = "unknown"
        elif p.is_symlink() or not p.is_file():
            row["status"] = "unknown"
        else:
            sha = row["sha256"] = sha256_file(p)
            if sha == rec.sha256:
                row["status"] = "original"
            elif sha in m.g906_sha256:
                row["status"] = "g906"
            else:
                row["status"] = "unknown"
        mode_ok = rec.kind != "file" or row["status"] != "original" or _mode(p) == rec.mode
        row["action"] = "keep" if row["status"] == "original" and mode_ok else (
            "chmod" if row["status"] == "original" else "restore")
        rows.append(row)
    return rows


def rollback(target: Target, *, force: bool = False, dry_run: bool = False, root: Path | None = None,
             log: Log = _nolog) -> RollbackResult:
    lib_dir = target.lib_dir
    area = st.area_for(lib_dir, root)
    m = st.load_manifest(area)
    if m is None:
        raise _no_backup(lib_dir, area)
    if dry_run:
        verify_backup(area, m)
        rows = _rollback_plan(lib_dir, m)
        res = RollbackResult("dry_run", str(lib_dir), rows, str(m.backup_dir(area)), str(st.manifest_path(area)))
        unknown = [r["name"] for r in rows if r["status"] == "unknown"]
        if unknown and not force:
            res.warnings.append(_changed_message(lib_dir, m, unknown, target))
        return res
    _check_writable(lib_dir, area)
    with TargetLock(area, lib_dir), _os_errors("rollback", lib_dir):
        fault("rollback_locked")
        m = st.load_manifest(area)
        if m is None:
            raise _no_backup(lib_dir, area)
        return _rollback_locked(lib_dir, area, m, force=force, log=log, target=target)


def _changed_message(lib_dir: Path, m: st.Manifest, unknown: list[str], target: Target | None) -> str:
    msg = (f"{', '.join(unknown)} in {lib_dir} changed since g906 touched it: it matches neither the original "
           f"torch library nor the one g906 installed")
    if target is not None and target.torch_version and m.torch_version and target.torch_version != m.torch_version:
        msg += f" (torch was {m.torch_version}, now {target.torch_version}: torch was reinstalled)"
    else:
        msg += " (torch was probably reinstalled, or another tool replaced it)"
    return msg


def _rollback_locked(lib_dir: Path, area: Path, m: st.Manifest, *, force: bool, log: Log,
                     target: Target | None = None) -> RollbackResult:
    verify_backup(area, m)
    _clean_lib_temps(lib_dir)
    rows = _rollback_plan(lib_dir, m)
    res = RollbackResult("rolled_back", str(lib_dir), rows, str(m.backup_dir(area)), str(st.manifest_path(area)))
    unknown = [r["name"] for r in rows if r["status"] == "unknown"]
    if unknown and not force:
        raise G906Error(
            _changed_message(lib_dir, m, unknown, target) + "; g906 will not overwrite it.",
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
        ddir = area / "displaced" / _txn_id()
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
    rows = _rollback_plan(lib_dir, m)
    out["g906_swap"] = bool(active and active.sha256 in m.g906_sha256 and m.state == st.INSTALLED)
    unknown = [r["name"] for r in rows if r["status"] == "unknown"]
    if unknown:
        out["messages"].append(_changed_message(lib_dir, m, unknown, target))
    if m.state in (st.INSTALLING, st.ROLLING_BACK):
        what = "an install" if m.state == st.INSTALLING else "a rollback"
        out["messages"].append(f"{what} was interrupted at step {m.step!r}: rerun `g906 rccl install SOURCE` to "
                               f"finish it, or `g906 rccl rollback` to restore the original")
    return out
