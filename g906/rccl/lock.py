"""An exclusive, non-blocking lock per target (flock(2); the kernel drops it when the
holder dies, so a killed install never leaves a stale lock behind).

Two locks are taken: the state area's lock file (it records the holder's pid for the message)
and the target folder itself (flock on a directory descriptor), so that g906 processes with
different state folders (another user, another G906_STATE_DIR) still exclude each other on one
torch/lib, without g906 writing anything into that folder."""

from __future__ import annotations

import fcntl
import os
from pathlib import Path

from g906.errors import G906Error


class TargetLock:
    def __init__(self, area: Path, lib_dir: Path):
        self.path = area / "lock"
        self.lib_dir = lib_dir
        self._fd: int | None = None
        self._dir_fd: int | None = None

    def acquire(self) -> "TargetLock":
        self.path.parent.mkdir(parents=True, exist_ok=True)
        fd = os.open(self.path, os.O_RDWR | os.O_CREAT | getattr(os, "O_CLOEXEC", 0), 0o644)
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            try:
                holder = os.read(fd, 64).decode(errors="replace").strip() or "unknown"
            except OSError:
                holder = "unknown"
            os.close(fd)
            raise G906Error(
                f"another g906 rccl command (pid {holder}) is changing {self.lib_dir} right now.",
                hint="wait for it to finish and run this command again; the lock frees itself when that process ends.",
            ) from None
        os.ftruncate(fd, 0)
        os.pwrite(fd, f"{os.getpid()}\n".encode(), 0)
        self._fd = fd
        try:
            dfd = os.open(self.lib_dir, os.O_RDONLY | os.O_DIRECTORY | getattr(os, "O_CLOEXEC", 0))
        except OSError:
            return self          # cannot open the folder: the later steps report why
        try:
            fcntl.flock(dfd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            os.close(dfd)
            self.release()
            raise G906Error(
                f"another g906 rccl command (using a different state folder) is changing {self.lib_dir} right now.",
                hint="wait for it to finish and run this command again; the lock frees itself when that process ends.",
            ) from None
        self._dir_fd = dfd
        return self

    def release(self) -> None:
        if self._dir_fd is not None:
            os.close(self._dir_fd)       # closing the descriptor drops its flock
            self._dir_fd = None
        if self._fd is not None:
            try:
                fcntl.flock(self._fd, fcntl.LOCK_UN)
            finally:
                os.close(self._fd)
                self._fd = None

    def __enter__(self) -> "TargetLock":
        return self.acquire()

    def __exit__(self, *exc) -> None:
        self.release()
