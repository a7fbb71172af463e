"""Find the installed vLLM, its version, and the flags its `vllm serve` accepts.

Asking vLLM for its help imports torch and takes seconds to a minute, so the answer is cached on
disk (G906_CACHE_DIR, else $XDG_CACHE_HOME/g906, else ~/.cache/g906), keyed by the executable or
interpreter and by the modification times of vLLM's own files — a reinstall, an upgrade or a
`git pull` in an editable fork invalidates it."""

from __future__ import annotations

import hashlib
import json
import os
import re
import shutil
import subprocess
import tempfile
from dataclasses import dataclass, field
from pathlib import Path
from typing import Literal

from g906.backends.errors import VllmNotFoundError, VllmProbeError
from g906.backends.vllm_help import FlagInfo, canonical_flag, mm_limit_format, parse_serve_help

CACHE_FORMAT = 3
CLI_MODULE = "vllm.entrypoints.cli.main"
DEFAULT_PROBE_TIMEOUT_S = 300.0

# Runs inside the target interpreter without importing vllm (that would import torch).
_PROBE_SCRIPT = r"""
import importlib.metadata as md, importlib.util as iu, json, os, sys
out = {"python": sys.executable, "version": None, "pkgdir": None, "cli_main": False, "stamps": {}}
try:
    out["version"] = md.version("vllm")
except Exception:
    pass
spec = iu.find_spec("vllm")
if spec is not None and spec.submodule_search_locations:
    d = list(spec.submodule_search_locations)[0]
    out["pkgdir"] = d
    out["cli_main"] = os.path.isfile(os.path.join(d, "entrypoints", "cli", "main.py"))
    for rel in ("__init__.py", "engine/arg_utils.py", "entrypoints/openai/cli_args.py",
                "entrypoints/cli/serve.py", "config/__init__.py", "version.py", "_version.py",
                "reasoning/__init__.py"):
        p = os.path.join(d, rel)
        try:
            st = os.stat(p)
            out["stamps"][rel] = [st.st_mtime_ns, st.st_size]
        except OSError:
            pass
    # reasoning parser names, read from the source (newer vLLM no longer lists them in --help)
    import re
    names = set()
    rdir = os.path.join(d, "reasoning")
    try:
        files = sorted(f for f in os.listdir(rdir) if f.endswith(".py"))
    except OSError:
        files = []
    for f in files:
        try:
            with open(os.path.join(rdir, f), encoding="utf-8", errors="replace") as fh:
                t = fh.read()
        except OSError:
            continue
        names.update(re.findall(r"register_(?:lazy_)?module\(\s*(?:name\s*=\s*)?[\"']([\w.-]+)[\"']", t))
        for group in re.findall(r"register_module\(\s*(?:name\s*=\s*)?\[([^\]]*)\]", t):
            names.update(re.findall(r"[\"']([\w.-]+)[\"']", group))
        if f == "__init__.py":
            names.update(re.findall(r"^\s*[\"']([\w.-]+)[\"']\s*:\s*\(", t, re.M))
    out["reasoning_parsers"] = sorted(names)
print("G906-PROBE " + json.dumps(out))
"""


@dataclass
class VllmInstall:
    """One installed vLLM: how to run it, its version, and what `vllm serve` accepts."""

    command: list[str]                      # argv prefix before "serve"
    version: str                            # "0.11.1+gfx906", or "unknown"
    flags: dict[str, FlagInfo] = field(default_factory=dict)   # canonical option string -> entry
    source: Literal["executable", "python"] = "executable"
    python: str | None = None               # interpreter that runs it, when known
    help_mode: str = "all"                  # "argparse" (its parser), "all" (--help=all) or "plain" (--help)
    reasoning_parsers: list[str] = field(default_factory=list)  # names found in its source (may be partial)
    # Set when no vLLM was found and a dry run stands in the newest one g906 knows (vllm_assumed.py):
    # the sentence that tells the user so. Such an install is never cached.
    assumed: str | None = None

    def flag(self, name: str) -> FlagInfo | None:
        return self.flags.get(canonical_flag(name))

    def supports(self, name: str) -> bool:
        return self.flag(name) is not None

    def choices(self, name: str) -> list[str] | None:
        info = self.flag(name)
        return info.choices if info else None

    @property
    def mm_limit_format(self) -> str:
        return mm_limit_format(self.flag("--limit-mm-per-prompt"))

    @property
    def describe(self) -> str:
        if self.assumed:
            return f"vLLM {self.version} (assumed: not installed here)"
        return f"vLLM {self.version} ({' '.join(self.command)})"

    def to_json(self) -> dict:
        seen: dict[int, FlagInfo] = {}
        for info in self.flags.values():
            seen.setdefault(id(info), info)
        return {
            "format": CACHE_FORMAT, "command": self.command, "version": self.version,
            "source": self.source, "python": self.python, "help_mode": self.help_mode,
            "reasoning_parsers": self.reasoning_parsers, "flags": [f.to_json() for f in seen.values()],
        }

    @classmethod
    def from_json(cls, d: dict) -> "VllmInstall":
        flags: dict[str, FlagInfo] = {}
        for fd in d["flags"]:
            info = FlagInfo.from_json(fd)
            for n in info.names:
                flags.setdefault(n, info)
        return cls(command=list(d["command"]), version=d["version"], flags=flags, source=d["source"],
                   python=d.get("python"), help_mode=d.get("help_mode", "all"),
                   reasoning_parsers=list(d.get("reasoning_parsers") or []))


