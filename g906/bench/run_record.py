"""What a benchmark script records about its run (date, versions, GPU, driver, commit), where it
writes it, and the small helpers its long runs share: a timestamped progress line, freeing the
device's cache."""

from __future__ import annotations

import datetime as _dt
import gc
import os
import subprocess
import sys
import time
from pathlib import Path


def log(msg: str) -> None:
    print(f"[{time.strftime('%H:%M:%S')}] {msg}", file=sys.stderr, flush=True)


def free() -> None:
    """Collect garbage and hand the device's cached blocks back (between models of a run)."""
    import torch

    gc.collect()
    if torch.cuda.is_available():
        torch.cuda.empty_cache()


def out_path(out: str | Path | None, default_name: str) -> Path | None:
    """Where a script writes its JSON: `out` itself when it names a .json file, else
    out/default_name (the folder made); None without `out`."""
    if not out:
        return None
    path = Path(out)
    if path.suffix != ".json":
        path.mkdir(parents=True, exist_ok=True)
        return path / default_name
    path.parent.mkdir(parents=True, exist_ok=True)
    return path


def _version(module: str) -> str | None:
    try:
        return __import__(module).__version__
    except Exception:
        return None


def environment(device, root: str | Path) -> dict:
    """The run's facts. commit: the checkout at `root`, "+changes" when its tracked files differ
    from that commit (a copy sent to a GPU machine is not that commit); G906_COMMIT overrides it
    where the copy has no git history."""
    import torch

    env = {"date": _dt.datetime.now(_dt.timezone.utc).isoformat(timespec="seconds"), "torch": torch.__version__,
           "device": str(device), "python": sys.version.split()[0], "triton": _version("triton"),
           "transformers": _version("transformers")}
    if device.type == "cuda":
        p = torch.cuda.get_device_properties(device)
        env["gpu"] = p.name
        env["gpu_memory_gib"] = round(p.total_memory / 2**30, 1)
        env["hip"] = torch.version.hip
        env["cuda"] = torch.version.cuda
        env["driver"] = _driver()
    try:
        def git(*a):
            return subprocess.run(["git", *a], cwd=root, capture_output=True, text=True, timeout=10).stdout.strip()

        env["commit"] = git("rev-parse", "--short", "HEAD") or None
        if env["commit"] and git("status", "--porcelain", "--untracked-files=no"):
            env["commit"] += "+changes"
    except Exception:
        env["commit"] = None
    env["commit"] = os.environ.get("G906_COMMIT", env["commit"])
    return env


def _driver() -> str | None:
    """The GPU driver's version (nvidia-smi; None where it is missing, e.g. ROCm)."""
    try:
        out = subprocess.run(["nvidia-smi", "--query-gpu=driver_version", "--format=csv,noheader"],
                             capture_output=True, text=True, timeout=30).stdout.strip()
    except Exception:
        return None
    return out.splitlines()[0] if out else None
