"""The layer contracts in pyproject.toml ([tool.importlinter]) hold for the tree, and
`lint-imports` (part of the README's test command) fails when someone adds a back edge: run on a
copy of the package with deliberate back edges added."""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
LINT = Path(sys.executable).parent / "lint-imports"

pytestmark = pytest.mark.skipif(not LINT.exists(), reason="import-linter is not installed")


def _lint(tree: Path) -> subprocess.CompletedProcess:
    env = {**os.environ, "PYTHONPATH": str(tree)}
    return subprocess.run([str(LINT), "--no-cache"], cwd=tree, env=env, capture_output=True, text=True,
                          timeout=300)


@pytest.fixture(scope="module")
def tree(tmp_path_factory) -> Path:
    """A copy of g906's Python files and pyproject.toml, importable from its own folder."""
    dst = tmp_path_factory.mktemp("house")
    shutil.copytree(ROOT / "g906", dst / "g906", ignore=shutil.ignore_patterns("__pycache__", "*.pyc"))
    shutil.copy(ROOT / "pyproject.toml", dst)
    return dst


def _with(tree: Path, files: dict[str, str], tmp_path: Path) -> Path:
    copy = tmp_path / "tree"
    shutil.copytree(tree, copy)
    for rel, text in files.items():
        (copy / rel).write_text(text)
    return copy


def test_the_tree_keeps_every_contract(tree):
    out = _lint(tree)
    assert out.returncode == 0, out.stdout[-4000:] + out.stderr[-2000:]
    assert "0 broken" in out.stdout


@pytest.mark.parametrize("rel, text, contract", [
    ("g906/kernels/_back_edge.py", "import g906.engine.llm\n", "kernels import torch and triton"),
    ("g906/engine/_back_edge.py", "from g906.recipe import resolve\n", "the engine takes its own EngineConfig"),
    ("g906/recipe/_back_edge.py", "import torch\n", "recipe, doctor, rccl and the architecture registry"),
    ("g906/engine/_back_edge.py", "import g906.server.app\n", "the serving stack points down"),
])
def test_a_deliberate_back_edge_breaks_its_contract(tree, tmp_path, rel, text, contract):
    out = _lint(_with(tree, {rel: text}, tmp_path))
    assert out.returncode != 0
    broken = out.stdout.split("Broken contracts", 1)[-1]
    assert contract in broken, out.stdout[-4000:]


def test_two_modules_importing_each_other_break_the_acyclic_contract(tree, tmp_path):
    files = {"g906/engine/_ping.py": "from g906.engine import _pong\n",
             "g906/engine/_pong.py": "from g906.engine import _ping\n"}
    out = _lint(_with(tree, files, tmp_path))
    assert out.returncode != 0
    assert "No cycles are allowed in g906.engine" in out.stdout