# --------------------------------------------------------------------------- locating


def _which(name: str, what: str, hint: str) -> str:
    if os.sep in name or (os.altsep and os.altsep in name):
        p = Path(name).expanduser()
        if not p.exists():
            raise VllmNotFoundError(f"{what} {name} does not exist", hint)
        if not os.access(p, os.X_OK) or p.is_dir():
            raise VllmNotFoundError(f"{what} {name} is not an executable file", hint)
        return str(p.absolute())
    found = shutil.which(name)
    if found is None:
        raise VllmNotFoundError(f"{what} {name!r} was not found on PATH", hint)
    return str(Path(found).absolute())


def _shebang_python(path: str) -> str | None:
    """The interpreter named by a console script's #! line, when it is a Python."""
    try:
        with open(path, "rb") as fh:
            first = fh.readline(512)
    except OSError:
        return None
    if not first.startswith(b"#!"):
        return None
    parts = first[2:].decode("utf-8", "replace").strip().split()
    if not parts:
        return None
    if Path(parts[0]).name == "env" and len(parts) > 1:
        parts = parts[1:]
        found = shutil.which(parts[0])
        parts[0] = found or parts[0]
    interp = parts[0]
    return interp if "python" in Path(interp).name else None


def _probe_env() -> dict[str, str]:
    env = dict(os.environ)
    env["COLUMNS"] = "200"                    # fewer wrapped help lines
    env["NO_COLOR"] = "1"
    env.setdefault("VLLM_LOGGING_LEVEL", "WARNING")
    env.setdefault("PYTHONUNBUFFERED", "1")
    return env


def _run(argv: list[str], timeout: float) -> subprocess.CompletedProcess:
    try:
        return subprocess.run(argv, capture_output=True, text=True, timeout=timeout, env=_probe_env(),
                              stdin=subprocess.DEVNULL, errors="replace")
    except subprocess.TimeoutExpired as exc:
        raise VllmProbeError(
            f"`{' '.join(argv)}` did not finish within {timeout:.0f} s",
            "check that this vLLM imports at all: run the command yourself and watch for a hang",
        ) from exc
    except OSError as exc:
        raise VllmNotFoundError(f"cannot run `{argv[0]}`: {exc.strerror or exc}",
                                "check the path and its permissions") from exc


def _probe_python(python: str, timeout: float) -> dict | None:
    cp = _run([python, "-c", _PROBE_SCRIPT], timeout)
    for line in cp.stdout.splitlines():
        if line.startswith("G906-PROBE "):
            try:
                return json.loads(line[len("G906-PROBE "):])
            except ValueError:
                return None
    return None


_VERSION_LINE_RE = re.compile(r"^\s*(?:vllm\s+)?v?(\d+\.\d+(?:\.\d+)?[0-9A-Za-z.+_-]*)\s*$", re.I)


def parse_version_output(text: str) -> str | None:
    for line in reversed(text.splitlines()):
        m = _VERSION_LINE_RE.match(line)
        if m:
            return m.group(1)
    return None


# --------------------------------------------------------------------------- cache


def cache_dir() -> Path:
    if os.environ.get("G906_CACHE_DIR"):
        return Path(os.environ["G906_CACHE_DIR"])
    base = os.environ.get("XDG_CACHE_HOME") or str(Path.home() / ".cache")
    return Path(base) / "g906"


def _stat_stamp(path: str | None) -> list[int] | None:
    if not path:
        return None
    try:
        st = os.stat(path)
    except OSError:
        return None
    return [st.st_mtime_ns, st.st_size]


def _cache_key(material: dict) -> str:
    blob = json.dumps(material, sort_keys=True).encode()
    return hashlib.sha256(blob).hexdigest()[:24]


def _cache_load(key: str) -> VllmInstall | None:
    path = cache_dir() / f"vllm-serve-flags-{key}.json"
    try:
        d = json.loads(path.read_text())
        if d.get("format") != CACHE_FORMAT:
            return None
        return VllmInstall.from_json(d)
    except (OSError, ValueError, KeyError, TypeError):
        return None


def _cache_store(key: str, install: VllmInstall) -> None:
    d = cache_dir()
    try:
        d.mkdir(parents=True, exist_ok=True)
        fd, tmp = tempfile.mkstemp(prefix=".vllm-flags-", dir=d)
        with os.fdopen(fd, "w") as fh:
            json.dump(install.to_json(), fh)
        os.replace(tmp, d / f"vllm-serve-flags-{key}.json")
    except OSError:
        pass  # a cache that cannot be written is only slower


_MEMO: dict[str, VllmInstall] = {}


