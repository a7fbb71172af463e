"""Facts: a plain, JSON-serialisable snapshot of the machine that the checks evaluate.

Every file-system fact is read under an injectable root (``--root DIR``), so tests build fixture
sysroots and users can inspect a mounted image. torch and triton are inspected by running the
target interpreter on probe.py in a subprocess with a time limit (never imported here).
Facts can be saved (``--collect``) and evaluated later (``--from``) with the same verdicts.
"""

from __future__ import annotations

import concurrent.futures as cf
import json
import os
import platform
import re
import stat
import subprocess
import sys
import time
from dataclasses import asdict, dataclass, field, fields
from pathlib import Path
from typing import Any, Callable

from g906.errors import G906Error, UsageError

FACTS_SCHEMA = 1

# Environment variables that change what the GPU stack does (recorded verbatim).
ENV_VARS = (
    "HIP_VISIBLE_DEVICES", "CUDA_VISIBLE_DEVICES", "ROCR_VISIBLE_DEVICES", "GPU_DEVICE_ORDINAL",
    "HSA_OVERRIDE_GFX_VERSION", "ROCBLAS_TENSILE_LIBPATH", "ROCM_PATH", "ROCM_HOME", "HIP_PATH",
    "HIP_PLATFORM", "LD_LIBRARY_PATH", "LD_PRELOAD", "PYTORCH_ROCM_ARCH", "HSA_ENABLE_SDMA",
    "NCCL_P2P_DISABLE", "NCCL_DEBUG", "RCCL_MSCCL_ENABLE", "TORCH_BLAS_PREFER_HIPBLASLT",
    "VLLM_USE_TRITON_FLASH_ATTN", "TRITON_INTERPRET", "G906_STATE_DIR",
)

ROCBLAS_TENSILE_SUBDIRS = ("../../Tensile/library", "library", "../rocblas/library", "rocblas/library")


