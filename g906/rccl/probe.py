"""`g906 rccl probe`: N ranks of torch.distributed on this machine, checked collectives.

The ranks run in the target interpreter (probe_worker.py as a plain script), so the probe
tests exactly the torch and librccl that the swap changed. Outcomes:

  ok           every rank passed: prints ALLREDUCE_OK with the versions
  failed       the library is broken or wrong (import error, wrong sums, crash, hang)
  unavailable  the probe cannot run here (too few GPUs, CPU-only torch for nccl, ...):
               this says nothing about the library, so install keeps it and says so
"""

from __future__ import annotations

import json
import os
import socket
import subprocess
import sys
import tempfile
import time
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

from g906.errors import UsageError

WORKER = Path(__file__).with_name("probe_worker.py")
OK, FAILED, UNAVAILABLE = "ok", "failed", "unavailable"

_HINTS = [
    ("undefined symbol", "the new librccl does not match this torch's ROCm (a symbol is missing); use an RCCL built for the same ROCm major version as torch"),
    ("cannot open shared object", "a library the new librccl needs is missing; check `ldd` on it and your ROCm install"),
    ("hipErrorNoBinaryForGpu", "the library has no device code for this GPU; use a gfx906 build of RCCL"),
    ("invalid device function", "the library has no device code for this GPU; use a gfx906 build of RCCL"),
    ("no kernel image", "the library has no device code for this GPU; use a gfx906 build of RCCL"),
    ("unhandled system error", "RCCL could not set up communication; try NCCL_P2P_DISABLE=1 and check NCCL_DEBUG=INFO output"),
    ("unhandled cuda error", "a GPU call failed inside RCCL; run with NCCL_DEBUG=INFO for details"),
]


@dataclass
class ProbeResult:
    status: str                     # ok | failed | unavailable
    backend: str
    world_size: int
    python: str
    summary: str                    # the ALLREDUCE_OK line, or a one-sentence diagnosis
    hint: str | None = None
    versions: dict[str, Any] = field(default_factory=dict)
    sample: list[float] | None = None
    seconds: float = 0.0
    output: str = ""                # every rank's raw output, for people to read

    @property
    def ok(self) -> bool:
        return self.status == OK

    def to_json(self) -> dict[str, Any]:
        return asdict(self)


def _free_port() -> int:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def run_probe(python: str | None = None, *, world_size: int = 2, backend: str = "nccl",
              timeout: float = 180, env: dict[str, str] | None = None,
              sizes: tuple[int, ...] = (1, 4096, 1 << 20)) -> ProbeResult:
    """Run the probe with interpreter *python* (default: this one). Never raises for probe failures."""
    if world_size < 1:
        raise UsageError("--world-size must be at least 1.", hint="use --world-size 2 for two GPUs.")
    if backend not in ("nccl", "gloo"):
        raise UsageError(f"unknown probe backend {backend!r}.", hint="use --backend nccl (RCCL on ROCm) or gloo.")
    py = python or sys.executable
    if os.sep in py:                       # the ranks run in a temporary folder: no relative paths
        py = os.path.abspath(os.path.expanduser(py))
    port = _free_port()
    run_env = dict(os.environ if env is None else env)
    run_env.setdefault("OMP_NUM_THREADS", "1")
    run_env["PYTHONDONTWRITEBYTECODE"] = "1"
    start = time.monotonic()
    procs: list[subprocess.Popen] = []
    logs: list[Path] = []
    with tempfile.TemporaryDirectory(prefix="g906-probe-") as tmp:
        # A private copy: the worker's folder becomes sys.path[0], so it must hold nothing else.
        worker = Path(tmp) / "g906_rccl_probe.py"
        worker.write_bytes(WORKER.read_bytes())
        try:
            for rank in range(world_size):
                log = Path(tmp) / f"rank{rank}.log"
                logs.append(log)
                with open(log, "wb") as fout:
                    procs.append(subprocess.Popen(
                        [py, str(worker), "--rank", str(rank), "--world-size", str(world_size),
                         "--backend", backend, "--init", f"tcp://127.0.0.1:{port}", "--timeout", str(timeout),
                         "--sizes", ",".join(str(s) for s in sizes)],
                        stdout=fout, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL, env=run_env,
                        cwd=tmp))
        except OSError as exc:
            for p in procs:
                p.kill()
                p.wait()
            return ProbeResult(FAILED, backend, world_size, py, f"cannot start {py}: {exc.strerror or exc}.",
                               hint="check the --python path.")
        timed_out = _wait_all(procs, timeout)
        outputs = [log.read_text(errors="replace") for log in logs]
    seconds = round(time.monotonic() - start, 2)
    return _judge(procs, outputs, timed_out, backend, world_size, py, seconds, timeout)


