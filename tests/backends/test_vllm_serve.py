"""Supervising a (fake) vLLM: readiness and phases, crash and hang during start-up, signal
forwarding, exit-status propagation, a taken port, and cleanup of the whole process group."""

import json
import os
import signal
import socket
import sys
import time
import urllib.request

import pytest

from g906.backends.errors import (
    MissingSecretError,
    PortInUseError,
    VllmStartupError,
    VllmStartupTimeout,
)
from g906.backends.supervise import check_port_free, phase_of_line, probe_ready
from g906.backends.vllm import build_vllm_command, detect_vllm, serve

from .planfactory import make_plan

FAST = dict(poll_interval_s=0.05, kill_grace_s=5.0)


def _alive(pid: int) -> bool:
    try:
        with open(f"/proc/{pid}/stat") as fh:
            return fh.read().rsplit(")", 1)[1].split()[0] != "Z"
    except OSError:
        return False


def _wait_dead(pid: int, timeout: float = 5.0) -> bool:
    end = time.monotonic() + timeout
    while time.monotonic() < end:
        if not _alive(pid):
            return True
        time.sleep(0.05)
    return False


@pytest.fixture
def command(vllm, free_port):
    def make(**sections):
        sections.setdefault("server", {}).setdefault("port", free_port)
        return build_vllm_command(make_plan(**sections), vllm)
    return make


class Recorder:
    def __init__(self, then=None):
        self.phases, self.lines, self.then = [], [], then

    def on_phase(self, phase, line):
        self.phases.append(phase)
        if phase == "ready" and self.then:
            self.then()

    def echo(self, line):
        self.lines.append(line)


def test_ready_then_sigterm_is_forwarded_and_status_propagated(fake_vllm, command, tmp_path):
    fake_vllm.set(signal_exit=0, worker=1)
    cmd = command()
    seen = {}

    def when_ready():
        with urllib.request.urlopen(f"http://127.0.0.1:{cmd.port}/v1/models", timeout=2) as r:
            seen["models"] = json.load(r)
        os.kill(os.getpid(), signal.SIGTERM)          # as if systemd stopped `g906 up`

    rec = Recorder(when_ready)
    log = tmp_path / "logs" / "vllm.log"
    rc = serve(cmd, log_file=log, ready_timeout_s=20, on_phase=rec.on_phase, echo=rec.echo, **FAST)
    assert rc == 0
    assert fake_vllm.signals() == ["SIGTERM"]
    assert seen["models"]["data"][0]["id"] == "Qwen3.5-0.8B"
    assert rec.phases[0] == "starting" and rec.phases[-1] == "ready"
    assert rec.phases.index("loading weights") < rec.phases.index("compiling") < rec.phases.index("ready")
    assert "profiling memory" in rec.phases
    assert any(l == "vllm | INFO fake-vllm: Loading weights took 0.01 seconds" for l in rec.lines)
    text = log.read_text()
    assert text.startswith("==== g906 ") and "Application startup complete." in text
    assert _wait_dead(fake_vllm.recorded()["worker_pid"])
    assert signal.getsignal(signal.SIGTERM) is signal.SIG_DFL or callable(signal.getsignal(signal.SIGTERM))


def test_sigint_is_forwarded_and_its_status_returned(fake_vllm, command):
    fake_vllm.set(signal_exit=130)
    prev = signal.getsignal(signal.SIGINT)
    rec = Recorder(lambda: os.kill(os.getpid(), signal.SIGINT))
    rc = serve(command(), ready_timeout_s=20, on_phase=rec.on_phase, echo=None, **FAST)
    assert rc == 130
    assert fake_vllm.signals() == ["SIGINT"]
    assert signal.getsignal(signal.SIGINT) is prev     # our handler is gone again


def test_signal_ignored_escalates_to_sigkill(fake_vllm, command):
    fake_vllm.set(ignore_signals=1)
    rec = Recorder(lambda: os.kill(os.getpid(), signal.SIGTERM))
    t0 = time.monotonic()
    rc = serve(command(), ready_timeout_s=20, on_phase=rec.on_phase, echo=None, poll_interval_s=0.05,
               kill_grace_s=0.5)
    assert rc == 128 + signal.SIGKILL
    assert fake_vllm.signals() == ["SIGTERM"]
    assert time.monotonic() - t0 < 10


