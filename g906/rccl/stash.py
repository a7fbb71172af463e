"""The stash of torch's original libraries: copied aside (backup/<txn>/) before any swap, as
in pip's stashed uninstall, and verified against their checksums before every restore."""

from __future__ import annotations

import os
import secrets
from datetime import datetime, timezone
from pathlib import Path
from typing import Callable

from g906.errors import G906Error
from g906.rccl import state as st
from g906.rccl.faults import fault
from g906.rccl.fsutil import copy_durable, fsync_dir, sha256_file
from g906.rccl.inventory import file_mode
from g906.rccl.target import Entry


def txn_id() -> str:
    """Unique per transaction (never reuses the name of an earlier backup or history folder)."""
    return datetime.now(timezone.utc).strftime("%Y%m%dT%H%M%SZ") + f"-{os.getpid()}-{secrets.token_hex(4)}"


def stash_originals(lib_dir: Path, area: Path, entries: list[Entry], shas: dict[str, str],
                    log: Callable[[str], None]) -> tuple[str, list[st.FileRecord]]:
    """Copy every librccl entry of *lib_dir* into a new backup/<txn>/ folder of *area*, durably
    and checked against *shas* (taken under the lock); returns (txn, the records to write down)."""
    txn = txn_id()
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
        mode = file_mode(src)
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
    return txn, records


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