def _wait_all(procs: list[subprocess.Popen], timeout: float) -> bool:
    """Wait for every rank; once one fails, give the rest a short grace period. True on timeout."""
    deadline = time.monotonic() + timeout + 30
    while True:
        codes = [p.poll() for p in procs]
        if all(c is not None for c in codes):
            return False
        if any(c not in (None, 0) for c in codes):
            deadline = min(deadline, time.monotonic() + 10)
        if time.monotonic() > deadline:
            for p in procs:
                if p.poll() is None:
                    p.kill()
            for p in procs:
                p.wait()
            return True
        time.sleep(0.05)


def _events(text: str) -> list[dict[str, Any]]:
    out = []
    for line in text.splitlines():
        if line.startswith("G906PROBE "):
            try:
                out.append(json.loads(line[len("G906PROBE "):]))
            except ValueError:
                pass
    return out


def _hint_for(text: str) -> str | None:
    low = text.lower()
    for needle, hint in _HINTS:
        if needle.lower() in low:
            return hint
    return None


def _judge(procs, outputs, timed_out, backend, world, py, seconds, timeout) -> ProbeResult:
    events = [_events(o) for o in outputs]
    flat = [e for evs in events for e in evs]
    raw = "\n".join(f"--- rank {i} (exit {p.returncode}) ---\n{o.rstrip()}" for i, (p, o) in enumerate(zip(procs, outputs)))
    versions: dict[str, Any] = {}
    for e in flat:
        if e["event"] == "imported":
            versions.update(e.get("versions") or {})
        if e["event"] == "device":
            versions.setdefault("devices", []).append(f"{e.get('name')} ({e.get('arch')})")
    res = ProbeResult(FAILED, backend, world, py, "", versions=versions, seconds=seconds, output=raw)
    kinds = {e["event"] for e in flat}
    all_text = "\n".join(outputs)
    if "import_failed" in kinds:
        err = next(e["error"] for e in flat if e["event"] == "import_failed")
        res.summary = f"import torch failed in the probe: {err}"
        res.hint = _hint_for(err) or "torch cannot load with this library in place"
    elif "unavailable" in kinds:
        why = next(e["reason"] for e in flat if e["event"] == "unavailable")
        res.status = UNAVAILABLE
        res.summary = f"the probe cannot run here: {why}"
        res.hint = "run it where the GPUs are visible, or use --backend gloo to check torch.distributed on the CPU."
    elif "wrong" in kinds:
        e = next(e for e in flat if e["event"] == "wrong")
        res.summary = (f"{e['stage']} returned {e['got']} at index {e['index']} on rank {e['rank']}, "
                       f"expected {e['expected']}")
        res.hint = (_hint_for(all_text) or "the collectives compute wrong results: the library lacks working code "
                    "for these GPUs, or P2P between them is broken (try NCCL_P2P_DISABLE=1)")
    elif "error" in kinds:
        e = next(e for e in flat if e["event"] == "error")
        res.summary = f"{e['stage']} failed on rank {e['rank']}: {e['error'].splitlines()[0] if e['error'] else ''}"
        res.hint = _hint_for(all_text) or "run with NCCL_DEBUG=INFO for details."
    elif timed_out:
        res.summary = f"the probe hung: not every rank finished within {timeout:.0f} s"
        res.hint = _hint_for(all_text) or ("a hang in a collective usually means the GPUs cannot talk (P2P/PCIe "
                                           "atomics); try NCCL_P2P_DISABLE=1, check NCCL_DEBUG=INFO output")
    elif all(p.returncode == 0 for p in procs) and sum(1 for e in flat if e["event"] == "ok") == world:
        res.status = OK
        res.sample = next((e.get("sample") for e in flat if e["event"] == "ok" and e.get("rank") == 0), None)
        ver = " ".join(f"{k}={versions[k]}" for k in ("torch", "hip", "cuda", "nccl") if versions.get(k))
        res.summary = (f"ALLREDUCE_OK world_size={world} backend={backend} {ver} "
                       f"all_reduce={res.sample} (fp32/fp16, sizes 1/4096/1M, all_gather ok)").replace("  ", " ")
    else:
        codes = ", ".join(f"rank {i}: {_exit_text(p.returncode)}" for i, p in enumerate(procs))
        res.summary = f"the probe ranks crashed ({codes})"
        res.hint = _hint_for(all_text) or "read the ranks' output below; NCCL_DEBUG=INFO gives more."
    return res


def _exit_text(code: int | None) -> str:
    if code is None:
        return "still running"
    if code < 0:
        import signal

        try:
            return f"killed by {signal.Signals(-code).name}"
        except ValueError:
            return f"signal {-code}"
    return f"exit {code}"