def test_exit_after_ready_propagates_status(fake_vllm, command):
    fake_vllm.set(mode="exit", exit_code=3, exit_after=0.3)
    rec = Recorder()
    rc = serve(command(), ready_timeout_s=20, on_phase=rec.on_phase, echo=rec.echo, **FAST)
    assert rc == 3
    assert rec.phases[-1] == "ready"
    assert rec.lines[-1] == "vllm | ERROR fake-vllm: engine died"


def test_crash_during_startup_reports_last_lines(fake_vllm, command, tmp_path):
    fake_vllm.set(mode="crash", exit_code=7, worker=1)
    rec = Recorder()
    with pytest.raises(VllmStartupError) as ei:
        serve(command(), log_file=tmp_path / "v.log", ready_timeout_s=20, on_phase=rec.on_phase,
              echo=rec.echo, **FAST)
    err = ei.value
    assert err.returncode == 7 and err.exit_code == 7
    assert "exited with status 7 during start-up (phase: loading weights)" in err.message
    assert err.details[-2:] == ["vllm | ERROR fake-vllm: RuntimeError: HIP error: invalid device function",
                                "vllm | ERROR fake-vllm: Engine core initialization failed."]
    assert str(tmp_path / "v.log") in err.hint
    assert "ready" not in rec.phases
    assert _wait_dead(fake_vllm.recorded()["worker_pid"])   # orphaned worker of the group is ended
    assert (tmp_path / "v.log").read_text().splitlines()[-1] == "==== g906: vLLM exited with status 7"


def test_log_goes_to_stderr_by_default(fake_vllm, command, capfd):
    fake_vllm.set(mode="crash", delay=0)
    with pytest.raises(VllmStartupError):
        serve(command(), ready_timeout_s=20, **FAST)
    err = capfd.readouterr().err
    assert "vllm | ERROR fake-vllm: Engine core initialization failed." in err


def test_hang_until_timeout_stops_the_group(fake_vllm, command):
    fake_vllm.set(mode="hang", worker=1, delay=0)
    rec = Recorder()
    t0 = time.monotonic()
    with pytest.raises(VllmStartupTimeout) as ei:
        serve(command(), ready_timeout_s=2.0, on_phase=rec.on_phase, echo=None, **FAST)
    assert 2.0 <= time.monotonic() - t0 < 15
    err = ei.value
    assert f"not ready after 2 s (last phase: {rec.phases[-1]})" in err.message
    assert rec.phases[-1] == "profiling memory"          # the fake hangs after its KV cache line
    assert "startup_timeout_s" in err.hint
    assert any("Available KV cache memory" in d for d in err.details)
    rec = fake_vllm.recorded()
    assert _wait_dead(rec["pid"]) and _wait_dead(rec["worker_pid"])
    assert fake_vllm.signals() == ["SIGTERM"]


def test_port_taken_refuses_to_start(fake_vllm, command, free_port):
    s = socket.socket()
    s.bind(("127.0.0.1", free_port))
    s.listen(1)
    try:
        with pytest.raises(PortInUseError, match=f"port {free_port} on 127.0.0.1 is already in use"):
            serve(command(), ready_timeout_s=5, echo=None, **FAST)
    finally:
        s.close()
    assert "serve" not in fake_vllm.call_log()


def test_port_bound_but_not_listening_also_refuses(free_port):
    s = socket.socket()
    s.bind(("0.0.0.0", free_port))
    try:
        with pytest.raises(PortInUseError):
            check_port_free("127.0.0.1", free_port)
    finally:
        s.close()
    check_port_free("127.0.0.1", free_port)


def test_api_key_guards_models_and_readiness_uses_it(fake_vllm, command, monkeypatch):
    monkeypatch.setenv("G906_TEST_KEY", "sk-1")
    cmd = command(server={"api_key_env": "G906_TEST_KEY"})
    got = {}

    def when_ready():
        got["with"] = probe_ready("127.0.0.1", cmd.port, "sk-1")
        req = urllib.request.Request(f"http://127.0.0.1:{cmd.port}/v1/models")
        try:
            urllib.request.urlopen(req, timeout=2)
        except urllib.error.HTTPError as exc:
            got["without"] = exc.code
        os.kill(os.getpid(), signal.SIGTERM)

    rec = Recorder(when_ready)
    assert serve(cmd, ready_timeout_s=20, on_phase=rec.on_phase, echo=None, **FAST) == 0
    assert got == {"with": True, "without": 401}
    assert fake_vllm.recorded()["argv"][-2:] == ["--api-key", "sk-1"]


