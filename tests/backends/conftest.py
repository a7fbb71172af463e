from __future__ import annotations

import copy
import json
import os
import socket
import sys
from pathlib import Path
from unittest import mock

import pytest

from g906.backends import vllm_detect

SRC = Path(__file__).with_name("fake_vllm_src.py")


class FakeVllm:
    def __init__(self, root: Path, monkeypatch: pytest.MonkeyPatch):
        self.root = root
        self.mp = monkeypatch
        self.bin = root / "bin"
        self.bin.mkdir()
        self.exe = self.bin / "vllm"
        self.exe.write_text(f"#!{sys.executable}\n" + SRC.read_text())
        self.exe.chmod(0o755)
        self.record = root / "record.json"
        self.signal_log = root / "signals.log"
        self.calls = root / "calls.log"
        monkeypatch.setenv("PATH", f"{self.bin}{os.pathsep}{os.environ.get('PATH', '')}")
        monkeypatch.setenv("FAKE_VLLM_RECORD", str(self.record))
        monkeypatch.setenv("FAKE_VLLM_SIGNAL_LOG", str(self.signal_log))
        monkeypatch.setenv("FAKE_VLLM_CALLS", str(self.calls))
        monkeypatch.setenv("G906_CACHE_DIR", str(root / "cache"))
        monkeypatch.delenv("CUDA_VISIBLE_DEVICES", raising=False)
        monkeypatch.delenv("HIP_VISIBLE_DEVICES", raising=False)

    def set(self, **kw) -> None:
        for k, v in kw.items():
            self.mp.setenv(f"FAKE_VLLM_{k.upper()}", str(v))

    def recorded(self) -> dict:
        return json.loads(self.record.read_text())

    def call_log(self) -> list[str]:
        return self.calls.read_text().split() if self.calls.exists() else []

    def signals(self) -> list[str]:
        return self.signal_log.read_text().split() if self.signal_log.exists() else []

    def python_package(self, reasoning_sources: dict[str, str] | None = None, *, argparse: bool = False) -> Path:
        """A fake `vllm` package (for engine.vllm.python = this interpreter); returns PYTHONPATH dir.
        argparse: also vLLM's parser modules (vllm.utils.FlexibleArgumentParser and
        vllm.entrypoints.openai.cli_args.make_arg_parser), built from the fake's own parser."""
        site = self.root / "site"
        pkg = site / "vllm" / "entrypoints" / "cli"
        pkg.mkdir(parents=True)
        for d in (site / "vllm", site / "vllm" / "entrypoints", pkg):
            (d / "__init__.py").write_text("")
        (pkg / "main.py").write_text(SRC.read_text())
        if argparse:
            (site / "vllm" / "utils").mkdir()
            (site / "vllm" / "utils" / "__init__.py").write_text(
                "import argparse\n\n\nclass FlexibleArgumentParser(argparse.ArgumentParser):\n    pass\n")
            oa = site / "vllm" / "entrypoints" / "openai"
            oa.mkdir()
            (oa / "__init__.py").write_text("")
            # the fake's parser, without running its main(): make_arg_parser returns it
            (oa / "fake_parser.py").write_text(SRC.read_text().replace("\nmain()\n", "\n"))
            (oa / "cli_args.py").write_text(
                "from vllm.entrypoints.openai.fake_parser import build_parser\n\n\n"
                "def make_arg_parser(parser):\n    return build_parser()\n")
        reasoning = site / "vllm" / "reasoning"
        reasoning.mkdir()
        for name, text in (reasoning_sources or {}).items():
            (reasoning / name).write_text(text)
        self.mp.setenv("PYTHONPATH", str(site))
        return site


@pytest.fixture
def fake_vllm(tmp_path, monkeypatch) -> FakeVllm:
    vllm_detect.clear_memo()
    yield FakeVllm(tmp_path, monkeypatch)
    vllm_detect.clear_memo()


@pytest.fixture
def free_port() -> int:
    s = socket.socket()
    s.bind(("127.0.0.1", 0))
    port = s.getsockname()[1]
    s.close()
    return port


@pytest.fixture(scope="session")
def _session_install(tmp_path_factory):
    """One fake vLLM (default flavour) detected once per session: most tests only need its flags.
    The fake reads FAKE_VLLM_* at run time, so per-test settings still reach it through serve()."""
    root = tmp_path_factory.mktemp("session-vllm")
    exe = root / "bin" / "vllm"
    exe.parent.mkdir()
    exe.write_text(f"#!{sys.executable}\n" + SRC.read_text())
    exe.chmod(0o755)
    clean = {k: v for k, v in os.environ.items() if not k.startswith("FAKE_VLLM_")}
    clean["G906_CACHE_DIR"] = str(root / "cache")
    with mock.patch.dict(os.environ, clean, clear=True):
        inst = vllm_detect.detect_vllm(executable=str(exe))
    vllm_detect.clear_memo()
    return inst


@pytest.fixture
def vllm(fake_vllm, _session_install):
    """A detected fork-flavoured vLLM (a private copy: tests may edit its flags)."""
    return copy.deepcopy(_session_install)
