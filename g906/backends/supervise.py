"""Run an external OpenAI-compatible server (vLLM) and watch it until it exits.

serve() starts the command in its own process group, copies every log line to the terminal with a
prefix and to a log file, reports start-up phases read from the log (loading weights, profiling
memory, compiling), declares it ready when GET /v1/models (or /health) answers 200, forwards
SIGINT/SIGTERM to the whole group (a second Ctrl-C, or a group still alive after the grace period,
gets SIGKILL), and returns the server's exit status. A server that dies or hangs during start-up
is an error that carries the last log lines."""

from __future__ import annotations

import collections
import errno
import http.client
import os
import queue
import re
import signal
import socket
import subprocess
import sys
import threading
import time
from pathlib import Path
from typing import IO, Callable, Union

from g906.backends.errors import (
    MissingSecretError,
    PortInUseError,
    VllmError,
    VllmNotFoundError,
    VllmStartupError,
    VllmStartupTimeout,
)

STARTING = "starting"
LOADING = "loading weights"
PROFILING = "profiling memory"
COMPILING = "compiling"
READY = "ready"
PHASES = (STARTING, LOADING, PROFILING, COMPILING, READY)

# First match wins. Matched against one log line (vLLM's, and the forks' which log alike).
_PHASE_PATTERNS: list[tuple[str, re.Pattern[str]]] = [
    (LOADING, re.compile(
        r"starting to load model|loading (model )?weights|loading safetensors|loading gguf|"
        r"loading pt checkpoint|load(ing)? (the )?model (weights|from)|model loading took|"
        r"checkpoint shards", re.I)),
    (COMPILING, re.compile(
        r"torch\.compile|dynamo|compiling|compiled graph|capturing (cuda|hip)?\s*graphs?|cudagraph|"
        r"cuda graph|hip graph|graph capturing", re.I)),
    (PROFILING, re.compile(
        r"memory profiling|profile run|profiling|available kv cache memory|kv cache size|"
        r"# (gpu|cuda) blocks|maximum concurrency", re.I)),
]
# Configuration dumps mention every feature at once; they say nothing about progress.
_IGNORE_RE = re.compile(r"non-default args|with config:|engine_args|EngineArgs\(", re.I)

Echo = Union[IO[str], Callable[[str], None], None]
STDERR = "stderr"   # serve(echo=...) default: whatever sys.stderr is when serve() runs
OnPhase = Callable[[str, str], None]


def phase_of_line(line: str) -> str | None:
    """The start-up phase a vLLM log line announces, or None."""
    if len(line) > 400 or _IGNORE_RE.search(line):
        return None
    for phase, pat in _PHASE_PATTERNS:
        if pat.search(line):
            return phase
    return None


def _connect_host(host: str) -> str:
    if host in ("", "0.0.0.0"):
        return "127.0.0.1"
    if host in ("::", "[::]"):
        return "::1"
    return host.strip("[]")


def check_port_free(host: str, port: int) -> None:
    """Raise PortInUseError when something already listens on host:port (or would block a bind)."""
    target = _connect_host(host)
    try:
        with socket.create_connection((target, port), timeout=0.5):
            pass
    except OSError:
        pass
    else:
        raise PortInUseError(
            f"port {port} on {host} is already in use: another server answers there",
            f"stop that server (e.g. `ss -ltnp 'sport = :{port}'` shows which), or set server.port in the recipe",
        )
    bind_host = host.strip("[]") or "0.0.0.0"
    family = socket.AF_INET6 if ":" in bind_host else socket.AF_INET
    try:
        infos = socket.getaddrinfo(bind_host, port, family if ":" in bind_host else 0, socket.SOCK_STREAM)
    except socket.gaierror as exc:
        raise VllmError(f"cannot resolve server.host {host!r}: {exc}",
                        "use an address of this machine, e.g. 127.0.0.1 or 0.0.0.0") from exc
    fam, _, _, _, addr = infos[0]
    s = socket.socket(fam, socket.SOCK_STREAM)
    try:
        s.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)   # as uvicorn does
        s.bind(addr)
    except OSError as exc:
        if exc.errno == errno.EADDRINUSE:
            raise PortInUseError(
                f"port {port} on {host} is already in use",
                "stop whatever holds it, or set server.port in the recipe",
            ) from exc
        if exc.errno == errno.EADDRNOTAVAIL:
            raise VllmError(f"server.host {host!r} is not an address of this machine",
                            "use 127.0.0.1 (this machine only) or 0.0.0.0 (every interface)") from exc
        if exc.errno == errno.EACCES:
            raise VllmError(f"not allowed to listen on port {port}",
                            "ports below 1024 need privileges; pick a port such as 8000") from exc
        raise VllmError(f"cannot listen on {host}:{port}: {exc.strerror or exc}") from exc
    finally:
        s.close()


