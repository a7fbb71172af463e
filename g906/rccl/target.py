"""Which torch/lib directory to change, found without importing torch in this process."""

from __future__ import annotations

import json
import os
import re
import shutil
import subprocess
import sys
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

from g906.errors import G906Error, UsageError

RCCL_NAME_RE = re.compile(r"^librccl\.so(\.[0-9]+)*$")

# Run by the target interpreter: where is torch, without importing it (import torch may be the
# very thing that is broken).
_LOCATE = r"""
import importlib.util, json, sys
out = {"executable": sys.executable, "prefix": sys.prefix, "version": sys.version.split()[0]}
try:
    spec = importlib.util.find_spec("torch")
except Exception as exc:
    spec = None
    out["error"] = "%s: %s" % (type(exc).__name__, exc)
if spec is not None:
    out["origin"] = spec.origin
    out["locations"] = list(spec.submodule_search_locations or [])
print("G906LOCATE " + json.dumps(out))
"""


@dataclass
class Target:
    lib_dir: Path
    python: str | None            # interpreter whose torch this is (probes run with it)
    torch_dir: Path | None
    torch_version: str | None
    hip_version: str | None
    cuda_version: str | None

    def to_json(self) -> dict[str, Any]:
        d = asdict(self)
        d["lib_dir"] = str(self.lib_dir)
        d["torch_dir"] = str(self.torch_dir) if self.torch_dir else None
        return d


def read_torch_version(torch_dir: Path) -> dict[str, str | None]:
    """__version__, hip and cuda from torch/version.py, read as text (never imported)."""
    out: dict[str, str | None] = {"version": None, "hip": None, "cuda": None}
    try:
        text = (torch_dir / "version.py").read_text(errors="replace")
    except OSError:
        return out
    for key, name in (("version", "__version__"), ("hip", "hip"), ("cuda", "cuda")):
        m = re.search(rf"^{name}\s*(?::[^=]*)?=\s*['\"]([^'\"]+)['\"]", text, re.M)
        if m:
            out[key] = m.group(1)
    return out


def locate_torch(python: str, *, timeout: float = 60) -> Path:
    """The torch package directory of interpreter *python* (run in a subprocess)."""
    exe = shutil.which(python) if os.sep not in python else os.path.abspath(os.path.expanduser(python))
    if not exe or not os.path.exists(exe):
        raise UsageError(
            f"Python interpreter {python!r} was not found.",
            hint="pass the path of the environment's interpreter, e.g. --python /path/to/venv/bin/python.",
        )
    if not os.access(exe, os.X_OK) or os.path.isdir(exe):
        raise UsageError(f"{exe} is not an executable Python interpreter.", hint="check the --python path.")
    try:
        proc = subprocess.run([exe, "-c", _LOCATE], capture_output=True, text=True, timeout=timeout,
                              stdin=subprocess.DEVNULL)
    except subprocess.TimeoutExpired:
        raise G906Error(f"{exe} did not answer within {timeout:.0f} s.", hint="check that this interpreter starts.") from None
    except OSError as exc:
        raise UsageError(f"cannot run {exe}: {exc.strerror or exc}.", hint="check the --python path.") from None
    line = next((ln for ln in proc.stdout.splitlines() if ln.startswith("G906LOCATE ")), None)
    if line is None:
        tail = (proc.stderr or proc.stdout).strip().splitlines()[-1:] or ["no output"]
        raise G906Error(f"{exe} failed to run a one-line Python script: {tail[0]}",
                        hint="check that this is a working Python interpreter.")
    info = json.loads(line[len("G906LOCATE "):])
    locations = info.get("locations") or []
    if not locations:
        raise G906Error(
            f"torch is not installed in the environment of {exe}.",
            hint="pass --python for the environment that holds torch, or --lib-dir with its torch/lib folder.",
        )
    return Path(locations[0])


def resolve_target(python: str | None = None, lib_dir: str | os.PathLike | None = None) -> Target:
    """--lib-dir wins for the files; --python (default: this interpreter) finds torch and runs probes."""
    if python is not None:   # absolute (probes run in another folder), symlinks kept (a venv's python is one)
        python = os.path.abspath(os.path.expanduser(python)) if os.sep in python else (shutil.which(python) or python)
    if lib_dir is not None:
        ld = Path(lib_dir).expanduser().absolute()
        if not ld.is_dir():
            raise UsageError(f"--lib-dir {ld} is not a directory.", hint="pass the torch/lib folder of the environment to change.")
        torch_dir = ld.parent if (ld.parent / "version.py").is_file() else None
        py = python
    else:
        py = python or sys.executable
        torch_dir = locate_torch(py)
        ld = torch_dir / "lib"
        if not ld.is_dir():
            raise G906Error(f"torch at {torch_dir} has no lib folder.",
                            hint="this torch install looks broken; reinstall torch in that environment.")
    ver = read_torch_version(torch_dir) if torch_dir else {"version": None, "hip": None, "cuda": None}
    return Target(lib_dir=ld, python=py, torch_dir=torch_dir, torch_version=ver["version"],
                  hip_version=ver["hip"], cuda_version=ver["cuda"])


@dataclass
class Entry:
    name: str
    kind: str                 # "file" | "symlink" | "other"
    link: str | None = None


def list_rccl_entries(lib_dir: Path) -> list[Entry]:
    """Every librccl.so* entry of *lib_dir* (temp files of g906 start with a dot, never match)."""
    out: list[Entry] = []
    try:
        names = sorted(os.listdir(lib_dir))
    except OSError as exc:
        raise G906Error(f"cannot list {lib_dir}: {exc.strerror or exc}.", hint="check the folder's permissions.") from None
    for name in names:
        if not RCCL_NAME_RE.match(name):
            continue
        p = lib_dir / name
        if p.is_symlink():
            out.append(Entry(name, "symlink", os.readlink(p)))
        elif p.is_file():
            out.append(Entry(name, "file"))
        else:
            out.append(Entry(name, "other"))
    return out
