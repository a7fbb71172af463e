"""Facts about rocBLAS: the library torch loads and where it looks for its Tensile kernels for
the GPU's processor (ROCBLAS_TENSILE_LIBPATH, or the folders beside the library)."""

from __future__ import annotations

import os
import re
from pathlib import Path
from typing import Any

from g906.doctor.facts.libraries import find_libs, lib_dirs
from g906.doctor.facts.sysroot import Root

ROCBLAS_TENSILE_SUBDIRS = ("../../Tensile/library", "library", "../rocblas/library", "rocblas/library")

_TENSILE_ARCH_RE = re.compile(r"TensileLibrary(?:_lazy)?_(gfx[0-9a-f]+)(?:[._]|$)")


def _scan_tensile_dir(d: Path, arch: str) -> dict[str, Any]:
    res: dict[str, Any] = {"exists": d.is_dir(), "files": [], "archs": []}
    if not res["exists"]:
        return res
    try:
        names = os.listdir(d)
    except OSError as exc:
        res["error"] = exc.strerror or str(exc)
        return res
    archs = set()
    files = []
    for n in names:
        m = _TENSILE_ARCH_RE.search(n)
        if m:
            archs.add(m.group(1))
        if arch in n and (n.startswith("TensileLibrary") or n.endswith((".co", ".hsaco"))):
            files.append(n)
    res["archs"] = sorted(archs)
    res["files"] = sorted(files)[:20]
    res["file_count"] = len(files)
    res["has_lazy_or_library"] = any(n.startswith("TensileLibrary") for n in files)
    res["has_code_objects"] = any(n.endswith((".co", ".hsaco")) for n in files)
    return res


def collect_rocblas(r: Root, tr: Root, env: dict[str, str], torch_facts: dict[str, Any], rocm: dict[str, Any],
                     arch: str = "gfx906") -> dict[str, Any]:
    libs = find_libs(lib_dirs(r, tr, torch_facts, rocm), r"librocblas\.so(\.\d+)*")
    out: dict[str, Any] = {"arch": arch, "libraries": [p for p, _, _ in libs]}
    if not libs:
        out["library"] = None
        out["search"] = []
        out["found"] = False
        return out
    lib, res, origin = libs[0]
    r = res  # the Tensile directories live beside the library that is loaded
    out["library"], out["library_origin"] = lib, origin
    libdir = Path(lib).parent
    search: list[dict[str, Any]] = []
    env_path = env.get("ROCBLAS_TENSILE_LIBPATH")
    if env_path:
        out["env_override"] = env_path
        bases = [Path(env_path)]
    else:
        bases = [Path(os.path.normpath(libdir / sub)) for sub in ROCBLAS_TENSILE_SUBDIRS]
    for base in bases:
        for d in (base, base / arch):
            entry = {"path": str(d)}
            entry.update(_scan_tensile_dir(r(d), arch))
            search.append(entry)
    out["search"] = search
    hits = [s for s in search if s.get("has_lazy_or_library")]
    out["found"] = bool(hits)
    out["found_in"] = hits[0]["path"] if hits else None
    # the directory where files should go: the first existing search base, else the conventional one
    existing = [s["path"] for s in search if s.get("exists")]
    out["install_dir"] = existing[0] if existing else str(bases[0] if env_path else libdir / "rocblas/library")
    out["other_archs"] = sorted({a for s in search for a in s.get("archs", [])})
    return out