def probe_ready(host: str, port: int, api_key: str | None = None, timeout: float = 1.0) -> bool:
    """True when GET /v1/models (with the key) or GET /health answers 200."""
    target = _connect_host(host)
    for path, with_key in (("/v1/models", True), ("/health", False)):
        conn = http.client.HTTPConnection(target, port, timeout=timeout)
        try:
            headers = {"Authorization": f"Bearer {api_key}"} if (api_key and with_key) else {}
            conn.request("GET", path, headers=headers)
            resp = conn.getresponse()
            resp.read()
            if resp.status == 200:
                return True
        except (OSError, http.client.HTTPException):
            return False        # nothing listens yet (or it hung up): not ready
        finally:
            conn.close()
    return False


def _killpg(pgid: int, sig: int) -> bool:
    try:
        os.killpg(pgid, sig)
        return True
    except (ProcessLookupError, PermissionError):
        return False


def _group_alive(pgid: int) -> bool:
    """Whether a live (non-zombie) process remains in the group. Zombies whose parent is gone
    wait for init to reap them (never, in some containers); they hold nothing, so they count as ended."""
    if not _killpg(pgid, 0):
        return False
    try:
        entries = os.listdir("/proc")
    except OSError:
        return True
    for name in entries:
        if not name.isdigit():
            continue
        try:
            with open(f"/proc/{name}/stat", "rb") as fh:
                fields = fh.read().rsplit(b")", 1)[1].split()
        except (OSError, IndexError):
            continue
        # after the command name: state, ppid, pgrp, ...
        if len(fields) > 2 and int(fields[2]) == pgid and fields[0] != b"Z":
            return True
    return False


def _normalise_rc(rc: int) -> int:
    return 128 - rc if rc < 0 else rc


class _Echo:
    def __init__(self, echo: Echo, prefix: str):
        self.echo = echo
        self.prefix = prefix
        self.lock = threading.Lock()

    def __call__(self, line: str) -> None:
        if self.echo is None:
            return
        text = f"{self.prefix}{line}"
        with self.lock:
            try:
                if callable(self.echo) and not hasattr(self.echo, "write"):
                    self.echo(text)
                else:
                    self.echo.write(text + "\n")
                    self.echo.flush()
            except (OSError, ValueError):
                pass   # a closed terminal must not kill the supervisor