# --------------------------------------------------------------------------- detection


def _read_flags(command: list[str], timeout: float, python: str | None = None) -> tuple[dict[str, FlagInfo], str]:
    """vLLM's serve flags: from its argument parser when its interpreter is known (mode
    "argparse", g906/backends/vllm_argparse.py), else (or when that fails) from its help text
    ("all": --help=all, "plain": --help)."""
    if python:
        from g906.backends.vllm_argparse import read_argparse_flags

        flags = read_argparse_flags(python, timeout, env=_probe_env())
        if flags:
            return flags, "argparse"
    cp = _run([*command, "serve", "--help=all"], timeout)
    flags = parse_serve_help(cp.stdout) if cp.returncode == 0 else {}
    if cp.returncode == 0 and len(flags) >= 8:
        return flags, "all"
    cp2 = _run([*command, "serve", "--help"], timeout)
    flags2 = parse_serve_help(cp2.stdout) if cp2.returncode == 0 else {}
    if cp2.returncode == 0 and len(flags2) >= 8:
        return flags2, "plain"
    tail = (cp2.stderr or cp2.stdout or cp.stderr or cp.stdout).strip().splitlines()[-15:]
    raise VllmProbeError(
        f"could not read the flags of `{' '.join(command)} serve` "
        f"(--help=all exited {cp.returncode}, --help exited {cp2.returncode})",
        "run `vllm serve --help` yourself: vLLM must import cleanly in this environment",
        details=tail,
    )


def detect_vllm(python: str | None = None, executable: str | None = None, *, refresh: bool = False,
                timeout_s: float = DEFAULT_PROBE_TIMEOUT_S) -> VllmInstall:
    """Locate vLLM and read its version and `serve` flags (cached).

    executable: the vllm program (a path or a name on PATH); python: an interpreter whose vllm
    package to run as `python -m vllm.entrypoints.cli.main`. Neither: `vllm` on PATH."""
    if python and executable:
        raise VllmNotFoundError(
            "engine.vllm.python and engine.vllm.executable are both set",
            "set one of them: the interpreter that has vllm installed, or the vllm program itself",
        )
    probe: dict | None = None
    if python:
        py = _which(python, "the Python interpreter", "set engine.vllm.python to an existing interpreter")
        probe = _probe_python(py, timeout_s)
        if probe is None or not probe.get("pkgdir"):
            raise VllmNotFoundError(
                f"{py} has no vllm package",
                "install vLLM (or your gfx906 fork) into that environment, or point engine.vllm.python elsewhere",
            )
        if not probe.get("cli_main"):
            raise VllmNotFoundError(
                f"the vllm package of {py} has no {CLI_MODULE} (vLLM {probe.get('version') or '?'} is too old)",
                "g906 drives vLLM >= 0.8, whose command line is `vllm serve`",
            )
        command = [py, "-m", CLI_MODULE]
        source: Literal["executable", "python"] = "python"
        material = {"python": py, "python_stat": _stat_stamp(py), "probe": probe}
    else:
        exe = _which(executable or "vllm", "the vLLM executable",
                     "install vLLM, activate its environment, or set engine.vllm.executable / engine.vllm.python")
        command = [exe]
        source = "executable"
        py = _shebang_python(exe)
        if py and Path(py).exists():
            try:
                probe = _probe_python(py, min(timeout_s, 60.0))
            except (VllmProbeError, VllmNotFoundError):
                probe = None
        material = {"exe": exe, "exe_real": os.path.realpath(exe), "exe_stat": _stat_stamp(exe),
                    "python": py, "probe": probe}
    key = _cache_key({"format": CACHE_FORMAT, **material})
    if not refresh:
        if key in _MEMO:
            return _MEMO[key]
        cached = _cache_load(key)
        if cached is not None:
            _MEMO[key] = cached
            return cached

    version = (probe or {}).get("version")
    if not version:
        cp = _run([*command, "--version"], timeout_s)
        version = parse_version_output(cp.stdout) or parse_version_output(cp.stderr)
        if cp.returncode != 0 and not version:
            tail = (cp.stderr or cp.stdout).strip().splitlines()[-15:]
            raise VllmProbeError(
                f"`{' '.join(command)} --version` exited with status {cp.returncode}",
                "vLLM must import cleanly in this environment; run the command yourself to see why it fails",
                details=tail,
            )
    # vLLM's interpreter: the one named, or the one whose probe found a vllm package
    interp = command[0] if source == "python" else ((probe or {}).get("python") if (probe or {}).get("pkgdir") else None)
    flags, mode = _read_flags(command, timeout_s, python=interp)
    install = VllmInstall(command=command, version=version or "unknown", flags=flags, source=source,
                          python=(probe or {}).get("python") or (python and command[0]) or None,
                          help_mode=mode, reasoning_parsers=list((probe or {}).get("reasoning_parsers") or []))
    _cache_store(key, install)
    _MEMO[key] = install
    return install


def clear_memo() -> None:
    """Forget in-process detections (tests; the disk cache stays)."""
    _MEMO.clear()
