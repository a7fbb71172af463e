"""Small, durable file operations: hashing, fsync'd copies and atomic replaces."""

from __future__ import annotations

import hashlib
import os
from pathlib import Path

CHUNK = 1 << 20


def sha256_file(path: Path) -> str:
    h = hashlib.sha256()
    with open(path, "rb") as f:
        while True:
            block = f.read(CHUNK)
            if not block:
                break
            h.update(block)
    return h.hexdigest()


def fsync_dir(path: Path) -> None:
    fd = os.open(path, os.O_RDONLY | os.O_DIRECTORY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


def copy_durable(src: Path, dst: Path, *, mode: int | None = None) -> str:
    """Copy *src* to *dst* (created or truncated), fsync it and return its sha256.

    Follows a symlinked *src*. *mode* (permission bits) is applied to *dst* when given."""
    h = hashlib.sha256()
    flags = os.O_WRONLY | os.O_CREAT | os.O_TRUNC | getattr(os, "O_CLOEXEC", 0)
    fd = os.open(dst, flags, 0o600)
    try:
        with open(src, "rb") as fin:
            while True:
                block = fin.read(CHUNK)
                if not block:
                    break
                h.update(block)
                view = memoryview(block)
                while view:
                    n = os.write(fd, view)
                    view = view[n:]
        if mode is not None:
            os.fchmod(fd, mode & 0o7777)
        os.fsync(fd)
    finally:
        os.close(fd)
    return h.hexdigest()


def write_bytes_durable(path: Path, data: bytes) -> None:
    """Atomically replace *path* with *data*: temp file, fsync, rename, fsync directory."""
    tmp = path.with_name(f".{path.name}.tmp-{os.getpid()}")
    with open(tmp, "wb") as f:
        f.write(data)
        f.flush()
        os.fsync(f.fileno())
    os.replace(tmp, path)
    fsync_dir(path.parent)


def symlink_atomic(target: str, path: Path) -> None:
    """Create or replace the symlink *path* -> *target* atomically."""
    tmp = path.with_name(f".{path.name}.lnk-{os.getpid()}")
    try:
        os.unlink(tmp)
    except FileNotFoundError:
        pass
    os.symlink(target, tmp)
    os.replace(tmp, path)
    fsync_dir(path.parent)
