"""Which names our checkout puts at the top of the import system, and whether any of them shadows
a module that an installed distribution provides.

Python puts directories of ours on sys.path in three ways: the repository root (`python -m`,
`python -c`, pytest's rootdir), a script's own folder (`python benchmarks/x.py`), and, in pytest's
default import mode, the first folder above a test file that is not a package. Every folder and
module directly inside such a directory is importable by its bare name, ahead of site-packages.
"""

from __future__ import annotations

import importlib.metadata
from pathlib import Path

# Folders of scripts that are run as `python FOLDER/script.py`.
SCRIPT_FOLDERS = ("benchmarks",)


def distribution_top_levels() -> dict[str, list[str]]:
    """Top-level module name -> the installed distributions that provide it."""
    return importlib.metadata.packages_distributions()


def _importable_names(folder: Path) -> set[str]:
    names = set()
    for child in folder.iterdir():
        if child.name.startswith((".", "_")):
            continue
        if child.is_dir() and not child.name.endswith(("-info", ".egg-info")):
            names.add(child.name)
        elif child.suffix == ".py":
            names.add(child.stem)
    return names


def pytest_sys_path_folders(tests: Path) -> set[Path]:
    """The folders pytest's `prepend` import mode inserts for the test files under `tests`: for
    each test or conftest file, the first folder above it without an __init__.py."""
    folders = set()
    for f in list(tests.rglob("test_*.py")) + list(tests.rglob("conftest.py")):
        folder = f.parent
        while (folder / "__init__.py").exists():
            folder = folder.parent
        folders.add(folder)
    return folders


def shadowing(root: Path, top_levels: dict[str, list[str]], own: str = "g906") -> list[str]:
    """'folder/name (provided by dist)' for every name of ours that would shadow an installed
    distribution's top-level module (distributions named `own` are ours and excluded)."""
    folders = {root} | {root / s for s in SCRIPT_FOLDERS if (root / s).is_dir()}
    if (root / "tests").is_dir():
        folders |= pytest_sys_path_folders(root / "tests")
    found = []
    for folder in sorted(folders):
        for name in sorted(_importable_names(folder)):
            dists = [d for d in top_levels.get(name, []) if d.lower() != own]
            if dists:
                where = folder.relative_to(root).as_posix() if folder != root else "."
                found.append(f"{where}/{name} (shadows {', '.join(sorted(set(dists)))})")
    return found
