"""The torch/triton probe as a real subprocess of another interpreter (--python PATH): broken
and hanging imports become findings; the doctor process itself never imports torch."""

from __future__ import annotations

import os
import subprocess
import sys
import textwrap
from pathlib import Path

from g906.doctor import collect_facts, run_checks


def fake_python(tmp_path: Path, torch_init: str, version_py: str | None = None) -> str:
    """An interpreter whose `torch` is the given __init__.py (a wrapper around this Python)."""
    site = tmp_path / "site"
    (site / "torch").mkdir(parents=True)
    (site / "torch/__init__.py").write_text(textwrap.dedent(torch_init))
    if version_py is not None:
        (site / "torch/version.py").write_text(textwrap.dedent(version_py))
    exe = tmp_path / "python"
    exe.write_text(f"#!/bin/sh\nPYTHONPATH={site} exec {sys.executable} \"$@\"\n")
    exe.chmod(0o755)
    return str(exe)


def by_id(findings, cid):
    return next(f for f in findings if f.id == cid)


def test_broken_torch_import_is_a_finding(tmp_path):
    py = fake_python(tmp_path, "raise ImportError('libamdhip64.so.6: cannot open shared object file')\n",
                     "__version__ = '2.9.1+rocm6.3'\nhip: str = '6.3.42131'\ncuda = None\n")
    facts = collect_facts(tmp_path, python=py, timeout_s=60, env={}, run_tools=False)
    t = facts.torch
    assert t["found"] is True and t["import_ok"] is False
    assert "libamdhip64.so.6" in t["error"]
    assert t["version"] == "2.9.1+rocm6.3" and t["hip"] == "6.3.42131"  # read from version.py, not imported
    f = by_id(run_checks(facts), "torch.import")
    assert f.status == "fail" and "libamdhip64.so.6" in f.summary


def test_hanging_torch_import_times_out(tmp_path):
    py = fake_python(tmp_path, "import time\ntime.sleep(60)\n")
    facts = collect_facts(tmp_path, python=py, timeout_s=3, env={}, run_tools=False)
    f = by_id(run_checks(facts), "python.interpreter")
    assert f.status == "fail" and "did not finish within 3 s" in f.summary


def test_missing_interpreter(tmp_path):
    facts = collect_facts(tmp_path, python=str(tmp_path / "no-python"), timeout_s=5, env={}, run_tools=False)
    f = by_id(run_checks(facts), "python.interpreter")
    assert f.status == "fail" and "no such interpreter" in f.summary
    assert by_id(run_checks(facts), "torch.import").status == "skip"


def test_interpreter_without_torch(tmp_path):
    exe = tmp_path / "python"
    exe.write_text(f"#!/bin/sh\nexec {sys.executable} -S \"$@\"\n")  # -S: no site-packages, so no torch
    exe.chmod(0o755)
    facts = collect_facts(tmp_path, python=str(exe), timeout_s=30, env={}, run_tools=False)
    assert facts.torch["found"] is False
    f = by_id(run_checks(facts), "torch.import")
    assert f.status == "fail" and "not installed" in f.summary and "pip install torch" in f.fix


def test_doctor_modules_do_not_import_torch():
    code = ("import sys, g906.doctor, g906.doctor.checks, g906.cli.doctor, g906.binfmt;"
            "from g906.doctor.checks import all_checks; all_checks();"
            "print('torch' in sys.modules, 'triton' in sys.modules)")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    assert out.stdout.strip() == "False False"


def test_probe_script_is_standalone():
    src = (Path(__file__).parents[2] / "g906/doctor/probe.py").read_text()
    assert "import g906" not in src and "from g906" not in src
    env = dict(os.environ)
    env["PYTHONPATH"] = ""
    probe = Path(__file__).parents[2] / "g906/doctor/probe.py"
    out = subprocess.run([sys.executable, "-S", str(probe)], capture_output=True, text=True, env=env, timeout=60)
    assert out.returncode == 0 and "--g906-probe-json--" in out.stdout
