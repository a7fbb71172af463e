"""Facts about the GPUs: the AMD ones from the KFD topology (and the processes using them),
the amdgpu driver, and NVIDIA's driver where there is one. Processor names are normalised here
for every check."""

from __future__ import annotations

import os
import re
from typing import Any

from g906.doctor.facts.sysroot import Root, read_text
from g906.kfd import gfx_name, topology_gpus


ARCH_ALIASES = {"gfx9006": "gfx906"}  # amdsmi has been seen to print gfx906 this way


def normalise_arch(name: str | None) -> str | None:
    """"gfx906:sramecc+:xnack-" -> "gfx906"; amdsmi's "gfx9006" -> "gfx906"; "90006" -> "gfx906"."""
    if not name:
        return None
    base = str(name).strip().split(":", 1)[0].lower()
    if base.isdigit():
        return gfx_name(int(base))
    return ARCH_ALIASES.get(base, base)


def collect_kfd(r: Root) -> tuple[list[dict[str, Any]], dict[str, Any]]:
    base = r("/sys/class/kfd/kfd/topology/nodes")
    info: dict[str, Any] = {"topology": base.is_dir(), "processes": []}
    gpus = topology_gpus(base)
    proc = r("/sys/class/kfd/kfd/proc")
    try:
        pids = sorted(int(p) for p in os.listdir(proc) if p.isdigit())
    except OSError:
        pids = []
    me = os.getpid() if r.is_real else None
    for pid in pids:
        if pid == me:
            continue
        vram_total = 0
        try:
            for f in os.listdir(proc / str(pid)):
                if f.startswith("vram_"):
                    t = (read_text(proc / str(pid) / f) or "0").strip()
                    vram_total += int(t) if t.isdigit() else 0
        except OSError:
            pass
        comm = (read_text(r(f"/proc/{pid}/comm")) or "").strip() or None
        info["processes"].append({"pid": pid, "comm": comm, "vram_bytes": vram_total})
    return gpus, info


def collect_driver(r: Root) -> dict[str, Any]:
    mod = r("/sys/module/amdgpu")
    version = (read_text(mod / "version") or "").strip() or None
    return {"amdgpu_loaded": mod.is_dir(), "amdgpu_version": version}


def collect_nvidia(r: Root) -> dict[str, Any]:
    text = read_text(r("/proc/driver/nvidia/version"))
    version = None
    if text:
        m = re.search(r"Kernel Module(?: for \S+)?\s+([0-9][0-9.]+)", text)
        version = m.group(1) if m else text.splitlines()[0].strip()
    models = []
    gdir = r("/proc/driver/nvidia/gpus")
    try:
        for g in sorted(os.listdir(gdir)):
            info = read_text(gdir / g / "information") or ""
            m = re.search(r"^Model:\s*(.+)$", info, re.M)
            models.append({"bus": g, "model": m.group(1).strip() if m else None})
    except OSError:
        pass
    try:
        nodes = sorted(n for n in os.listdir(r("/dev")) if re.fullmatch(r"nvidia\d+", n))
    except OSError:
        nodes = []
    return {"driver_version": version, "gpus": models, "dev_nodes": nodes, "present": bool(text or models or nodes)}