@dataclass
class Facts:
    """What the doctor knows about one machine. Every field is plain JSON data."""

    schema: int = FACTS_SCHEMA
    collected_at: str = ""
    g906_version: str = ""
    root: str = "/"
    platform: dict[str, Any] = field(default_factory=dict)   # system, machine, kernel
    user: dict[str, Any] = field(default_factory=dict)       # uid, name, gids, groups (names)
    env: dict[str, str] = field(default_factory=dict)
    gpus: list[dict[str, Any]] = field(default_factory=list)  # AMD GPUs from the KFD topology
    kfd: dict[str, Any] = field(default_factory=dict)        # topology present, GPU processes
    device_nodes: dict[str, Any] = field(default_factory=dict)  # /dev/kfd, /dev/dri/renderD*
    driver: dict[str, Any] = field(default_factory=dict)     # amdgpu loaded/version
    nvidia: dict[str, Any] = field(default_factory=dict)     # driver version, GPU models
    rocm: dict[str, Any] = field(default_factory=dict)       # path, version, rocminfo
    python: dict[str, Any] = field(default_factory=dict)     # the inspected interpreter
    torch: dict[str, Any] = field(default_factory=dict)
    triton: dict[str, Any] = field(default_factory=dict)
    rocblas: dict[str, Any] = field(default_factory=dict)    # library + Tensile search
    rccl: dict[str, Any] = field(default_factory=dict)       # library, soname, version, targets
    rccl_swap: dict[str, Any] = field(default_factory=dict)  # g906 rccl manifest state
    memory: dict[str, Any] = field(default_factory=dict)     # host RAM
    errors: list[str] = field(default_factory=list)          # collectors that crashed
    timings: dict[str, float] = field(default_factory=dict)

    # -- serialisation ---------------------------------------------------------------------------
    def to_json(self) -> dict[str, Any]:
        return asdict(self)

    @classmethod
    def from_json(cls, data: Any, *, source: str = "facts") -> "Facts":
        if not isinstance(data, dict):
            raise UsageError(f"{source}: expected a JSON object of g906 doctor facts")
        if data.get("schema") != FACTS_SCHEMA:
            raise UsageError(
                f"{source}: facts schema {data.get('schema')!r} is not supported (expected {FACTS_SCHEMA})",
                hint="collect the facts again with this g906 version: g906 doctor --collect FILE",
            )
        known = {f.name for f in fields(cls)}
        unknown = sorted(set(data) - known)
        if unknown:
            raise UsageError(f"{source}: unknown facts field(s): {', '.join(unknown)}",
                             hint="was this file written by `g906 doctor --collect`?")
        kwargs = {}
        for f in fields(cls):
            if f.name in data:
                value = data[f.name]
                default = f.default_factory() if callable(f.default_factory) else f.default  # type: ignore[misc]
                if default is not None and not isinstance(value, type(default)):
                    raise UsageError(f"{source}: field {f.name!r} should be a {type(default).__name__}")
                kwargs[f.name] = value
        return cls(**kwargs)

    def save(self, path: str | os.PathLike) -> None:
        path = Path(path)
        text = json.dumps(self.to_json(), indent=2, sort_keys=True) + "\n"
        tmp = path.with_name(f".{path.name}.tmp-{os.getpid()}")
        try:
            tmp.write_text(text, encoding="utf-8")
            os.replace(tmp, path)
        except OSError as exc:
            tmp.unlink(missing_ok=True)
            raise G906Error(f"cannot write the facts to {path}: {exc.strerror or exc}",
                            hint="pick a writable path") from exc

    @classmethod
    def load(cls, path: str | os.PathLike) -> "Facts":
        path = Path(path)
        try:
            text = path.read_text(encoding="utf-8")
        except FileNotFoundError:
            raise UsageError(f"{path}: no such facts file", hint="write one with: g906 doctor --collect FILE") from None
        except OSError as exc:
            raise UsageError(f"cannot read {path}: {exc.strerror or exc}") from None
        try:
            data = json.loads(text)
        except json.JSONDecodeError as exc:
            raise UsageError(f"{path}: not valid JSON (line {exc.lineno}, column {exc.colno}: {exc.msg})",
                             hint="pass a file written by `g906 doctor --collect`") from None
        return cls.from_json(data, source=str(path))

    # -- derived views the checks share ------------------------------------------------------------
    def amd_gpus(self) -> list[dict[str, Any]]:
        return list(self.gpus)

    def visible_amd_gpus(self) -> list[dict[str, Any]]:
        """KFD GPUs a HIP process would see, after ROCR_/HIP_/CUDA_VISIBLE_DEVICES."""
        gpus = list(self.gpus)
        for var in ("ROCR_VISIBLE_DEVICES",):
            gpus = _apply_visible(gpus, self.env.get(var))
        hip = self.env.get("HIP_VISIBLE_DEVICES")
        cuda = self.env.get("CUDA_VISIBLE_DEVICES")
        gpus = _apply_visible(gpus, hip if hip is not None else cuda)
        return gpus


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


def parse_visible(value: str | None) -> list[str] | None:
    if value is None:
        return None
    return [t.strip() for t in value.split(",") if t.strip()]


# --- helpers -------------------------------------------------------------------------------------


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


def _read_text(path: Path, limit: int = 1 << 20) -> str | None:
    try:
        with open(path, "r", encoding="utf-8", errors="replace") as f:
            return f.read(limit)
    except OSError:
        return None


def _read_kv(path: Path) -> dict[str, int | str]:
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


ARCH_ALIASES = {"gfx9006": "gfx906"}  # amdsmi has been seen to print gfx906 this way


def normalise_arch(name: str | None) -> str | None:
    """"gfx906:sramecc+:xnack-" -> "gfx906"; amdsmi's "gfx9006" -> "gfx906"; "90006" -> "gfx906"."""
    if not name:
        return None
    base = str(name).strip().split(":", 1)[0].lower()
    if base.isdigit():
        return gfx_name(int(base))
    return ARCH_ALIASES.get(base, base)


# --- collectors (each returns plain data; a crash becomes an entry in Facts.errors) ------------


def _collect_platform(r: Root) -> dict[str, Any]:
    kernel = (_read_text(r("/proc/sys/kernel/osrelease")) or "").strip() or None
    if r.is_real and kernel is None:
        kernel = platform.release()
    os_release = {}
    text = _read_text(r("/etc/os-release")) or ""
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
    text = _read_text(r("/etc/group")) or ""
    for line in text.splitlines():
        parts = line.split(":")
        if len(parts) >= 3 and parts[2].isdigit():
            members = [m for m in (parts[3].split(",") if len(parts) > 3 else []) if m]
            out[int(parts[2])] = (parts[0], members)
    return out


