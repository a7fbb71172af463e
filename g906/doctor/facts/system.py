"""Facts about the host: platform, the user and their groups, access to /dev/kfd and the
render nodes, and host memory."""

from __future__ import annotations

import os
import platform
import re
import stat
from pathlib import Path
from typing import Any

from g906.doctor.facts.sysroot import Root, read_text


def collect_platform(r: Root) -> dict[str, Any]:
    kernel = (read_text(r("/proc/sys/kernel/osrelease")) or "").strip() or None
    if r.is_real and kernel is None:
        kernel = platform.release()
    os_release = {}
    text = read_text(r("/etc/os-release")) or ""
    for line in text.splitlines():
        if "=" in line:
            k, v = line.split("=", 1)
            os_release[k] = v.strip().strip('"')
    return {
        "system": platform.system() if r.is_real else "Linux",
        "machine": platform.machine(),
        "kernel": kernel,
        "os": os_release.get("PRETTY_NAME"),
    }


def _group_table(r: Root) -> dict[int, tuple[str, list[str]]]:
    out: dict[int, tuple[str, list[str]]] = {}
    text = read_text(r("/etc/group")) or ""
    for line in text.splitlines():
        parts = line.split(":")
        if len(parts) >= 3 and parts[2].isdigit():
            members = [m for m in (parts[3].split(",") if len(parts) > 3 else []) if m]
            out[int(parts[2])] = (parts[0], members)
    return out


def collect_user(r: Root, identity: tuple[int, list[int]] | None) -> dict[str, Any]:
    if identity is None:
        uid, gids = os.getuid(), sorted(set(os.getgroups()) | {os.getgid()})
    else:
        uid, gids = identity[0], sorted(set(identity[1]))
    groups = _group_table(r)
    name = None
    text = read_text(r("/etc/passwd")) or ""
    for line in text.splitlines():
        parts = line.split(":")
        if len(parts) >= 3 and parts[2] == str(uid):
            name = parts[0]
            break
    configured = sorted(g for g, (gname, members) in groups.items() if name and name in members)
    return {
        "uid": uid,
        "name": name,
        "gids": gids,
        "groups": [groups[g][0] if g in groups else str(g) for g in gids],
        # groups the account is listed in /etc/group but the current session lacks (needs re-login)
        "configured_not_active": [groups[g][0] for g in configured if g not in gids],
    }


def _node_access(path: Path, r: Root, uid: int, gids: list[int], groups: dict[int, tuple[str, list[str]]]) -> dict[str, Any]:
    shown = r.unroot(path)
    try:
        st = os.stat(path)
    except FileNotFoundError:
        return {"path": shown, "exists": False}
    except OSError as exc:
        return {"path": shown, "exists": True, "error": exc.strerror or str(exc), "read": False, "write": False}
    mode = stat.S_IMODE(st.st_mode)
    if uid == 0:
        rd = wr = True
    elif st.st_uid == uid:
        rd, wr = bool(mode & 0o400), bool(mode & 0o200)
    elif st.st_gid in gids:
        rd, wr = bool(mode & 0o040), bool(mode & 0o020)
    else:
        rd, wr = bool(mode & 0o004), bool(mode & 0o002)
    return {
        "path": shown,
        "exists": True,
        "char_device": stat.S_ISCHR(st.st_mode),
        "mode": oct(mode),
        "group": groups.get(st.st_gid, (str(st.st_gid), []))[0],
        "read": rd,
        "write": wr,
    }


def collect_device_nodes(r: Root, user: dict[str, Any]) -> dict[str, Any]:
    groups = _group_table(r)
    uid, gids = user["uid"], user["gids"]
    kfd = _node_access(r("/dev/kfd"), r, uid, gids, groups)
    render = []
    dri = r("/dev/dri")
    try:
        names = sorted(n for n in os.listdir(dri) if n.startswith("renderD"))
    except OSError:
        names = []
    for n in names:
        render.append(_node_access(dri / n, r, uid, gids, groups))
    return {"kfd": kfd, "render": render}


def collect_memory(r: Root) -> dict[str, Any]:
    text = read_text(r("/proc/meminfo")) or ""
    out: dict[str, Any] = {}
    for key, name in (("MemTotal", "total_bytes"), ("MemAvailable", "available_bytes")):
        m = re.search(rf"^{key}:\s+(\d+)\s*kB", text, re.M)
        if m:
            out[name] = int(m.group(1)) * 1024
    return out
