"""Where g906 keeps RCCL backups, and the JSON manifest that describes one swap.

Layout, one area per target library directory::

    $G906_STATE_DIR (default $XDG_STATE_HOME/g906, else ~/.local/state/g906)
      rccl/<libdir-name>-<hash>/
        lock                 flock(2) lock for install/rollback on this target
        manifest.json        the current transaction (see Manifest)
        backup/<txn>/        the original librccl.so* files (symlinks kept as symlinks)
        staging/             libraries unpacked from tarballs while installing
        displaced/<time>/    files that rollback --force moved out of the way
        history/<txn>/       earlier transactions superseded by a torch reinstall
"""

from __future__ import annotations

import hashlib
import json
import os
import re
import shutil
from dataclasses import asdict, dataclass, field
from datetime import datetime, timezone
from pathlib import Path
from typing import Any

from g906.errors import G906Error
from g906.rccl.fsutil import write_bytes_durable

STATE_ENV = "G906_STATE_DIR"
MANIFEST_FORMAT = 1

# Transaction states stored in the manifest.
INSTALLING = "installing"
INSTALLED = "installed"
ROLLING_BACK = "rolling_back"
ROLLED_BACK = "rolled_back"
STATES = (INSTALLING, INSTALLED, ROLLING_BACK, ROLLED_BACK)


def now_iso() -> str:
    return datetime.now(timezone.utc).strftime("%Y-%m-%dT%H:%M:%SZ")


def state_root() -> Path:
    """The g906 state directory (G906_STATE_DIR overrides it; tests use that)."""
    env = os.environ.get(STATE_ENV)
    if env:
        return Path(env).expanduser()
    xdg = os.environ.get("XDG_STATE_HOME")
    base = Path(xdg).expanduser() if xdg else Path.home() / ".local" / "state"
    return base / "g906"


def area_for(lib_dir: Path, root: Path | None = None) -> Path:
    """The state area of one target library directory (keyed by its real path)."""
    real = os.path.realpath(lib_dir)
    digest = hashlib.sha256(real.encode()).hexdigest()[:16]
    parent = Path(real).parent.name or "root"
    label = re.sub(r"[^A-Za-z0-9_.-]", "_", f"{parent}-{Path(real).name}")[:60]
    return (root or state_root()) / "rccl" / f"{label}-{digest}"


@dataclass
class FileRecord:
    """One librccl.so* entry of the target as it was before g906 touched it."""

    name: str
    kind: str                      # "file" or "symlink"
    sha256: str | None = None      # files only
    size: int | None = None
    mode: int | None = None        # permission bits
    link: str | None = None        # symlinks only: the link text
    backup: str | None = None      # path of the backup, relative to the area

    @classmethod
    def from_json(cls, d: dict[str, Any]) -> "FileRecord":
        rec = cls(**{k: d.get(k) for k in cls.__dataclass_fields__})
        if not isinstance(rec.name, str) or rec.kind not in ("file", "symlink") or "/" in rec.name:
            raise ValueError(f"bad file record {d!r}")
        if rec.kind == "file" and not (isinstance(rec.sha256, str) and isinstance(rec.backup, str)):
            raise ValueError(f"file record without checksum or backup: {d!r}")
        if rec.kind == "symlink" and not isinstance(rec.link, str):
            raise ValueError(f"symlink record without target: {d!r}")
        return rec


