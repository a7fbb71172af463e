"""One real `g906 up` per test session: a subprocess serving builtin:tiny-qwen35 on an ephemeral
loopback port, with an API key, the qwen3 reasoning parser, a short context and a 1 MiB body
limit, so that every error path can be reached."""

from __future__ import annotations

import os
import queue
import re
import signal
import subprocess
import sys
import threading
import time
from dataclasses import dataclass
from pathlib import Path

import httpx
import pytest

API_KEY = "test-key-123"
MAX_MODEL_LEN = 512
MAX_BODY = 1024 * 1024

MAIN_RECIPE = f"""
[model]
source = "builtin:tiny-qwen35"
name = "tiny"

[limits]
max_model_len = {MAX_MODEL_LEN}
max_num_seqs = 16
max_num_batched_tokens = 256

[engine]
reasoning_parser = "qwen3"

[engine.embedded]
max_waiting_requests = 256

[server]
api_key_env = "G906_TEST_API_KEY"
"""


@dataclass
class Served:
    url: str
    proc: subprocess.Popen
    lines: list[str]
    stderr_path: Path

    @property
    def v1(self) -> str:
        return self.url + "/v1"

    def metrics(self) -> dict[str, float]:
        text = httpx.get(self.url + "/metrics", timeout=10).text
        out = {}
        for line in text.splitlines():
            if line.startswith("#") or not line.strip():
                continue
            name, _, value = line.rpartition(" ")
            out[re.sub(r"\{.*\}", "", name)] = float(value)
        return out

    def idle_metrics(self, timeout: float = 10.0) -> dict[str, float]:
        """The metrics once no request runs or waits (or as they are after `timeout` seconds):
        what a test reads after its requests ended or were dropped."""
        deadline = time.monotonic() + timeout
        while True:
            m = self.metrics()
            if (m["g906:num_requests_running"] == 0 and m["g906:num_requests_waiting"] == 0) \
                    or time.monotonic() > deadline:
                return m
            time.sleep(0.02)


def server_env() -> dict[str, str]:
    env = dict(os.environ)
    env.update({
        "G906_TEST_API_KEY": API_KEY,
        "G906_MAX_REQUEST_BYTES": str(MAX_BODY),
        "OMP_NUM_THREADS": "1",           # one torch thread: much faster on a shared 2-core box
        "PYTHONUNBUFFERED": "1",
    })
    return env


def start_server(tmp: Path, recipe_text: str, *, timeout: float = 180.0, ready: bool = True,
                 drain_timeout: float | None = None) -> Served:
    recipe = tmp / "recipe.toml"
    recipe.write_text(recipe_text)
    drain = [] if drain_timeout is None else ["--drain-timeout", str(drain_timeout)]
    return launch_up(tmp, [str(recipe), *drain], server_env(), timeout=timeout,
                     want="Ready:" if ready else "Listening on")


def launch_up(tmp: Path, args: list[str], env: dict[str, str], *, timeout: float, want: str = "Ready:") -> Served:
    """`g906 up ARGS --port 0 --skip-doctor` in a subprocess, returned once a stdout line holds
    `want` (stdout lines kept; stderr to tmp/stderr.txt)."""
    err = tmp / "stderr.txt"
    proc = subprocess.Popen(
        [sys.executable, "-m", "g906", "up", *args, "--port", "0", "--skip-doctor"],
        stdout=subprocess.PIPE, stderr=open(err, "w"), text=True, env=env, cwd=tmp,
    )
    lines: list[str] = []
    q: queue.Queue = queue.Queue()

    def reader():
        for line in proc.stdout:
            lines.append(line)
            q.put(line)
        q.put(None)

    threading.Thread(target=reader, daemon=True).start()
    url = None
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        try:
            line = q.get(timeout=1)
        except queue.Empty:
            continue
        if line is None:
            break
        m = re.search(r"http://127\.0\.0\.1:(\d+)", line)
        if m and url is None:
            url = m.group(0)
        if want in line:
            return Served(url, proc, lines, err)
    proc.kill()
    raise RuntimeError(f"g906 up did not become ready:\n{''.join(lines)}\n{err.read_text()}")


def stop_server(s: Served, sig=signal.SIGINT, timeout: float = 60.0) -> int:
    if s.proc.poll() is None:
        s.proc.send_signal(sig)
        try:
            s.proc.wait(timeout)
        except subprocess.TimeoutExpired:
            s.proc.kill()
            s.proc.wait()
    return s.proc.returncode


def serving(tmp: Path, recipe_text: str):
    """For a fixture (`yield from serving(...)`): the started server, then a clean exit (0)."""
    s = start_server(tmp, recipe_text)
    yield s
    code = stop_server(s)
    assert code == 0, s.stderr_path.read_text()[-3000:]


def openai_client(s: Served):
    openai = pytest.importorskip("openai")
    return openai.OpenAI(base_url=s.v1, api_key=API_KEY, max_retries=0, timeout=120)


@pytest.fixture(scope="session")
def server(tmp_path_factory):
    yield from serving(tmp_path_factory.mktemp("g906-up"), MAIN_RECIPE)


@pytest.fixture(scope="session")
def client(server):
    return openai_client(server)


@pytest.fixture(scope="session")
def aclient(server):
    openai = pytest.importorskip("openai")
    return openai.AsyncOpenAI(base_url=server.v1, api_key=API_KEY, max_retries=0, timeout=180)
