"""What torch/lib holds now, compared with what g906's manifest recorded: the librccl entries
and their checksums, whether the manifest explains them, and what a rollback would do to each."""

from __future__ import annotations

import os
import stat
from pathlib import Path
from typing import Any

from g906.errors import G906Error
from g906.rccl import state as st
from g906.rccl.fsutil import sha256_file
from g906.rccl.target import Entry, Target, list_rccl_entries

TMP_SUFFIXES = (".g906-new", ".g906-restore")


def file_mode(path: Path) -> int:
    return stat.S_IMODE(os.stat(path).st_mode)


def clean_lib_temps(lib_dir: Path) -> None:
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


def snapshot(lib_dir: Path) -> tuple[list[Entry], dict[str, str]]:
    entries = list_rccl_entries(lib_dir)
    other = [e.name for e in entries if e.kind == "other"]
    if other:
        raise G906Error(f"{lib_dir / other[0]} is neither a file nor a symlink.",
                        hint="remove or fix it by hand; g906 only swaps regular files.")
    shas = {e.name: sha256_file(lib_dir / e.name) for e in entries if e.kind == "file"}
    return entries, shas


def require_rccl(lib_dir: Path, entries: list[Entry]) -> None:
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


def why_inconsistent(m: st.Manifest, entries: list[Entry], shas: dict[str, str]) -> str | None:
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


def rollback_plan(lib_dir: Path, m: st.Manifest) -> list[dict[str, Any]]:
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
        mode_ok = rec.kind != "file" or row["status"] != "original" or file_mode(p) == rec.mode
        row["action"] = "keep" if row["status"] == "original" and mode_ok else (
            "chmod" if row["status"] == "original" else "restore")
        rows.append(row)
    return rows


def changed_message(lib_dir: Path, m: st.Manifest, unknown: list[str], target: Target | None) -> str:
    msg = (f"{', '.join(unknown)} in {lib_dir} changed since g906 touched it: it matches neither the original "
           f"torch library nor the one g906 installed")
    if target is not None and target.torch_version and m.torch_version and target.torch_version != m.torch_version:
        msg += f" (torch was {m.torch_version}, now {target.torch_version}: torch was reinstalled)"
    else:
        msg += " (torch was probably reinstalled, or another tool replaced it)"
    return msg