def _collect_user(r: Root, identity: tuple[int, list[int]] | None) -> dict[str, Any]:
    if identity is None:
        uid, gids = os.getuid(), sorted(set(os.getgroups()) | {os.getgid()})
    else:
        uid, gids = identity[0], sorted(set(identity[1]))
    groups = _group_table(r)
    name = None
    text = _read_text(r("/etc/passwd")) or ""
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


def _collect_device_nodes(r: Root, user: dict[str, Any]) -> dict[str, Any]:
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


def _collect_kfd(r: Root) -> tuple[list[dict[str, Any]], dict[str, Any]]:
    base = r("/sys/class/kfd/kfd/topology/nodes")
    info: dict[str, Any] = {"topology": base.is_dir(), "processes": []}
    gpus: list[dict[str, Any]] = []
    try:
        nodes = sorted((int(n) for n in os.listdir(base) if n.isdigit()))
    except OSError:
        nodes = []
    for n in nodes:
        nd = base / str(n)
        props = _read_kv(nd / "properties")
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
            bp = _read_kv(banks / b / "properties")
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
                    t = (_read_text(proc / str(pid) / f) or "0").strip()
                    vram_total += int(t) if t.isdigit() else 0
        except OSError:
            pass
        comm = (_read_text(r(f"/proc/{pid}/comm")) or "").strip() or None
        info["processes"].append({"pid": pid, "comm": comm, "vram_bytes": vram_total})
    return gpus, info


def _collect_driver(r: Root) -> dict[str, Any]:
    mod = r("/sys/module/amdgpu")
    version = (_read_text(mod / "version") or "").strip() or None
    return {"amdgpu_loaded": mod.is_dir(), "amdgpu_version": version}


def _collect_nvidia(r: Root) -> dict[str, Any]:
    text = _read_text(r("/proc/driver/nvidia/version"))
    version = None
    if text:
        m = re.search(r"Kernel Module(?: for \S+)?\s+([0-9][0-9.]+)", text)
        version = m.group(1) if m else text.splitlines()[0].strip()
    models = []
    gdir = r("/proc/driver/nvidia/gpus")
    try:
        for g in sorted(os.listdir(gdir)):
            info = _read_text(gdir / g / "information") or ""
            m = re.search(r"^Model:\s*(.+)$", info, re.M)
            models.append({"bus": g, "model": m.group(1).strip() if m else None})
    except OSError:
        pass
    try:
        nodes = sorted(n for n in os.listdir(r("/dev")) if re.fullmatch(r"nvidia\d+", n))
    except OSError:
        nodes = []
    return {"driver_version": version, "gpus": models, "dev_nodes": nodes, "present": bool(text or models or nodes)}


def _version_tuple(v: str | None) -> tuple[int, ...]:
    if not v:
        return ()
    nums = re.findall(r"\d+", v)
    return tuple(int(x) for x in nums[:3])


