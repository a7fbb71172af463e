"""The AMD GPUs of a machine as the amdgpu driver's KFD topology (sysfs) lists them, and which
of them a HIP process sees after ROCR_VISIBLE_DEVICES and HIP_/CUDA_VISIBLE_DEVICES.

Standard library only, torch-free. `g906 doctor` records these GPUs in its facts; `g906 rccl`
reads them itself when `g906 up` hands it no facts, because the RCCL swap sits below the doctor
and must not import it.
"""

from __future__ import annotations

import os
from pathlib import Path
from typing import Any, Mapping

KFD_NODES = "/sys/class/kfd/kfd/topology/nodes"


def _read_text(path: Path, limit: int = 1 << 20) -> str | None:
    try:
        with open(path, "r", encoding="utf-8", errors="replace") as f:
            return f.read(limit)
    except OSError:
        return None


def _read_properties(path: Path) -> dict[str, int | str]:
    """A KFD `properties` file: one "key value" pair a line."""
    out: dict[str, int | str] = {}
    text = _read_text(path)
    if not text:
        return out
    for line in text.splitlines():
        parts = line.split()
        if len(parts) >= 2:
            try:
                out[parts[0]] = int(parts[1])
            except ValueError:
                out[parts[0]] = " ".join(parts[1:])
    return out


def gfx_name(gfx_target_version: int) -> str | None:
    """KFD gfx_target_version -> processor name: 90006 -> gfx906, 90010 -> gfx90a, 110000 -> gfx1100."""
    if not gfx_target_version:
        return None
    major, minor, step = gfx_target_version // 10000, (gfx_target_version // 100) % 100, gfx_target_version % 100
    return f"gfx{major}{minor:x}{step:x}"


def topology_gpus(nodes_dir: str | os.PathLike = KFD_NODES) -> list[dict[str, Any]]:
    """One dict per GPU node of the topology in `nodes_dir` (CPU nodes skipped), in node order;
    "index" is the HIP device index before any *_VISIBLE_DEVICES filtering."""
    base = Path(nodes_dir)
    gpus: list[dict[str, Any]] = []
    try:
        nodes = sorted((int(n) for n in os.listdir(base) if n.isdigit()))
    except OSError:
        nodes = []
    for n in nodes:
        nd = base / str(n)
        props = _read_properties(nd / "properties")
        if not props or int(props.get("simd_count", 0) or 0) == 0:
            continue  # CPU node
        gtv = int(props.get("gfx_target_version", 0) or 0)
        vram = 0
        used = 0
        banks = nd / "mem_banks"
        try:
            bank_names = sorted(os.listdir(banks))
        except OSError:
            bank_names = []
        for b in bank_names:
            bp = _read_properties(banks / b / "properties")
            if int(bp.get("heap_type", 0) or 0) in (1, 2):
                vram = max(vram, int(bp.get("size_in_bytes", 0) or 0))
                u = _read_text(banks / b / "used_memory")
                if u and u.strip().isdigit():
                    used = max(used, int(u.strip()))
        simd_per_cu = int(props.get("simd_per_cu", 0) or 0)
        name_file = (_read_text(nd / "name") or "").strip() or None
        uid_val = int(props.get("unique_id", 0) or 0)
        gpus.append({
            "node": n,
            "index": len(gpus),
            "gfx_target_version": gtv,
            "gfx": gfx_name(gtv),
            "kfd_name": name_file,
            "vendor_id": int(props.get("vendor_id", 0) or 0),
            "device_id": int(props.get("device_id", 0) or 0),
            "simd_count": int(props.get("simd_count", 0) or 0),
            "cu_count": int(props["simd_count"]) // simd_per_cu if simd_per_cu else None,
            "vram_bytes": vram,
            "vram_used_bytes": used or None,
            "drm_render_minor": props.get("drm_render_minor"),
            "location_id": props.get("location_id"),
            "unique_id_hex": f"{uid_val:016x}" if uid_val else None,
        })
    return gpus


def visible_gpus(gpus: list[dict[str, Any]], env: Mapping[str, str]) -> list[dict[str, Any]]:
    """The GPUs of `gpus` a HIP process started with `env` would see: ROCR_VISIBLE_DEVICES
    first, then HIP_VISIBLE_DEVICES (or, when unset, CUDA_VISIBLE_DEVICES)."""
    gpus = _apply_visible(list(gpus), env.get("ROCR_VISIBLE_DEVICES"))
    hip = env.get("HIP_VISIBLE_DEVICES")
    return _apply_visible(gpus, hip if hip is not None else env.get("CUDA_VISIBLE_DEVICES"))


def _apply_visible(gpus: list[dict[str, Any]], value: str | None) -> list[dict[str, Any]]:
    if value is None:
        return gpus
    out = []
    for tok in value.split(","):
        tok = tok.strip()
        if not tok:
            continue
        if tok.isdigit():
            i = int(tok)
            if 0 <= i < len(gpus):
                out.append(gpus[i])
            else:
                break  # HIP stops at the first invalid index
        else:
            match = [g for g in gpus if str(g.get("unique_id_hex", "")).lower() in (tok.lower(), tok.lower().removeprefix("gpu-"))]
            if not match:
                break
            out.extend(match)
    return out
