"""What a librccl file is: ELF checks, SONAME, gfx device code, RCCL version, checksum."""

from __future__ import annotations

import os
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

from g906 import binfmt
from g906.errors import G906Error
from g906.rccl.fsutil import sha256_file

WANT_SONAME = "librccl.so.1"
WANT_GFX = "gfx906"


@dataclass
class LibraryInfo:
    path: str
    sha256: str | None = None
    size: int | None = None
    elf_class: int | None = None
    machine: str | None = None
    type: str | None = None
    soname: str | None = None
    rccl_version: str | None = None
    offload_targets: list[str] = field(default_factory=list)
    gfx_archs: list[str] = field(default_factory=list)
    has_gfx906: bool = False
    problem: str | None = None          # why it is not a usable librccl (None when it is)

    def to_json(self) -> dict[str, Any]:
        return asdict(self)


def inspect_library(path: Path, *, checksum: bool = True) -> LibraryInfo:
    """Describe *path* without raising: unreadable or malformed files get ``problem`` set."""
    info = LibraryInfo(path=str(path))
    try:
        st = os.stat(path)
        info.size = st.st_size
        if checksum:
            info.sha256 = sha256_file(path)
    except OSError as exc:
        info.problem = f"cannot read {path}: {exc.strerror or exc}"
        return info
    try:
        ef = binfmt.read_elf(path)
    except G906Error as exc:
        info.problem = exc.message
        return info
    info.elf_class = ef.elf_class
    info.machine = ef.machine_name
    info.type = ef.type_name
    info.soname = ef.soname
    try:
        info.offload_targets = binfmt.offload_targets(path)
        info.gfx_archs = binfmt.gfx_targets(info.offload_targets)
        info.has_gfx906 = binfmt.has_gfx_target(info.offload_targets, WANT_GFX)
    except G906Error as exc:
        info.problem = f"its device code cannot be read: {exc.message}"
    try:
        info.rccl_version = binfmt.rccl_version(path)
    except G906Error:
        info.rccl_version = None
    if info.problem is None:
        info.problem = _shape_problem(info)
    return info


def _shape_problem(info: LibraryInfo) -> str | None:
    if info.elf_class != 64:
        return f"it is a {info.elf_class}-bit ELF file; torch needs a 64-bit library"
    if info.machine != "x86_64":
        return f"it is built for {info.machine}, not x86-64"
    if info.type != "DYN":
        return f"it is an ELF {info.type} file, not a shared object"
    if info.soname != WANT_SONAME:
        got = repr(info.soname) if info.soname else "no SONAME"
        return f"its SONAME is {got}, but torch loads {WANT_SONAME!r}"
    return None


def describe(info: LibraryInfo) -> str:
    """One line: "RCCL 2.27.7, device code for gfx906, gfx908"."""
    ver = f"RCCL {info.rccl_version}" if info.rccl_version else "RCCL (version not found)"
    archs = ", ".join(info.gfx_archs) if info.gfx_archs else "no GPU device code found"
    return f"{ver}; device code: {archs}"


def validate_new_library(info: LibraryInfo, *, source: str, force: bool) -> list[str]:
    """Raise G906Error when *info* must not be installed; returns warnings (e.g. --force)."""
    if info.problem:
        raise G906Error(
            f"{source} is not a usable librccl: {info.problem}.",
            hint="point g906 at the librccl.so.1 of an RCCL build for x86-64 (a release tarball, its folder, or the .so).",
        )
    if not info.has_gfx906:
        found = ", ".join(info.gfx_archs) or "none"
        msg = f"{source} holds no gfx906 device code (found: {found})."
        if not force:
            raise G906Error(
                msg,
                hint="use an RCCL built with --amdgpu_targets=gfx906 (or add --force if you really mean to install it).",
            )
        return [f"WARNING: {msg} Installing anyway because of --force: collective operations on gfx906 GPUs will fail."]
    return []
