"""`g906 up` as a command: dry run, and failures that must be messages, not tracebacks."""

from __future__ import annotations

import json
import os
import socket
import subprocess
import sys


def g906(*args, cwd=None, env=None, timeout=120):
    return subprocess.run([sys.executable, "-m", "g906", *args], capture_output=True, text=True, cwd=cwd,
                          timeout=timeout, env={**os.environ, "OMP_NUM_THREADS": "1", **(env or {})})


def test_dry_run_prints_the_plan(tmp_path):
    r = tmp_path / "r.toml"
    r.write_text('[model]\nsource = "builtin:tiny-qwen35"\n[limits]\nmax_num_seqs = 3\n')
    out = g906("up", str(r), "--dry-run", "--json")
    assert out.returncode == 0, out.stderr
    plan = json.loads(out.stdout)
    assert plan["model"]["format"] == "builtin" and plan["memory"]["max_num_seqs"] == 3
    assert plan["engine"]["kind"] == "embedded" and plan["server"]["host"] == "127.0.0.1"
    text = g906("up", str(r), "--dry-run")
    assert text.returncode == 0 and "memory" in text.stdout and "dry run" in text.stdout


def test_bad_recipe_is_a_located_message(tmp_path):
    r = tmp_path / "r.toml"
    r.write_text('[model]\nsource = "builtin:tiny-qwen35"\n[limits]\nmax_num_seqs = "many"\n')
    out = g906("up", str(r))
    assert out.returncode == 2
    assert "Traceback" not in out.stderr and "max_num_seqs" in out.stderr


def test_busy_port_and_missing_api_key_are_messages(tmp_path):
    s = socket.socket()
    s.bind(("127.0.0.1", 0))
    s.listen(1)
    port = s.getsockname()[1]
    r = tmp_path / "r.toml"
    r.write_text('[model]\nsource = "builtin:tiny-qwen35"\n')
    try:
        out = g906("up", str(r), "--port", str(port))
    finally:
        s.close()
    assert out.returncode == 1 and "cannot listen" in out.stderr and "Traceback" not in out.stderr
    r.write_text('[model]\nsource = "builtin:tiny-qwen35"\n[server]\napi_key_env = "G906_NOT_SET_ANYWHERE"\n')
    out = g906("up", str(r), "--port", "0", env={"G906_NOT_SET_ANYWHERE": ""})
    assert out.returncode == 1 and "G906_NOT_SET_ANYWHERE" in out.stderr
