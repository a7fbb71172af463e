"""Helpers for g906 rccl tests: real ELF shared objects, fake torch environments, a CLI runner.

Libraries are compiled with `cc -shared -Wl,-soname,...` and get a .hip_fatbin section (a clang
offload bundle from g906.binfmt.write_offload_bundle) through objcopy; without a compiler they are
built by g906.binfmt.build_elf. A fake torch environment is a site-packages folder holding
torch/version.py, torch/__init__.py and torch/lib/librccl.so.1 (+ librccl.so -> librccl.so.1),
plus bin/python, a wrapper that runs this interpreter with that folder first on PYTHONPATH.
"""

from __future__ import annotations

import hashlib
import os
import shutil
import subprocess
import sys
from pathlib import Path


from g906.binfmt import build_elf, write_offload_bundle

HOST_ID = "host-x86_64-unknown-linux-gnu-"
STOCK_ARCHS = ("gfx908", "gfx90a", "gfx942")     # what torch's ROCm wheel ships (no gfx906)
HAVE_CC = bool(shutil.which("cc") and shutil.which("objcopy"))


def sha(path: Path) -> str:
    return hashlib.sha256(Path(path).read_bytes()).hexdigest()


def bundle_for(archs, tag: str, compress=None) -> bytes:
    entries = [(HOST_ID, b"")]
    entries += [(f"hipv4-amdgcn-amd-amdhsa--{a}:sramecc+:xnack-", f"code object {a} {tag}".encode() * 8) for a in archs]
    return write_offload_bundle(entries, compress)


class LibFactory:
    def __init__(self, root: Path):
        self.root = root
        self.cache: dict[tuple, Path] = {}

    def __call__(self, tag: str = "g906", archs=("gfx906",), version: str = "2.27.7",
                 soname: str = "librccl.so.1", compress=None, pure: bool = False) -> Path:
        key = (tag, tuple(archs), version, soname, compress, pure)
        if key in self.cache:
            return self.cache[key]
        name = hashlib.sha1(repr(key).encode()).hexdigest()[:12]
        out = self.root / f"{name}.so"
        bundle = bundle_for(archs, tag, compress) if archs else None
        if HAVE_CC and not pure:
            src = self.root / f"{name}.c"
            src.write_text(
                f'const char rccl_version_string[] = "RCCL version : {version}-{tag}+hip7.2";\n'
                f'int ncclGetVersion(int *v) {{ *v = 22707; return 0; }}\n'
            )
            raw = self.root / f"{name}.raw.so"
            subprocess.run(["cc", "-shared", "-fPIC", f"-Wl,-soname,{soname}", "-o", str(raw), str(src)],
                           check=True, capture_output=True)
            if bundle is not None:
                (self.root / f"{name}.fatbin").write_bytes(bundle)
                subprocess.run(["objcopy", "--add-section", f".hip_fatbin={self.root / f'{name}.fatbin'}",
                                str(raw), str(out)], check=True, capture_output=True)
            else:
                raw.rename(out)
        else:
            sections = [(".rodata", f"RCCL version : {version}-{tag}+hip7.2\0".encode())]
            if bundle is not None:
                sections.append((".hip_fatbin", bundle))
            out.write_bytes(build_elf(sections, soname=soname))
        out.chmod(0o755)
        self.cache[key] = out
        return out


class FakeEnv:
    def __init__(self, root: Path, lib: Path, *, torch_init: str, torch_version: str = "2.9.1+rocm6.4",
                 layout: str = "file+link"):
        self.root = root
        self.site = root / "site-packages"
        self.torch = self.site / "torch"
        self.lib_dir = self.torch / "lib"
        self.lib_dir.mkdir(parents=True)
        (self.torch / "__init__.py").write_text(torch_init)
        (self.torch / "version.py").write_text(
            f"__version__ = '{torch_version}'\nhip: 'Optional[str]' = '6.4.43482'\ncuda = None\n")
        if layout == "file+link":          # ROCm wheel: librccl.so.1 file, librccl.so -> librccl.so.1
            shutil.copy2(lib, self.lib_dir / "librccl.so.1")
            os.symlink("librccl.so.1", self.lib_dir / "librccl.so")
        elif layout == "chain":            # librccl.so -> librccl.so.1 -> librccl.so.1.0 (file)
            shutil.copy2(lib, self.lib_dir / "librccl.so.1.0")
            os.symlink("librccl.so.1.0", self.lib_dir / "librccl.so.1")
            os.symlink("librccl.so.1", self.lib_dir / "librccl.so")
        elif layout == "none":
            pass
        (self.lib_dir / "libtorch_hip.so").write_bytes(b"not touched")
        self.bin = root / "bin"
        self.bin.mkdir()
        self.python = self.bin / "python"
        self.python.write_text(
            "#!/bin/sh\n"
            f'PYTHONPATH="{self.site}${{PYTHONPATH:+:$PYTHONPATH}}" exec "{sys.executable}" "$@"\n')
        self.python.chmod(0o755)

    def files(self) -> dict[str, str]:
        """name -> sha256 for files, '-> target' for symlinks (every entry of torch/lib)."""
        out = {}
        for p in sorted(self.lib_dir.iterdir()):
            out[p.name] = f"-> {os.readlink(p)}" if p.is_symlink() else sha(p)
        return out


BROKEN_TORCH = 'raise ImportError("librccl.so.1: undefined symbol: ncclCommInitRankConfig (fake torch)")\n'


def real_torch_env(root: Path, lib: Path) -> FakeEnv:
    """A fake env whose torch is the real one (a symlink farm of the installed torch package), with
    `lib` added as torch/lib/librccl.so.1: the CPU probe (gloo) runs for real against it."""
    import importlib.util

    real = Path(importlib.util.find_spec("torch").submodule_search_locations[0])
    env = FakeEnv(root, lib, torch_init="", layout="file+link")
    (env.torch / "__init__.py").unlink()
    (env.torch / "version.py").unlink()
    for entry in real.iterdir():
        if entry.name != "lib":
            os.symlink(entry, env.torch / entry.name)
    for entry in (real / "lib").iterdir():
        if not (env.lib_dir / entry.name).exists():
            os.symlink(entry, env.lib_dir / entry.name)
    (env.lib_dir / "libtorch_hip.so").unlink()
    return env


def run_cli(*args, fault: str | None = None, timeout: float = 120, python: str = sys.executable):
    env = dict(os.environ)
    env.pop("G906_RCCL_FAULT", None)
    env.pop("G906_DEBUG", None)
    if fault:
        env["G906_RCCL_FAULT"] = fault
    # The rccl commands alone (g906.cli.rccl's main): the same code and error handling as
    # `g906 rccl`, independent of other command modules registered in the root app.
    return subprocess.run([python, "-m", "g906.cli.rccl", *map(str, args)], capture_output=True, text=True,
                          env=env, timeout=timeout, stdin=subprocess.DEVNULL)


def assert_clean_error(proc, *needles: str) -> None:
    """A user-facing error: non-zero exit, 'Error:' + 'Hint:', no traceback."""
    text = proc.stdout + proc.stderr
    assert proc.returncode not in (0, None), text
    assert "Traceback" not in text, text
    assert "Error:" in proc.stderr, text
    assert "Hint:" in proc.stderr, text
    for n in needles:
        assert n in text, f"{n!r} not in:\n{text}"