def test_environment_reaches_vllm(fake_vllm, command, monkeypatch):
    monkeypatch.setenv("CUDA_VISIBLE_DEVICES", "5")
    fake_vllm.set(mode="crash", delay=0)
    cmd = command(parallel={"tensor_parallel_size": 2, "devices": [0, 1]},
                  env={"ROCBLAS_TENSILE_LIBPATH": "/opt/t"}, engine={"kind": "vllm", "vllm": {"use_modelscope": True}})
    with pytest.raises(VllmStartupError):
        serve(cmd, ready_timeout_s=20, echo=None, **FAST)
    env = fake_vllm.recorded()["env"]
    assert env["HIP_VISIBLE_DEVICES"] == "0,1" and "CUDA_VISIBLE_DEVICES" not in env
    assert env["ROCBLAS_TENSILE_LIBPATH"] == "/opt/t" and env["VLLM_USE_MODELSCOPE"] == "true"
    assert env["PATH"] == os.environ["PATH"]           # the rest is inherited


def test_missing_secret_refuses_to_start(fake_vllm, vllm):
    plan = make_plan(server={"api_key_env": "G906_UNSET_KEY"})
    cmd = build_vllm_command(plan, vllm, environ={}, allow_missing_secret=True)
    with pytest.raises(MissingSecretError):
        serve(cmd, ready_timeout_s=5, echo=None, **FAST)
    assert "serve" not in fake_vllm.call_log()


def test_python_interpreter_mode_serves(fake_vllm, free_port, monkeypatch):
    fake_vllm.python_package()
    monkeypatch.setenv("PATH", "/usr/bin:/bin")
    inst = detect_vllm(python=sys.executable)
    cmd = build_vllm_command(make_plan(server={"port": free_port}), inst)
    rec = Recorder(lambda: os.kill(os.getpid(), signal.SIGTERM))
    assert serve(cmd, ready_timeout_s=20, on_phase=rec.on_phase, echo=None, **FAST) == 0
    assert rec.phases[-1] == "ready"


@pytest.mark.parametrize("line,phase", [
    ("INFO 11-30 [gpu_model_runner.py:1] Starting to load model /m/Qwen3.5-27B.gguf...", "loading weights"),
    ("Loading safetensors checkpoint shards:  50% Completed | 1/2", "loading weights"),
    ("INFO [default_loader.py:1] Loading weights took 12.01 seconds", "loading weights"),
    ("INFO [backends.py:1] Compiling a graph for dynamic shape takes 20.1 s", "compiling"),
    ("INFO [monitor.py:1] torch.compile takes 25.3 s in total", "compiling"),
    ("Capturing CUDA graphs (mixed prefill-decode, PIECEWISE): 100%", "compiling"),
    ("INFO [gpu_worker.py:1] Available KV cache memory: 3.55 GiB", "profiling memory"),
    ("INFO [kv_cache_utils.py:1] GPU KV cache size: 46,000 tokens", "profiling memory"),
    ("INFO [utils.py:1] non-default args: {'compilation_config': {'level': 3}, 'model': 'x'}", None),
    ("INFO:     Started server process [1234]", None),
])
def test_phase_of_log_lines(line, phase):
    assert phase_of_line(line) == phase


def test_phase_spinner_with_serve(fake_vllm, command):
    import io

    from rich.console import Console

    from g906.backends.supervise import PhaseSpinner

    out = io.StringIO()
    console = Console(file=out, force_terminal=False, width=200)
    with PhaseSpinner(console) as ui:
        def on_phase(phase, line):
            ui.on_phase(phase, line)
            if phase == "ready":
                os.kill(os.getpid(), signal.SIGTERM)
        assert serve(command(), ready_timeout_s=20, on_phase=on_phase, echo=ui.echo, **FAST) == 0
    text = out.getvalue()
    assert "vllm | INFO fake-vllm: Loading weights took 0.01 seconds" in text
    assert "vLLM is ready after" in text and "http://127.0.0.1:" in text
    assert ui.phases[0] == "starting" and ui.phases[-1] == "ready"
