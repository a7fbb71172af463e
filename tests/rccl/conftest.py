"""Fixtures for g906 rccl tests (see helpers.py for what they build)."""

from __future__ import annotations

from pathlib import Path

import pytest

from .helpers import BROKEN_TORCH, STOCK_ARCHS, FakeEnv, LibFactory


@pytest.fixture(scope="session")
def make_lib(tmp_path_factory) -> LibFactory:
    return LibFactory(tmp_path_factory.mktemp("libs"))


@pytest.fixture(scope="session")
def gfx906_lib(make_lib) -> Path:
    return make_lib("g906", archs=("gfx906", "gfx908"))


@pytest.fixture(scope="session")
def stock_lib(make_lib) -> Path:
    return make_lib("stock", archs=STOCK_ARCHS, version="2.26.6")


@pytest.fixture
def fake_env(tmp_path, stock_lib):
    made = []

    def make(lib: Path | None = None, *, torch_init: str = BROKEN_TORCH, layout: str = "file+link", name: str = "env",
             **kw) -> FakeEnv:
        env = FakeEnv(tmp_path / f"{name}{len(made)}", lib or stock_lib, torch_init=torch_init, layout=layout, **kw)
        made.append(env)
        return env

    return make


@pytest.fixture(autouse=True)
def state_dir(tmp_path, monkeypatch) -> Path:
    d = tmp_path / "state"
    monkeypatch.setenv("G906_STATE_DIR", str(d))
    monkeypatch.delenv("G906_RCCL_FAULT", raising=False)
    return d