def _collect_rocm(r: Root, env: dict[str, str], *, run_tools: bool, timeout_s: float) -> dict[str, Any]:
    out: dict[str, Any] = {}
    candidates = []
    for var in ("ROCM_PATH", "ROCM_HOME", "HIP_PATH"):
        if env.get(var):
            candidates.append((env[var], var))
    candidates.append(("/opt/rocm", "default"))
    path = None
    for cand, why in candidates:
        if r(cand).is_dir():
            path, out["path_from"] = cand, why
            break
    out["path"] = path
    if env.get("ROCM_PATH") and not r(env["ROCM_PATH"]).is_dir():
        out["rocm_path_missing"] = env["ROCM_PATH"]
    if path is None:
        # versioned installs without the /opt/rocm link
        try:
            vers = sorted((p for p in os.listdir(r("/opt")) if re.fullmatch(r"rocm-\d+\.\d+(\.\d+)?", p)),
                          key=_version_tuple)
        except OSError:
            vers = []
        if vers:
            path, out["path_from"] = "/opt/" + vers[-1], "versioned"
            out["path"] = path
    if path is None:
        out["version"] = None
        return out
    version = None
    for rel in (".info/version", ".info/version-dev", ".info/version-utils"):
        text = (_read_text(r(path) / rel) or "").strip()
        if text:
            version, out["version_from"] = text.splitlines()[0].strip(), rel
            break
    if version is None:
        hdr = _read_text(r(path) / "include/rocm-core/rocm_version.h") or _read_text(r(path) / "include/rocm_version.h") or ""
        parts = [re.search(rf"#define\s+ROCM_VERSION_{k}\s+(\d+)", hdr) for k in ("MAJOR", "MINOR", "PATCH")]
        if all(parts):
            version, out["version_from"] = ".".join(p.group(1) for p in parts), "rocm_version.h"  # type: ignore[union-attr]
    hipconfig = r(path) / "bin/hipconfig"
    if version is None and run_tools and r.is_real and hipconfig.exists():
        try:
            cp = subprocess.run([str(hipconfig), "--version"], capture_output=True, text=True, timeout=timeout_s)
            m = re.match(r"\s*(\d+\.\d+[\w.\-]*)", cp.stdout)
            if cp.returncode == 0 and m:
                version, out["version_from"] = m.group(1), "hipconfig"
        except (OSError, subprocess.TimeoutExpired):
            pass
    if version is None:
        m = re.search(r"rocm-(\d+\.\d+(?:\.\d+)?)", os.path.realpath(r(path)))
        if m:
            version, out["version_from"] = m.group(1), "path"
    out["version"] = version
    out["hipconfig"] = hipconfig.exists()
    rocminfo = r(path) / "bin/rocminfo"
    out["rocminfo"] = {"present": rocminfo.exists(), "ran": False}
    if run_tools and rocminfo.exists() and r.is_real:
        out["rocminfo"].update(_run_rocminfo(str(rocminfo), timeout_s))
    return out


def _run_rocminfo(exe: str, timeout_s: float) -> dict[str, Any]:
    t0 = time.monotonic()
    try:
        cp = subprocess.run([exe], capture_output=True, text=True, timeout=timeout_s)
    except subprocess.TimeoutExpired:
        return {"ran": True, "ok": False, "error": f"timed out after {timeout_s:.0f} s"}
    except OSError as exc:
        return {"ran": True, "ok": False, "error": exc.strerror or str(exc)}
    agents = []
    for block in cp.stdout.split("*******")[1:]:
        name = re.search(r"^\s*Name:\s*(\S+)", block, re.M)
        mk = re.search(r"^\s*Marketing Name:\s*(.+)$", block, re.M)
        dtype = re.search(r"^\s*Device Type:\s*(\S+)", block, re.M)
        if name and dtype and dtype.group(1) == "GPU":
            agents.append({"name": name.group(1), "marketing_name": mk.group(1).strip() if mk else None})
    res: dict[str, Any] = {"ran": True, "ok": cp.returncode == 0, "gpu_agents": agents,
                           "seconds": round(time.monotonic() - t0, 3)}
    if cp.returncode != 0:
        res["error"] = (cp.stderr or cp.stdout).strip().splitlines()[-1:] or [f"exit {cp.returncode}"]
        res["error"] = res["error"][0]
    return res


def _probe(python: str, *, deep: bool, timeout_s: float, env_overrides: dict[str, str] | None) -> dict[str, Any]:
    probe_path = Path(__file__).with_name("probe.py")
    cmd = [python, str(probe_path)] + (["--deep"] if deep else [])
    env = dict(os.environ)
    env.update(env_overrides or {})
    t0 = time.monotonic()
    try:
        cp = subprocess.run(cmd, capture_output=True, text=True, timeout=timeout_s, cwd="/", env=env)
    except subprocess.TimeoutExpired:
        msg = f"the probe of {python} did not finish within {timeout_s:.0f} s (importing torch hangs?)"
        return {"error": msg, "timed_out": True}
    except FileNotFoundError:
        return {"error": f"{python}: no such interpreter", "missing": True}
    except PermissionError:
        return {"error": f"{python}: not executable", "missing": True}
    except OSError as exc:
        return {"error": f"cannot run {python}: {exc.strerror or exc}", "missing": True}
    from g906.doctor.probe import MARKER

    if MARKER not in cp.stdout:
        tail = (cp.stderr or cp.stdout).strip().splitlines()[-3:]
        return {"error": f"the probe of {python} exited with status {cp.returncode}: " + " | ".join(tail),
                "returncode": cp.returncode}
    try:
        data = json.loads(cp.stdout.split(MARKER, 1)[1].strip().splitlines()[0])
    except (json.JSONDecodeError, IndexError) as exc:
        return {"error": f"the probe of {python} printed unreadable output ({exc})"}
    data["seconds"] = round(time.monotonic() - t0, 3)
    if cp.returncode != 0:
        data["returncode"] = cp.returncode
    return data


