"""Refusals before and around touching torch/lib: a folder this user cannot write, a disk too
full for the new library or the backup, and a file-system failure half-way (which leaves every
library complete, so the message says to rerun)."""

from __future__ import annotations

import os
import shutil
from contextlib import contextmanager
from pathlib import Path

from g906.errors import G906Error


def check_writable(lib_dir: Path, area: Path) -> None:
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


def check_space(folder: Path, need: int, what: str | None) -> None:
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
def os_errors(what: str, lib_dir: Path):
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
