"""Failures of a TP=2 engine (gloo): a worker that crashes, raises or hangs (collective timeout)
ends the engine with a clear error within seconds and leaves no process behind; a rank 0 killed
outright takes its workers with it. (One TP engine per process
at a time: these tests each start their own, so they live apart from test_tp_engine.py's.)"""

from __future__ import annotations

import signal
import subprocess
import sys
import textwrap
import time

import pytest

from g906.engine.llm_engine import LLMEngine
from g906.engine.sampling_params import SamplingParams
from g906.errors import G906Error
from tests.parallel.test_tp_engine import GREEDY, SOURCE, engine_config


@pytest.mark.parametrize("kind, expect", [
    ("exit", "worker rank 1 (pid {pid}) exited with status 3 during forward"),
    ("raise", "RuntimeError: G906_TP_FAULT: injected failure"),
    ("hang", "did not complete within 2 s (G906_TP_TIMEOUT)"),
])
def test_worker_failure_ends_the_engine_quickly(kind, expect, monkeypatch):
    from g906.engine.parallel import load_model_tp

    monkeypatch.setenv("G906_TP_FAULT", f"rank=1,step=3,kind={kind}")
    monkeypatch.setenv("G906_TP_TIMEOUT", "2")
    loaded = load_model_tp(SOURCE, tensor_parallel_size=2, device="cpu", progress=False)
    group = loaded.model.group
    (worker,) = group.workers
    engine = LLMEngine(loaded, engine_config())
    engine.add_request("x", list(range(1, 40)), SamplingParams(max_tokens=20, **GREEDY))
    t0 = time.monotonic()
    with pytest.raises(G906Error) as e:
        while engine.has_unfinished_requests():
            engine.step()
    assert time.monotonic() - t0 < 8.0
    assert expect.format(pid=worker.proc.pid) in e.value.message
    assert worker.proc.poll() is not None                  # no orphan: the worker is gone
    assert group.closed
    with pytest.raises(G906Error):                         # the engine stays failed
        engine.add_request("y", [1, 2], SamplingParams(max_tokens=2, **GREEDY))
        engine.step()


def test_workers_exit_when_rank0_is_killed(tmp_path):
    script = textwrap.dedent(f"""
        import os, sys, time, torch
        torch.set_num_threads(1)
        from g906.engine.parallel import load_model_tp
        loaded = load_model_tp({SOURCE!r}, tensor_parallel_size=2, device="cpu", progress=False)
        print(loaded.model.group.workers[0].proc.pid, flush=True)
        time.sleep(600)
    """)
    proc = subprocess.Popen([sys.executable, "-c", script], stdout=subprocess.PIPE, text=True)
    try:
        pid = int(proc.stdout.readline())
        proc.send_signal(signal.SIGKILL)               # rank 0 dies without any cleanup
        proc.wait(10)
        deadline = time.monotonic() + 10
        while time.monotonic() < deadline and _alive(pid):
            time.sleep(0.05)
        assert not _alive(pid), "the worker outlived rank 0"
    finally:
        if proc.poll() is None:
            proc.kill()


def _alive(pid: int) -> bool:
    try:
        with open(f"/proc/{pid}/stat") as f:
            return f.read().split(") ")[1][0] != "Z"
    except FileNotFoundError:
        return False
