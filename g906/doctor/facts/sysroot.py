"""Paths under an injectable root: every file-system fact is read through Root, so tests build
fixture sysroots and `g906 doctor --root DIR` inspects a mounted image."""

from __future__ import annotations

import os
from pathlib import Path


class Root:
    """Resolves absolute paths under a sysroot prefix."""

    def __init__(self, root: Path):
        self.root = Path(root)
        self.is_real = str(self.root.resolve()) == "/"

    def __call__(self, path: str | os.PathLike) -> Path:
        p = str(path)
        if self.is_real:
            return Path(p)
        return self.root / p.lstrip("/")

    def unroot(self, path: str | os.PathLike) -> str:
        """Display form: the path as it would be on the inspected system."""
        p = str(path)
        if self.is_real:
            return p
        r = str(self.root)
        return "/" + p[len(r):].lstrip("/") if p.startswith(r) else p


def read_text(path: Path, limit: int = 1 << 20) -> str | None:
    try:
        with open(path, "r", encoding="utf-8", errors="replace") as f:
            return f.read(limit)
    except OSError:
        return None