def _lib_dirs(r: Root, tr: Root, torch_facts: dict[str, Any], rocm: dict[str, Any]) -> list[tuple[str, Root, str]]:
    """(directory, resolver, origin): torch/lib first (its RPATH wins), then $ROCM_PATH/lib."""
    dirs: list[tuple[str, Root, str]] = []
    if torch_facts.get("found") and torch_facts.get("lib_dir"):
        dirs.append((str(torch_facts["lib_dir"]), tr, "torch"))
    if rocm.get("path"):
        dirs.append((str(rocm["path"]).rstrip("/") + "/lib", r, "rocm"))
    return dirs


def _find_libs(dirs: list[tuple[str, Root, str]], pattern: str) -> list[tuple[str, Root, str]]:
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


def _collect_rocblas(r: Root, tr: Root, env: dict[str, str], torch_facts: dict[str, Any], rocm: dict[str, Any],
                     arch: str = "gfx906") -> dict[str, Any]:
    libs = _find_libs(_lib_dirs(r, tr, torch_facts, rocm), r"librocblas\.so(\.\d+)*")
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


def _collect_rccl(r: Root, tr: Root, torch_facts: dict[str, Any], rocm: dict[str, Any]) -> dict[str, Any]:
    from g906 import elf

    found = _find_libs(_lib_dirs(r, tr, torch_facts, rocm), r"librccl\.so(\.\d+)*")
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
        e = elf.read_elf(path)
        out["soname"] = e.soname
        out["machine"] = e.machine_name
        out["version"] = elf.rccl_version(path)
        t0 = time.monotonic()
        targets = elf.offload_targets(path)
        out["offload_targets"] = targets
        out["gfx_targets"] = elf.gfx_targets(targets)
        out["has_gfx906"] = elf.has_gfx_target(targets, "gfx906")
        out["scan_s"] = round(time.monotonic() - t0, 3)
    except G906Error as exc:
        out["error"] = exc.message
    return out


def _collect_rccl_swap(torch_facts: dict[str, Any], r: Root) -> dict[str, Any]:
    """State of g906's own RCCL swap for this torch (r: the resolver of torch's paths)."""
    lib_dir = torch_facts.get("lib_dir") if torch_facts.get("found") else None
    if not lib_dir:
        return {"applicable": False}
    try:
        from g906.rccl import state as rstate  # written by the rccl engineer; optional here
    except Exception:  # noqa: BLE001 - not there (yet) or broken: no swap facts
        return {"applicable": False, "reason": "g906.rccl is not available"}
    area = rstate.area_for(r(lib_dir))
    out: dict[str, Any] = {"applicable": True, "area": str(area)}
    try:
        m = rstate.load_manifest(area)
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


def _collect_memory(r: Root) -> dict[str, Any]:
    text = _read_text(r("/proc/meminfo")) or ""
    out: dict[str, Any] = {}
    for key, name in (("MemTotal", "total_bytes"), ("MemAvailable", "available_bytes")):
        m = re.search(rf"^{key}:\s+(\d+)\s*kB", text, re.M)
        if m:
            out[name] = int(m.group(1)) * 1024
    return out


# --- the entry point -----------------------------------------------------------------------------