@dataclass
class Manifest:
    txn: str
    state: str
    step: str
    lib_dir: str
    python: str | None
    torch_version: str | None
    source: str
    created: str
    updated: str
    original: list[FileRecord]
    destinations: list[str]          # names of the real files that receive the new library
    new: dict[str, Any]              # sha256, size, soname, rccl_version, gfx_archs, member
    g906_sha256: list[str] = field(default_factory=list)   # every library g906 wrote here
    events: list[dict[str, Any]] = field(default_factory=list)
    format: int = MANIFEST_FORMAT

    # -- derived ------------------------------------------------------------------------------
    def original_by_name(self) -> dict[str, FileRecord]:
        return {r.name: r for r in self.original}

    def backup_dir(self, area: Path) -> Path:
        return area / "backup" / self.txn

    def event(self, what: str, **extra: Any) -> None:
        self.events.append({"time": now_iso(), "event": what, **extra})
        del self.events[:-50]

    # -- (de)serialisation --------------------------------------------------------------------
    def to_json(self) -> dict[str, Any]:
        body = asdict(self)
        body["manifest_sha256"] = _body_digest(body)
        return body

    @classmethod
    def from_json(cls, d: Any) -> "Manifest":
        if not isinstance(d, dict):
            raise ValueError("not a JSON object")
        claimed = d.get("manifest_sha256")
        body = {k: v for k, v in d.items() if k != "manifest_sha256"}
        if claimed != _body_digest(body):
            raise ValueError("its checksum does not match its content (edited or truncated)")
        if body.get("format") != MANIFEST_FORMAT:
            raise ValueError(f"unknown manifest format {body.get('format')!r}")
        if body.get("state") not in STATES:
            raise ValueError(f"unknown state {body.get('state')!r}")
        original = [FileRecord.from_json(x) for x in body.get("original") or []]
        fields = {k: body.get(k) for k in cls.__dataclass_fields__ if k != "original"}
        m = cls(original=original, **fields)
        if not isinstance(m.txn, str) or not re.fullmatch(r"[A-Za-z0-9_.-]+", m.txn):
            raise ValueError("bad transaction id")
        if not isinstance(m.destinations, list) or not all(isinstance(x, str) and "/" not in x for x in m.destinations):
            raise ValueError("bad destinations")
        if not isinstance(m.new, dict) or not isinstance(m.new.get("sha256"), str):
            raise ValueError("no record of the installed library")
        m.g906_sha256 = list(m.g906_sha256 or [])
        m.events = list(m.events or [])
        return m


def _body_digest(body: dict[str, Any]) -> str:
    raw = json.dumps({k: v for k, v in body.items() if k != "manifest_sha256"}, sort_keys=True)
    return hashlib.sha256(raw.encode()).hexdigest()


class DamagedManifest(G906Error):
    pass


def manifest_path(area: Path) -> Path:
    return area / "manifest.json"


def load_manifest(area: Path) -> Manifest | None:
    """The area's manifest, None when there is none; DamagedManifest when unreadable."""
    path = manifest_path(area)
    try:
        raw = path.read_bytes()
    except FileNotFoundError:
        return None
    except OSError as exc:
        raise DamagedManifest(
            f"cannot read the RCCL manifest {path}: {exc.strerror}.",
            hint="check the permissions of the g906 state directory (G906_STATE_DIR).",
        ) from None
    try:
        return Manifest.from_json(json.loads(raw))
    except (ValueError, TypeError, KeyError) as exc:
        raise DamagedManifest(
            f"the RCCL manifest {path} is damaged: {exc}.",
            hint=(
                f"g906 will not guess what to restore. The backed-up originals are kept under "
                f"{area / 'backup'}; restore them by hand, or reinstall torch, then move {path} away."
            ),
        ) from None


def save_manifest(area: Path, manifest: Manifest, *, step: str) -> None:
    manifest.step = step
    manifest.updated = now_iso()
    data = json.dumps(manifest.to_json(), indent=2).encode() + b"\n"
    write_bytes_durable(manifest_path(area), data)


def archive_manifest(area: Path, manifest: Manifest) -> Path:
    """Record a superseded transaction under history/<txn>/ (its backup follows it there
    through collect_garbage once the new manifest is in place)."""
    dest = area / "history" / manifest.txn
    dest.mkdir(parents=True, exist_ok=True)
    write_bytes_durable(dest / "manifest.json", json.dumps(manifest.to_json(), indent=2).encode() + b"\n")
    return dest


def collect_garbage(area: Path, current: Manifest | None) -> None:
    """Tidy backup/: the current transaction's folder stays; a superseded one (with a history
    record) moves to history/<txn>/backup; anything else is an unfinished backup from a killed
    run that no manifest refers to, and is removed."""
    backups = area / "backup"
    if not backups.is_dir():
        return
    keep = current.txn if current else None
    for entry in backups.iterdir():
        if entry.name == keep:
            continue
        hist = area / "history" / entry.name
        if (hist / "manifest.json").is_file():
            target = hist / "backup"
            if target.exists():
                shutil.rmtree(target, ignore_errors=True)
            os.replace(entry, target)
        elif entry.is_dir() and not entry.is_symlink():
            shutil.rmtree(entry, ignore_errors=True)
        else:
            entry.unlink(missing_ok=True)
