"""torch and triton of the inspected interpreter, through probe.py in a subprocess with a time
limit: a missing, broken or hanging torch becomes a finding, never a crash or hang of the doctor
(and torch is never imported here)."""

from __future__ import annotations

import json
import os
import subprocess
import time
from typing import Any

from g906.doctor import probe as probe_script


def run_probe(python: str, *, deep: bool, timeout_s: float, env_overrides: dict[str, str] | None) -> dict[str, Any]:
    cmd = [python, probe_script.__file__] + (["--deep"] if deep else [])
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
    if probe_script.MARKER not in cp.stdout:
        tail = (cp.stderr or cp.stdout).strip().splitlines()[-3:]
        return {"error": f"the probe of {python} exited with status {cp.returncode}: " + " | ".join(tail),
                "returncode": cp.returncode}
    try:
        data = json.loads(cp.stdout.split(probe_script.MARKER, 1)[1].strip().splitlines()[0])
    except (json.JSONDecodeError, IndexError) as exc:
        return {"error": f"the probe of {python} printed unreadable output ({exc})"}
    data["seconds"] = round(time.monotonic() - t0, 3)
    if cp.returncode != 0:
        data["returncode"] = cp.returncode
    return data


# What stands for the probe's output under --root when no interpreter was named: the sysroot's
# torch cannot be run from here.
NOT_PROBED: dict[str, Any] = {
    "python": {"executable": None, "skipped": True},
    "torch": {"found": None, "skipped": "not inspected under --root (pass --python PATH)"},
    "triton": {"found": None, "skipped": "not inspected under --root (pass --python PATH)"},
}


def interpreter_facts(data: dict[str, Any], interpreter: str) -> tuple[dict[str, Any], dict[str, Any], dict[str, Any]]:
    """The python, torch and triton facts from the probe's output (or its failure to run)."""
    if "error" in data and "torch" not in data:
        python = {"executable": interpreter, "error": data["error"],
                  **({"timed_out": True} if data.get("timed_out") else {}),
                  **({"missing": True} if data.get("missing") else {})}
        return python, {"found": None, "error": data["error"]}, {"found": None, "error": data["error"]}
    python = dict(data.get("python") or {"executable": interpreter})
    python["probe_s"] = data.get("seconds")
    return python, dict(data.get("torch") or {}), dict(data.get("triton") or {})