def collect_facts(
    root: Path | str = Path("/"),
    python: str | None = None,
    timeout_s: float = 30.0,
    *,
    deep: bool = False,
    env: dict[str, str] | None = None,
    identity: tuple[int, list[int]] | None = None,
    probe: dict[str, Any] | None = None,
    run_tools: bool = True,
) -> Facts:
    """Collect the facts of this machine (or of the sysroot `root`).

    python: the interpreter whose torch/triton to inspect (default: this one), run in a
    subprocess limited to `timeout_s`. env: the environment to evaluate (default os.environ).
    identity: (uid, gids) to judge device-node access for (default: this process's).
    probe: recorded probe output to use instead of running the interpreter (tests, --root images).
    run_tools: run rocminfo when present (only on the live system, with the same time limit).
    """
    from g906 import __version__

    r = Root(Path(root))
    if not r.root.is_dir():
        raise UsageError(f"--root {root}: not a directory")
    env_all = dict(os.environ if env is None else env)
    facts = Facts(
        collected_at=time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()),
        g906_version=__version__,
        root=str(r.root),
        env={k: env_all[k] for k in ENV_VARS if k in env_all},
    )
    timings: dict[str, float] = {}

    def guarded(name: str, fn: Callable[[], Any], default: Any) -> Any:
        t0 = time.monotonic()
        try:
            return fn()
        except Exception as exc:  # noqa: BLE001 - a broken collector is a finding, not a crash
            facts.errors.append(f"{name}: {type(exc).__name__}: {exc}")
            return default
        finally:
            timings[name] = round(time.monotonic() - t0, 4)

    interpreter = python or sys.executable
    skip_probe = probe is None and python is None and not r.is_real
    with cf.ThreadPoolExecutor(max_workers=2) as pool:
        # the slow parts run side by side: the probe subprocess and rocminfo
        fut_probe = None
        if probe is None and not skip_probe:
            fut_probe = pool.submit(_probe, interpreter, deep=deep, timeout_s=timeout_s,
                                    env_overrides=({k: v for k, v in env.items()} if env is not None else None))
        facts.platform = guarded("platform", lambda: _collect_platform(r), {})
        facts.user = guarded("user", lambda: _collect_user(r, identity), {"uid": os.getuid(), "gids": []})
        facts.device_nodes = guarded("device_nodes", lambda: _collect_device_nodes(r, facts.user), {})
        gpus_kfd = guarded("kfd", lambda: _collect_kfd(r), ([], {}))
        facts.gpus, facts.kfd = gpus_kfd
        facts.driver = guarded("driver", lambda: _collect_driver(r), {})
        facts.nvidia = guarded("nvidia", lambda: _collect_nvidia(r), {})
        facts.rocm = guarded("rocm", lambda: _collect_rocm(r, env_all, run_tools=run_tools and bool(facts.gpus),
                                                           timeout_s=min(timeout_s, 10.0)), {})
        facts.memory = guarded("memory", lambda: _collect_memory(r), {})
        t0 = time.monotonic()
        if fut_probe is not None:
            try:
                data = fut_probe.result()
            except Exception as exc:  # noqa: BLE001
                data = {"error": f"probe crashed: {type(exc).__name__}: {exc}"}
        elif skip_probe:
            data = {"python": {"executable": None, "skipped": True},
                    "torch": {"found": None, "skipped": "not inspected under --root (pass --python PATH)"},
                    "triton": {"found": None, "skipped": "not inspected under --root (pass --python PATH)"}}
        else:
            data = dict(probe)
        timings["probe_wait"] = round(time.monotonic() - t0, 4)
    if "error" in data and "torch" not in data:
        facts.python = {"executable": interpreter, "error": data["error"],
                        **({"timed_out": True} if data.get("timed_out") else {}),
                        **({"missing": True} if data.get("missing") else {})}
        facts.torch = {"found": None, "error": data["error"]}
        facts.triton = {"found": None, "error": data["error"]}
    else:
        facts.python = dict(data.get("python") or {"executable": interpreter})
        facts.python["probe_s"] = data.get("seconds")
        facts.torch = dict(data.get("torch") or {})
        facts.triton = dict(data.get("triton") or {})
    # paths the probe reported are live paths, except for recorded probes of a sysroot
    tr = r if probe is not None else Root(Path("/"))
    facts.rocblas = guarded("rocblas", lambda: _collect_rocblas(r, tr, env_all, facts.torch, facts.rocm), {})
    facts.rccl = guarded("rccl", lambda: _collect_rccl(r, tr, facts.torch, facts.rocm), {})
    facts.rccl_swap = guarded("rccl_swap", lambda: _collect_rccl_swap(facts.torch, tr), {})
    facts.timings = timings
    return facts
