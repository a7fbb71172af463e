"""deploy/: what can be checked without Docker or a systemd host. The unit file goes through
`systemd-analyze verify` when this machine has it (and a structural check always); the Dockerfile's
COPY sources exist, its g906 command line is one `g906 up` accepts, and its health check is
valid Python."""

from __future__ import annotations

import ast
import os
import re
import shlex
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
UNIT = ROOT / "deploy" / "g906.service"
DOCKERFILE = ROOT / "deploy" / "Dockerfile"


def unit_sections(text: str) -> dict[str, list[tuple[str, str]]]:
    """systemd's INI dialect: repeated keys allowed, # and ; comments, no continuation lines."""
    sections: dict[str, list[tuple[str, str]]] = {}
    current = None
    for n, raw in enumerate(text.splitlines(), 1):
        line = raw.strip()
        if not line or line[0] in "#;":
            continue
        if line.startswith("[") and line.endswith("]"):
            current = sections.setdefault(line[1:-1], [])
            continue
        assert current is not None, f"line {n}: a key outside any section"
        assert "=" in line, f"line {n}: not KEY=VALUE: {raw!r}"
        k, v = line.split("=", 1)
        assert re.fullmatch(r"[A-Za-z][A-Za-z0-9]*", k.strip()), f"line {n}: bad key {k!r}"
        current.append((k.strip(), v.strip()))
    return sections


def g906_up_options() -> set[str]:
    out = subprocess.run([sys.executable, "-m", "g906", "up", "--help"], capture_output=True, text=True,
                         env={**os.environ, "COLUMNS": "200"}, timeout=120)
    assert out.returncode == 0, out.stderr
    return set(re.findall(r"(--[a-z][a-z-]+)", out.stdout))


def test_unit_file_structure():
    s = unit_sections(UNIT.read_text())
    assert set(s) == {"Unit", "Service", "Install"}
    svc = dict(s["Service"])
    assert svc["Type"] == "simple" and svc["KillSignal"] == "SIGTERM" and svc["Restart"] == "on-failure"
    argv = shlex.split(svc["ExecStart"])
    assert argv[0].startswith("/") and argv[0].endswith("/g906") and argv[1] == "up"
    opts = g906_up_options()
    for a in argv[2:]:
        if a.startswith("--"):
            assert a in opts, f"ExecStart passes {a}, which g906 up does not take"
    drain = float(argv[argv.index("--drain-timeout") + 1])
    stop = svc["TimeoutStopSec"]
    assert float(stop) > drain, "systemd must give the drain time before it kills"
    assert dict(s["Install"])["WantedBy"] == "multi-user.target"
    groups = svc["SupplementaryGroups"].split()
    assert {"video", "render"} <= set(groups)          # /dev/kfd and /dev/dri access for ROCm


@pytest.mark.skipif(shutil.which("systemd-analyze") is None, reason="systemd-analyze is not installed")
def test_unit_file_verifies(tmp_path):
    # the binary does not exist here: point ExecStart at one that does, keep everything else
    text = re.sub(r"^ExecStart=\S+", f"ExecStart={shutil.which('true')}", UNIT.read_text(), flags=re.M)
    (tmp_path / "g906.service").write_text(text)
    out = subprocess.run(["systemd-analyze", "verify", str(tmp_path / "g906.service")], capture_output=True,
                         text=True, timeout=60)
    problems = [line for line in (out.stderr + out.stdout).splitlines()
                if "g906.service" in line and not re.search(r"User=|Group=|group|user", line)]
    assert out.returncode == 0 and not problems, out.stderr + out.stdout


def dockerfile_instructions(text: str) -> list[tuple[str, str]]:
    """(INSTRUCTION, arguments) with continuation lines joined and comments dropped."""
    out, buf = [], ""
    for raw in text.splitlines():
        line = raw.rstrip()
        if not buf and (not line.strip() or line.lstrip().startswith("#")):
            continue
        if line.endswith("\\"):
            buf += line[:-1] + " "
            continue
        buf += line
        word, _, rest = buf.strip().partition(" ")
        out.append((word.upper(), rest.strip()))
        buf = ""
    assert not buf, "the Dockerfile ends inside a continued line"
    return out


def test_dockerfile_references_existing_files_and_a_valid_command():
    ins = dockerfile_instructions(DOCKERFILE.read_text())
    known = {"ARG", "FROM", "ENV", "RUN", "COPY", "USER", "WORKDIR", "VOLUME", "EXPOSE", "HEALTHCHECK",
             "ENTRYPOINT", "CMD", "LABEL"}
    assert all(i in known for i, _ in ins), [i for i, _ in ins if i not in known]
    assert ins[0][0] in ("ARG", "FROM") and any(i == "FROM" for i, _ in ins)
    base = next(a for i, a in ins if i == "ARG" and a.startswith("ROCM_IMAGE="))
    assert base.split("=", 1)[1].startswith("rocm/")            # a ROCm base image
    copies = [a for i, a in ins if i == "COPY"]
    assert copies
    for args in copies:
        parts = [p for p in shlex.split(args) if not p.startswith("--")]
        for src in parts[:-1]:
            assert (ROOT / src).exists(), f"COPY {src}: no such file in the repository"
    run = " ".join(a for i, a in ins if i == "RUN")
    assert "download.pytorch.org/whl/rocm" in DOCKERFILE.read_text() and "pip install /src" in run
    assert "/tmp/wheels/*.whl" in run                            # the gfx906 Triton
    import json

    entry = json.loads(next(a for i, a in ins if i == "ENTRYPOINT"))
    cmd = json.loads(next(a for i, a in ins if i == "CMD"))
    assert entry == ["g906", "up"]
    assert cmd[0].endswith("recipes/demo.toml") and (ROOT / "recipes" / "demo.toml").is_file()
    health = next(a for i, a in ins if i == "HEALTHCHECK")
    code = shlex.split(health.split(" CMD ", 1)[1])
    assert code[:2] == ["python3", "-c"]
    ast.parse(code[2])
    assert "/health" in code[2]
    env = " ".join(a for i, a in ins if i == "ENV")
    assert "G906_HOST=0.0.0.0" in env and "HF_HOME=" in env       # the G906_* variables g906 up reads