def serve(cmd, *, log_file: str | os.PathLike | None = None, ready_timeout_s: float | None = None,
          on_phase: OnPhase | None = None, echo: Echo | str = STDERR, prefix: str = "vllm | ",
          poll_interval_s: float = 0.2, kill_grace_s: float = 20.0, tail_lines: int = 30,
          forward_signals: bool = True, check_port: bool = True) -> int:
    """Run cmd (a VllmCommand) until it exits; returns its exit status (signal N -> 128+N).

    on_phase(phase, log_line) is called from this thread with "starting", "loading weights",
    "profiling memory", "compiling" and "ready". Raises PortInUseError before starting,
    VllmStartupError when the server exits before it is ready (details: its last log lines;
    exit_code: its status), VllmStartupTimeout when it is not ready within ready_timeout_s
    (default: the recipe's engine.vllm.startup_timeout_s; the process group is stopped).
    A command built for a vLLM a dry run only assumed raises VllmNotFoundError."""
    if getattr(cmd, "assumed", None):
        raise VllmNotFoundError(f"no vLLM to start: this command was built for vLLM {cmd.version}, which a dry "
                                f"run assumed because none was found",
                                "install vLLM, activate its environment, or set engine.vllm.executable / "
                                "engine.vllm.python")
    if cmd.missing_secrets:
        names = ", ".join(f"${n}" for n in cmd.missing_secrets)
        raise MissingSecretError(f"{names} is not set, so vLLM would start without its API key",
                                 f"export {cmd.missing_secrets[0]}=<your key> first")
    timeout = float(cmd.startup_timeout_s if ready_timeout_s is None else ready_timeout_s)
    if check_port:
        check_port_free(cmd.host, cmd.port)

    say = _Echo(sys.stderr if echo == STDERR else echo, prefix)
    tail: collections.deque[str] = collections.deque(maxlen=tail_lines)
    phases: queue.Queue[tuple[str, str]] = queue.Queue()
    log_fh = None
    if log_file is not None:
        path = Path(log_file)
        try:
            path.parent.mkdir(parents=True, exist_ok=True)
            log_fh = open(path, "ab")
        except OSError as exc:
            raise VllmError(f"cannot write the log file {path}: {exc.strerror or exc}",
                            "choose a writable log path") from exc
        stamp = time.strftime("%Y-%m-%d %H:%M:%S")
        shown = " ".join(getattr(cmd, "redacted_argv", None) or ["vllm", "serve"])
        log_fh.write(f"==== g906 {stamp}: {shown}\n".encode())
        log_fh.flush()

    signals_seen: list[int] = []
    first_signal_at: list[float] = []
    previous: dict[int, object] = {}
    box: dict[str, subprocess.Popen] = {}

    def on_signal(signum, _frame) -> None:
        signals_seen.append(signum)
        if not first_signal_at:
            first_signal_at.append(time.monotonic())
        p = box.get("proc")
        if p is not None and p.poll() is None:
            _killpg(p.pid, signum if len(signals_seen) == 1 else signal.SIGKILL)

    # handlers first: a Ctrl-C that lands while vLLM is being started still reaches it
    if forward_signals and threading.current_thread() is threading.main_thread():
        for s in (signal.SIGINT, signal.SIGTERM):
            previous[s] = signal.signal(s, on_signal)
    try:
        proc = subprocess.Popen(cmd.argv, env=cmd.full_env(), stdin=subprocess.DEVNULL,
                                stdout=subprocess.PIPE, stderr=subprocess.STDOUT, start_new_session=True)
    except OSError as exc:
        for s, h in previous.items():
            signal.signal(s, h)
        if log_fh:
            log_fh.close()
        raise VllmNotFoundError(f"cannot start {cmd.argv[0]}: {exc.strerror or exc}",
                                "check engine.vllm.executable / engine.vllm.python") from exc
    box["proc"] = proc
    pgid = proc.pid   # start_new_session: the child leads its own session and process group
    if signals_seen:
        _killpg(pgid, signals_seen[0])

    def pump() -> None:
        assert proc.stdout is not None
        current = STARTING
        for raw in iter(proc.stdout.readline, b""):
            if log_fh is not None:
                try:
                    log_fh.write(raw)
                    log_fh.flush()
                except (OSError, ValueError):
                    pass
            text = raw.decode("utf-8", "replace").rstrip("\r\n")
            # progress bars redraw with \r: show the latest state only
            text = [p for p in text.split("\r") if p.strip()][-1:] or [""]
            line = text[0]
            tail.append(line)
            say(line)
            ph = phase_of_line(line)
            if ph is not None and ph != current:
                current = ph
                phases.put((ph, line))

    reader = threading.Thread(target=pump, name="vllm-log", daemon=True)

    def emit(phase: str, line: str) -> None:
        if on_phase is not None:
            on_phase(phase, line)

    started = time.monotonic()
    deadline = started + timeout
    ready = False
    phase = STARTING
    timed_out = False
    try:
        reader.start()
        emit(STARTING, " ".join(getattr(cmd, "redacted_argv", None) or []))
        while True:
            while not phases.empty():
                ph, line = phases.get_nowait()
                if not ready:
                    phase = ph
                    emit(ph, line)
            if proc.poll() is not None:
                break
            now = time.monotonic()
            if first_signal_at and now - first_signal_at[0] > kill_grace_s:
                _killpg(pgid, signal.SIGKILL)
            if not ready and not signals_seen:
                if probe_ready(cmd.host, cmd.port, getattr(cmd, "api_key", None)):
                    ready = True
                    phase = READY
                    emit(READY, f"http://{cmd.host}:{cmd.port}/v1")
                elif now > deadline:
                    timed_out = True
                    _killpg(pgid, signal.SIGTERM)
                    try:
                        proc.wait(timeout=min(kill_grace_s, 10.0))
                    except subprocess.TimeoutExpired:
                        _killpg(pgid, signal.SIGKILL)
                        proc.wait()
                    break
            time.sleep(poll_interval_s)
    finally:
        if proc.poll() is None:           # an exception in here: never leave vLLM behind
            _killpg(pgid, signal.SIGKILL)
            proc.wait()
        # workers left in the group (engine cores, TP ranks) would keep GPU memory: end them too
        if _group_alive(pgid):
            _killpg(pgid, signal.SIGTERM)
            end = time.monotonic() + 3.0
            while _group_alive(pgid) and time.monotonic() < end:
                time.sleep(0.05)
            _killpg(pgid, signal.SIGKILL)
        if reader.is_alive():
            reader.join(timeout=5.0)
        for s, h in previous.items():
            signal.signal(s, h)
        if log_fh is not None:
            try:
                log_fh.write(f"==== g906: vLLM exited with status {_normalise_rc(proc.returncode)}\n".encode())
            except (OSError, ValueError, TypeError):
                pass
            log_fh.close()

    rc = proc.returncode
    while not phases.empty():            # lines read after the last look: name the phase it died in
        ph, _line = phases.get_nowait()
        if not ready:
            phase = ph
    where = f"; full log: {log_file}" if log_file is not None else ""
    if timed_out:
        raise VllmStartupTimeout(
            f"vLLM was not ready after {timeout:g} s (last phase: {phase}); it was stopped",
            f"if it was still {phase}, raise engine.vllm.startup_timeout_s; otherwise read its log{where}",
            details=[f"{prefix}{l}" for l in tail],
        )
    if not ready and not signals_seen:
        raise VllmStartupError(
            f"vLLM exited with status {_normalise_rc(rc)} during start-up (phase: {phase})",
            f"its last log lines are shown above{where}",
            details=[f"{prefix}{l}" for l in tail],
            returncode=rc,
        )
    return _normalise_rc(rc)


