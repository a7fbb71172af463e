"""Installing g906 never installs a Triton of its own: torch brings the Triton it was built with
(`triton` for CUDA wheels, `pytorch-triton-rocm` for ROCm wheels, a gfx906 fork added by the user),
and a plain `triton` requirement would put upstream Triton over that fork. Triton is an extra."""

from __future__ import annotations

import importlib.metadata as md
import shutil
import subprocess
import sys
from pathlib import Path

import pytest
from packaging.requirements import Requirement
from packaging.utils import canonicalize_name

ROOT = Path(__file__).resolve().parents[1]


@pytest.fixture(scope="module")
def g906_metadata(tmp_path_factory) -> md.Distribution:
    """g906's metadata as `pip install` writes it, built from this checkout's pyproject.toml (the
    metadata of an editable install is written once, by its `pip install -e .`, and goes stale)."""
    src = tmp_path_factory.mktemp("g906-src")
    out = tmp_path_factory.mktemp("g906-metadata")
    for name in ("pyproject.toml", "README.md", "LICENSE", "NOTICE"):
        shutil.copy(ROOT / name, src / name)
    (src / "g906").mkdir()
    (src / "g906" / "__init__.py").write_text("")
    code = "import sys; from setuptools import build_meta; print(build_meta.prepare_metadata_for_build_wheel(sys.argv[1]))"
    done = subprocess.run([sys.executable, "-c", code, str(out)], cwd=src, capture_output=True, text=True, timeout=120)
    assert done.returncode == 0, done.stderr
    return md.PathDistribution(out / done.stdout.strip().splitlines()[-1])


def _needs_an_extra(req: Requirement) -> bool:
    return req.marker is not None and "extra" in str(req.marker)


def _is_triton(req: Requirement) -> bool:
    return "triton" in canonicalize_name(req.name)


def test_triton_is_only_an_extra(g906_metadata):
    reqs = [Requirement(r) for r in g906_metadata.requires or []]
    assert g906_metadata.metadata["Name"] == "g906"
    unconditional = [str(r) for r in reqs if _is_triton(r) and not _needs_an_extra(r)]
    assert unconditional == [], "a Triton requirement outside an extra replaces a ROCm/gfx906 Triton"
    tritons = [r for r in reqs if _is_triton(r)]
    assert [canonicalize_name(r.name) for r in tritons] == ["triton"]
    assert tritons[0].marker.evaluate({"extra": "triton", "sys_platform": "linux"})
    assert "triton" in (g906_metadata.metadata.get_all("Provides-Extra") or [])


def test_no_dependency_pulls_triton_in(g906_metadata):
    """Every distribution g906 depends on, followed through this environment's installed metadata."""
    found: list[str] = []
    seen: set[str] = set()
    todo = [(Requirement(r), "g906") for r in g906_metadata.requires or []]
    while todo:
        req, parent = todo.pop()
        if _needs_an_extra(req):
            continue
        if _is_triton(req):
            found.append(f"{parent} requires {req}")
            continue
        name = canonicalize_name(req.name)
        # torch is not followed: CPU torch (2.13.0 here) requires no Triton, CUDA torch requires
        # `triton` and ROCm torch `pytorch-triton-rocm` — the Triton that torch was built with,
        # which is the one g906's kernels must use.
        if name == "torch" or name in seen or (req.marker is not None and not req.marker.evaluate()):
            continue
        seen.add(name)
        try:
            children = md.requires(name) or []
        except md.PackageNotFoundError:
            continue
        todo.extend((Requirement(r), name) for r in children)
    assert {"typer", "pydantic", "uvicorn", "numpy"} <= seen
    assert found == []
