"""Where the GPU libraries torch loads are looked for: torch/lib first (its RPATH wins), then
$ROCM_PATH/lib."""

from __future__ import annotations

import os
import re
from typing import Any

from g906.doctor.facts.sysroot import Root


def lib_dirs(r: Root, tr: Root, torch_facts: dict[str, Any], rocm: dict[str, Any]) -> list[tuple[str, Root, str]]:
    """(directory, resolver, origin): torch/lib first (its RPATH wins), then $ROCM_PATH/lib."""
    dirs: list[tuple[str, Root, str]] = []
    if torch_facts.get("found") and torch_facts.get("lib_dir"):
        dirs.append((str(torch_facts["lib_dir"]), tr, "torch"))
    if rocm.get("path"):
        dirs.append((str(rocm["path"]).rstrip("/") + "/lib", r, "rocm"))
    return dirs


def find_libs(dirs: list[tuple[str, Root, str]], pattern: str) -> list[tuple[str, Root, str]]:
    out = []
    for d, res, origin in dirs:
        try:
            names = sorted(n for n in os.listdir(res(d)) if re.fullmatch(pattern, n))
        except OSError:
            continue
        if names:
            names.sort(key=len)  # the plainest name first (libx.so before libx.so.1)
            out.append((d.rstrip("/") + "/" + names[0], res, origin))
    return out
