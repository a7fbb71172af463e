"""Every error path of `g906 rccl`: one clear sentence, a hint, a non-zero exit, no traceback."""

from __future__ import annotations

import json
import os
import subprocess
import sys

from g906.rccl import install, resolve_target
from g906.rccl import state as st

from .helpers import assert_clean_error, run_cli


def test_bad_python(tmp_path, gfx906_lib):
    assert_clean_error(run_cli("status", "--python", tmp_path / "nope" / "python"), "was not found")
    assert_clean_error(run_cli("install", gfx906_lib, "--python", "no-such-python-xyz"), "was not found")
    d = tmp_path / "dir"
    d.mkdir()
    assert_clean_error(run_cli("status", "--python", d), "not an executable")


def test_python_without_torch(tmp_path):
    py = tmp_path / "python"
    py.write_text(f'#!/bin/sh\nexec "{sys.executable}" -S "$@"\n')   # -S: no site-packages, no torch
    py.chmod(0o755)
    assert_clean_error(run_cli("status", "--python", py), "torch is not installed")


def test_bad_lib_dir(tmp_path):
    assert_clean_error(run_cli("rollback", "--lib-dir", tmp_path / "nope"), "is not a directory")


def test_rollback_without_backup(fake_env):
    env = fake_env()
    assert_clean_error(run_cli("rollback", "--python", env.python), "no g906 backup")


def test_refusals_through_the_cli(fake_env, gfx906_lib, make_lib):
    env = fake_env()
    assert_clean_error(run_cli("install", make_lib("other", archs=("gfx90a",)), "--python", env.python),
                       "no gfx906 device code", "--force")
    assert_clean_error(run_cli("install", make_lib("so2", soname="librccl.so.2"), "--python", env.python),
                       "SONAME is 'librccl.so.2'")
    install(gfx906_lib, resolve_target(str(env.python)), probe=False)
    again = run_cli("install", gfx906_lib, "--python", env.python, "--no-probe")   # a no-op succeeds
    assert again.returncode == 0 and "nothing to do" in again.stdout, again.stderr
    st.manifest_path(st.area_for(env.lib_dir)).write_text("{")
    assert_clean_error(run_cli("rollback", "--python", env.python), "is damaged")
    s = run_cli("status", "--python", env.python, "--json")       # status still reports, it does not fail
    assert s.returncode == 0 and json.loads(s.stdout)["state"] == "damaged"


def test_json_errors_are_json(fake_env):
    env = fake_env()
    p = run_cli("rollback", "--python", env.python, "--json")
    assert p.returncode == 1 and "Traceback" not in p.stderr
    out = json.loads(p.stdout)
    assert "no g906 backup" in out["error"] and out["hint"]


def test_usage_errors():
    p = run_cli("probe", "--backend", "mpi")
    assert_clean_error(p, "unknown probe backend")
    p = run_cli("install", "x.so", "--probe-backend", "mpi")
    assert_clean_error(p, "unknown probe backend")
    p = run_cli("install")
    assert p.returncode == 2 and "Traceback" not in p.stderr


def test_registered_in_the_root_app():
    from g906.cli.app import COMMAND_MODULES

    assert "g906.cli.rccl" in COMMAND_MODULES
    p = subprocess.run([sys.executable, "-m", "g906", "rccl", "--help"], capture_output=True, text=True)
    assert p.returncode == 0 and "rollback" in p.stdout and "probe" in p.stdout


def test_relative_python_path(fake_env, gfx906_lib):
    env = fake_env()
    rel = os.path.relpath(env.python, env.root.parent)
    p = subprocess.run([sys.executable, "-m", "g906.cli.rccl", "status", "--python", rel, "--json"],
                       capture_output=True, text=True, cwd=env.root.parent)
    assert p.returncode == 0, p.stderr
    assert json.loads(p.stdout)["python"] == str(env.python)


def test_no_torch_import_in_the_g906_process():
    code = ("import sys, g906.rccl, g906.cli.rccl, g906.rccl.transaction, g906.rccl.integration; "
            "assert 'torch' not in sys.modules, 'torch imported'")
    p = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True)
    assert p.returncode == 0, p.stderr


def test_probe_with_missing_python(tmp_path):
    assert_clean_error(run_cli("probe", "--python", tmp_path / "nope", "--backend", "gloo"), "cannot start")
