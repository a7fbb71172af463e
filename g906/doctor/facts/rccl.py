"""Facts about RCCL: the library torch loads (its version, SONAME and the GPU targets its
offload bundles carry) and the state of g906's own RCCL swap for this torch."""

from __future__ import annotations

import os
import time
from typing import Any

from g906 import binfmt
from g906.doctor.facts.libraries import find_libs, lib_dirs
from g906.doctor.facts.sysroot import Root
from g906.errors import G906Error
from g906.rccl import state as rccl_state


def collect_rccl(r: Root, tr: Root, torch_facts: dict[str, Any], rocm: dict[str, Any]) -> dict[str, Any]:
    found = find_libs(lib_dirs(r, tr, torch_facts, rocm), r"librccl\.so(\.\d+)*")
    out: dict[str, Any] = {"libraries": [p for p, _, _ in found]}
    if not found:
        out["library"] = None
        return out
    lib, r, origin = found[0]
    out["library"], out["library_origin"] = lib, origin
    path = r(lib)
    try:
        out["real_path"] = r.unroot(os.path.realpath(path))
        out["size"] = os.path.getsize(path)
    except OSError as exc:
        out["error"] = f"cannot stat {lib}: {exc.strerror or exc}"
        return out
    try:
        e = binfmt.read_elf(path)
        out["soname"] = e.soname
        out["machine"] = e.machine_name
        out["version"] = binfmt.rccl_version(path)
        t0 = time.monotonic()
        targets = binfmt.offload_targets(path)
        out["offload_targets"] = targets
        out["gfx_targets"] = binfmt.gfx_targets(targets)
        out["has_gfx906"] = binfmt.has_gfx_target(targets, "gfx906")
        out["scan_s"] = round(time.monotonic() - t0, 3)
    except G906Error as exc:
        out["error"] = exc.message
    return out


def collect_rccl_swap(torch_facts: dict[str, Any], r: Root) -> dict[str, Any]:
    """State of g906's own RCCL swap for this torch (r: the resolver of torch's paths)."""
    lib_dir = torch_facts.get("lib_dir") if torch_facts.get("found") else None
    if not lib_dir:
        return {"applicable": False}
    area = rccl_state.area_for(r(lib_dir))
    out: dict[str, Any] = {"applicable": True, "area": str(area)}
    try:
        m = rccl_state.load_manifest(area)
    except G906Error as exc:
        out.update(state="damaged", error=exc.message)
        return out
    if m is None:
        out["state"] = "none"
        return out
    out.update(state=m.state, step=m.step, txn=m.txn, source=m.source, updated=m.updated,
               new_sha256=(m.new or {}).get("sha256"), new_size=(m.new or {}).get("size"),
               new_rccl_version=(m.new or {}).get("rccl_version"), new_gfx_archs=(m.new or {}).get("gfx_archs"),
               destinations=list(m.destinations))
    sizes = {}
    for name in m.destinations:
        try:
            sizes[name] = os.path.getsize(r(lib_dir) / name)
        except OSError:
            sizes[name] = None
    out["current_sizes"] = sizes
    return out
