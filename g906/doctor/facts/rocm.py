"""Facts about the ROCm install: where it is (ROCM_PATH, /opt/rocm, /opt/rocm-X.Y), its
version, and the GPU agents rocminfo lists (run on the live system only, with a time limit)."""

from __future__ import annotations

import os
import re
import subprocess
import time
from typing import Any

from g906.doctor.facts.sysroot import Root, read_text


def _version_tuple(v: str | None) -> tuple[int, ...]:
    if not v:
        return ()
    nums = re.findall(r"\d+", v)
    return tuple(int(x) for x in nums[:3])


def collect_rocm(r: Root, env: dict[str, str], *, run_tools: bool, timeout_s: float) -> dict[str, Any]:
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
        text = (read_text(r(path) / rel) or "").strip()
        if text:
            version, out["version_from"] = text.splitlines()[0].strip(), rel
            break
    if version is None:
        hdr = read_text(r(path) / "include/rocm-core/rocm_version.h") or read_text(r(path) / "include/rocm_version.h") or ""
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