class PhaseSpinner:
    """A ready-made on_phase/echo pair for serve(): a rich spinner that names the start-up phase,
    with vLLM's log lines printed above it; it stops and says where the API is once ready.

        with PhaseSpinner(console) as ui:
            rc = serve(cmd, log_file=..., on_phase=ui.on_phase, echo=ui.echo)
    """

    def __init__(self, console=None, *, label: str = "vLLM"):
        if console is None:
            from rich.console import Console

            console = Console(stderr=True, highlight=False)
        self.console = console
        self.label = label
        self.status = None
        self.phases: list[str] = []
        self.started = time.monotonic()

    def __enter__(self) -> "PhaseSpinner":
        self.started = time.monotonic()
        self.status = self.console.status(f"{self.label}: {STARTING}…")
        self.status.start()
        return self

    def __exit__(self, *exc) -> None:
        self._stop()

    def _stop(self) -> None:
        if self.status is not None:
            self.status.stop()
            self.status = None

    def on_phase(self, phase: str, line: str) -> None:
        self.phases.append(phase)
        if phase == READY:
            self._stop()
            took = time.monotonic() - self.started
            self.console.print(f"{self.label} is ready after {took:.0f} s: {line}", markup=False, highlight=False)
        elif self.status is not None:
            self.status.update(f"{self.label}: {phase}…")

    def echo(self, text: str) -> None:
        self.console.print(text, markup=False, highlight=False, soft_wrap=True)
