"""Rank 0 of a tensor-parallel engine: start the workers, load rank 0's share, and give the
runner a model (TPModel) with the interface of Qwen35ForCausalLM whose every call is mirrored
on the workers through the control channel.

    loaded = load_model_tp("model.gguf", tensor_parallel_size=2)   # a LoadedModel
    LLMEngine(loaded, ...)          # the runner drives loaded.model as usual
    loaded.model.close()            # also when the model is collected, and at interpreter exit

Failure handling (no orphans, no hangs):
- each worker's stdin is a pipe from rank 0: a worker exits when rank 0 closes it or dies;
- a thread per worker reads its status pipe and waits for its exit: a worker that dies while
  the engine runs marks the group failed with its exit status and last error, aborts the
  process groups (unblocking a collective in flight) and calls the failure callbacks (the
  server stops itself); the next call, or the one in flight, raises G906Error with that message;
- every collective of the compute group has a timeout (G906_TP_TIMEOUT, default 300 s);
- close() asks the workers to stop, waits briefly, then terminates and kills what is left; it
  also runs when the TPModel is garbage-collected and at interpreter exit."""

from __future__ import annotations

import atexit
import contextlib
import json
import logging
import os
import shutil
import signal
import subprocess
import sys
import tempfile
import threading
import time
import weakref
from typing import Callable

import torch
from torch import nn

from g906.arch.config import bound_positions
from g906.arch.tp import check_tp_size
from g906.engine.parallel.group import Comm, abort_distributed, destroy_distributed, init_distributed, timeout_s
from g906.engine.synthetic import is_synthetic, open_synthetic
from g906.envvars import positive_env
from g906.errors import G906Error

log = logging.getLogger("g906.engine")
STARTUP_TIMEOUT_S = 300.0
_ACTIVE: list["TPGroup"] = []


def load_rank(source: str, comm: Comm, *, dtype: torch.dtype, device, progress: bool = False, src=None,
              max_model_len: int | None = None, keep_mtp: bool = False):
    """Open `source` (unless `src` is the opened source) and load this rank's share:
    (model, source object, global config, stats). Position tables are sized for at most
    max_model_len, as on one device (bound_positions). keep_mtp: keep the MTP block's weights
    whole (rank 0 drafts with them; the workers never need them)."""
    from g906.engine.sources import open_source
    from g906.engine.parallel.layers import build_rank_model
    from g906.engine.parallel.sharding import shard_weights

    if src is None:
        src = open_synthetic(source, dtype, device) if is_synthetic(source) else open_source(str(source))[0]
    config = bound_positions(src.config(), max_model_len, source=str(source))
    check_tp_size(config, comm.size)
    model = build_rank_model(config, comm, dtype=dtype, device=device, keep_mtp=keep_mtp)
    try:
        weights = src.weights(progress=progress)
    except TypeError:
        weights = src.weights()
    stats = model.load_weights(shard_weights(weights, config, comm.rank, comm.size))
    return model, src, config, stats


class _Worker:
    def __init__(self, rank: int, proc: subprocess.Popen, status_fd: int):
        self.rank = rank
        self.proc = proc
        self.status = os.fdopen(status_fd, "r", encoding="utf-8")
        self.events: list[dict] = []
        self.cond = threading.Condition()
        self.exited: int | None = None

    def last(self, event: str) -> dict | None:
        return next((e for e in reversed(self.events) if e.get("event") == event), None)


class TPGroup:
    """The worker processes and this process's place (rank 0) in the group."""

    def __init__(self, size: int, devices: list[torch.device]):
        self.size = size
        self.devices = devices
        self.tmp = tempfile.mkdtemp(prefix="g906-tp-")
        self.store = os.path.join(self.tmp, "store")
        self.workers: list[_Worker] = []
        self.comm: Comm | None = None
        self.channel = None
        self.failure: str | None = None
        self.closing = False
        self.closed = False
        self.busy: str | None = None
        self.callbacks: list[Callable[[str], None]] = []
        self.timeout_s = timeout_s()
        self._lock = threading.Lock()

    # -- start ----------------------------------------------------------------------------------
    def launch(self, source: str, dtype: torch.dtype, max_model_len: int | None = None) -> None:
        _ACTIVE.append(self)
        env = dict(os.environ)
        pkg_root = os.path.dirname(os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__)))))
        env["PYTHONPATH"] = pkg_root + (os.pathsep + env["PYTHONPATH"] if env.get("PYTHONPATH") else "")
        if "GLOO_SOCKET_IFNAME" not in env and os.path.exists("/sys/class/net/lo"):
            env["GLOO_SOCKET_IFNAME"] = "lo"      # the ranks share this host
        for rank in range(1, self.size):
            r, w = os.pipe()
            spec = {"rank": rank, "size": self.size, "device": str(self.devices[rank]), "store": self.store,
                    "source": source, "dtype": str(dtype).replace("torch.", ""), "status_fd": w,
                    "threads": torch.get_num_threads(), "timeout_s": self.timeout_s, "max_model_len": max_model_len}
            try:
                proc = subprocess.Popen([sys.executable, "-m", "g906.engine.parallel.worker"], stdin=subprocess.PIPE,
                                        stdout=2, pass_fds=(w,), env={**env, "G906_TP_RANK": str(rank)},
                                        cwd=os.getcwd())
            except OSError as exc:
                os.close(r)
                os.close(w)
                raise G906Error(f"cannot start tensor-parallel worker {rank}: {exc}") from None
            finally:
                with contextlib.suppress(OSError):
                    os.close(w)
            worker = _Worker(rank, proc, r)
            self.workers.append(worker)
            proc.stdin.write((json.dumps(spec) + "\n").encode("utf-8"))
            proc.stdin.flush()
            threading.Thread(target=self._watch, args=(worker,), name=f"g906-tp-watch-{rank}", daemon=True).start()
        self.wait_for("ready", STARTUP_TIMEOUT_S, "start")
        self.comm = init_distributed(0, self.size, self.devices[0], self.store, self.timeout_s)
        from g906.engine.parallel.channel import Channel

        self.channel = Channel(self.comm)

    def wait_for(self, event: str, limit: float, what: str) -> None:
        """Wait until every worker reported `event`; a worker's error or death raises."""
        deadline = time.monotonic() + limit
        for w in self.workers:
            with w.cond:
                while w.last(event) is None:
                    if self.failure is not None:
                        raise G906Error(self.failure, hint=_HINT)
                    left = deadline - time.monotonic()
                    if left <= 0:
                        raise G906Error(f"tensor-parallel worker rank {w.rank} did not {what} within {limit:.0f} s",
                                        hint=_HINT)
                    w.cond.wait(min(left, 0.5))

    def _watch(self, w: _Worker) -> None:
        for line in w.status:
            try:
                ev = json.loads(line)
            except ValueError:
                continue
            with w.cond:
                w.events.append(ev)
                w.cond.notify_all()
        code = w.proc.wait()
        with w.cond:
            w.exited = code
            w.cond.notify_all()
        if self.closing:
            return
        err = w.last("error")
        how = (f"exited with status {code}" if code >= 0 else f"was killed by {_signame(-code)}")
        msg = f"tensor-parallel worker rank {w.rank} (pid {w.proc.pid}) {how}"
        if self.busy is not None:
            msg += f" during {self.busy}"
        if err is not None:
            msg += f": {err.get('message')}"
        self._fail(msg)

    def _fail(self, msg: str) -> None:
        with self._lock:
            if self.failure is not None:
                return
            self.failure = msg
        for w in self.workers:
            with w.cond:
                w.cond.notify_all()
        if self.busy is not None and self.comm is not None and self.comm.backend != "gloo":
            abort_distributed()       # unblock a collective in flight (gloo notices a dead peer itself)
        for cb in list(self.callbacks):
            try:
                cb(msg)
            except Exception:  # noqa: BLE001
                pass
        threading.Thread(target=self._backstop, args=(msg,), name="g906-tp-backstop", daemon=True).start()

    def _backstop(self, msg: str) -> None:
        """A collective that neither completes nor errors after a worker died would hang this
        process: end it with the message instead."""
        grace = max(10.0, min(60.0, self.timeout_s))
        deadline = time.monotonic() + grace
        while time.monotonic() < deadline:
            if self.busy is None or self.closed:
                return
            time.sleep(0.1)
        sys.stderr.write(f"g906: {msg}; the engine is stuck in a collective ({self.busy}): exiting\n")
        sys.stderr.flush()
        self.kill_workers()
        os._exit(1)

    # -- use ------------------------------------------------------------------------------------
    def check(self) -> None:
        if self.failure is not None:
            raise G906Error(self.failure, hint=_HINT)
        if self.closed:
            raise G906Error("the tensor-parallel engine was closed")

    @contextlib.contextmanager
    def collective(self, what: str):
        self.check()
        self.busy = what
        try:
            yield
        except Exception as exc:  # noqa: BLE001 - every failure becomes one clear error
            deadline = time.monotonic() + 3.0
            while self.failure is None and time.monotonic() < deadline and any(
                    w.proc.poll() is None for w in self.workers) and not _is_timeout(exc):
                time.sleep(0.05)
            if self.failure is None:
                time.sleep(0.2)          # a worker that just died: let its watcher name it
            msg = self.failure
            if msg is None:
                if _is_timeout(exc):
                    msg = (f"a tensor-parallel collective ({what}) did not complete within {self.timeout_s:g} s "
                           "(G906_TP_TIMEOUT): a worker is stuck or far too slow")
                else:
                    msg = f"tensor-parallel {what} failed: {type(exc).__name__}: {exc}"
                self._fail(msg)
            self.busy = None
            self.close()
            raise G906Error(msg, hint=_HINT) from None
        finally:
            self.busy = None

    def copy_blocks(self, src: list[int], dst: list[int]) -> None:
        """Copy KV blocks on every rank (forked beams)."""
        with self.group.collective("copy_blocks"):
            self.group.channel.send("copy_blocks", {"src": [int(x) for x in src], "dst": [int(x) for x in dst]})
        self.inner.cache.copy_blocks(src, dst)

    def on_failure(self, cb: Callable[[str], None]) -> None:
        self.callbacks.append(cb)

    # -- stop -------------------------------------------------------------------------------------
    def close(self, timeout: float = 5.0, *, graceful: bool = True) -> None:
        """Stop the workers: a shutdown command first when the group is healthy and `graceful`
        (then a short wait), else straight to EOF / terminate / kill."""
        with self._lock:
            if self.closed:
                return
            self.closed = True
            self.closing = True
        healthy = graceful and self.failure is None and self.channel is not None
        if healthy:
            try:
                self.channel.send("shutdown")
            except Exception:  # noqa: BLE001
                healthy = False
        deadline = time.monotonic() + (timeout if healthy else 1.0)
        if healthy:                      # let them finish the shutdown command before the EOF
            for w in self.workers:
                with w.cond:
                    while w.last("stopped") is None and w.exited is None and time.monotonic() < deadline:
                        w.cond.wait(0.1)
        for w in self.workers:
            with contextlib.suppress(OSError):
                w.proc.stdin.close()
        for w in self.workers:
            with contextlib.suppress(subprocess.TimeoutExpired):
                w.proc.wait(max(0.0, deadline - time.monotonic()))
        self.kill_workers()
        if healthy:
            destroy_distributed()
        else:
            abort_distributed()
            destroy_distributed()
        shutil.rmtree(self.tmp, ignore_errors=True)
        if self in _ACTIVE:
            _ACTIVE.remove(self)

    def kill_workers(self) -> None:
        for w in self.workers:
            if w.proc.poll() is None:
                with contextlib.suppress(OSError):
                    w.proc.terminate()     # ignored by the worker; SIGKILL follows
        for w in self.workers:
            if w.proc.poll() is None:
                with contextlib.suppress(OSError):
                    w.proc.kill()
                with contextlib.suppress(subprocess.TimeoutExpired):
                    w.proc.wait(5.0)


_HINT = "set G906_DEBUG=1 for the workers' tracebacks; docs/parallel.md explains the tensor-parallel engine"


def _is_timeout(exc: BaseException) -> bool:
    s = str(exc).lower()
    return "timed out" in s or "timeout" in s


def _signame(n: int) -> str:
    try:
        return signal.Signals(n).name
    except ValueError:
        return f"signal {n}"


@atexit.register
def _close_all() -> None:
    for g in list(_ACTIVE):
        with contextlib.suppress(Exception):
            g.close(timeout=2.0)


class TPModel(nn.Module):
    """Rank 0's model: Qwen35ForCausalLM's interface (forward, compute_logits, bind_cache,
    config, dtype, device); each call is sent to the workers first, then computed here.
    Steps run eagerly: decode graphs cannot replay the host-side control messages
    (supports_cuda_graphs is False)."""

    supports_cuda_graphs = False

    def __init__(self, model, group: TPGroup):
        super().__init__()
        self.inner = model
        self.group = group
        self.config = model.config             # the rank's local config (heads / tp)
        self.global_config = model.global_config
        self.dtype = model.dtype
        self.device = model.device
        self.tensor_parallel_size = group.size
        # the workers and the process group go when this model does (an LLM dropped without
        # close()) or at interpreter exit; the finalizer holds the group, never the model
        self._release = weakref.finalize(self, group.close)

    @property
    def cache(self):
        return self.inner.cache

    def forward(self, input_ids: torch.Tensor, positions: torch.Tensor, ctx, **kwargs) -> torch.Tensor:
        from g906.engine.parallel.channel import split_fields

        if input_ids.is_cuda and torch.cuda.is_current_stream_capturing():
            raise G906Error("a tensor-parallel step cannot be captured in a CUDA/HIP graph (its control messages "
                            "run on the host)", hint="run tensor-parallel engines eagerly (engine.enforce_eager)")
        meta, tensors = split_fields(ctx, "ctx.")
        plain = {k: v for k, v in kwargs.items() if not isinstance(v, torch.Tensor)}
        tensors.update({f"kw.{k}": v for k, v in kwargs.items() if isinstance(v, torch.Tensor)})
        with self.group.collective("forward"):
            self.group.channel.send("forward", {"ctx": meta, "kw": plain},
                                    {"input_ids": input_ids, "positions": positions, **tensors})
            return self.inner.forward(input_ids, positions, ctx, **kwargs)

    @torch.inference_mode()
    def compute_logits(self, hidden: torch.Tensor) -> torch.Tensor:
        from g906.engine.parallel.layers import rank_logits

        hidden = hidden.contiguous()
        with self.group.collective("logits"):
            self.group.channel.send("logits", {}, {"hidden": hidden})
            full = self.group.comm.gather_rows(rank_logits(self.inner, hidden))
        return full[:, : self.global_config.vocab_size]

    @torch.inference_mode()
    def embed(self, input_ids: torch.Tensor) -> torch.Tensor:
        """The token embeddings (vocab-parallel: every rank adds its rows in an all-reduce)."""
        with self.group.collective("embed"):
            self.group.channel.send("embed", {}, {"ids": input_ids})
            return self.inner.embed(input_ids)

    def rollback_linear_state(self, keep: torch.Tensor, snaps: torch.Tensor | None = None) -> None:
        """Qwen35ForCausalLM.rollback_linear_state on every rank (each holds its heads' states)."""
        with self.group.collective("rollback"):
            sent = {"keep": keep} if snaps is None else {"keep": keep, "snaps": snaps}
            self.group.channel.send("rollback", {}, sent)
            self.inner.rollback_linear_state(keep, snaps)

    def bind_cache(self, cache) -> None:
        with self.group.collective("cache"):
            self.group.channel.send("cache", {
                "num_blocks": int(cache.num_blocks), "block_size": int(cache.block_size),
                "num_state_slots": int(cache.num_state_slots), "dtype": str(cache.dtype).replace("torch.", ""),
            })
        self.inner.bind_cache(cache)

    def copy_states(self, src: list[int], dst: list[int]) -> None:
        """Copy linear-attention state slots on every rank (prefix-cache snapshots)."""
        with self.group.collective("copy_states"):
            self.group.channel.send("copy_states", {"src": [int(x) for x in src], "dst": [int(x) for x in dst]})
        self.inner.cache.copy_states(src, dst)

    def copy_blocks(self, src: list[int], dst: list[int]) -> None:
        """Copy KV blocks on every rank (forked beams)."""
        with self.group.collective("copy_blocks"):
            self.group.channel.send("copy_blocks", {"src": [int(x) for x in src], "dst": [int(x) for x in dst]})
        self.inner.cache.copy_blocks(src, dst)

    def on_failure(self, cb: Callable[[str], None]) -> None:
        """cb(message) runs (on a watcher thread) when a worker dies or a collective fails."""
        self.group.on_failure(cb)

    def close(self) -> None:
        self._release()


def _share_cpu_threads(tp: int) -> None:
    """CPU ranks share the host's cores: each gets its share of this process's intra-op threads
    (G906_TP_THREADS sets the per-rank count). Oversubscribed OpenMP threads spin against each
    other and make every collective wait (10x slower steps were seen with 2 ranks x 2 threads
    on 2 cores)."""
    n = positive_env("G906_TP_THREADS", max(1, torch.get_num_threads() // tp), int, "threads")
    if n != torch.get_num_threads():
        log.info("tensor parallel on the CPU: %d intra-op thread(s) per rank", n)
        torch.set_num_threads(n)


def _devices(tp: int, device, devices) -> list[torch.device]:
    from g906.engine.device import default_device

    dev0 = torch.device(device) if device is not None else default_device()
    if dev0.type == "cpu":
        return [torch.device("cpu")] * tp
    if dev0.type != "cuda":
        raise G906Error(f"tensor parallelism runs on GPUs (NCCL/RCCL) or the CPU (gloo), not on {dev0}")
    if devices:
        idx = [int(d) for d in devices]
        if len(idx) != tp:
            raise G906Error(f"{len(idx)} devices listed for tensor_parallel_size {tp}",
                            hint="list one GPU per rank")
    else:
        first = dev0.index or 0
        idx = list(range(first, first + tp))
    n = torch.cuda.device_count()
    bad = [i for i in idx if i >= n]
    if bad:
        raise G906Error(f"tensor_parallel_size {tp} needs GPUs {idx}, but only {n} are visible",
                        hint="lower tensor_parallel_size or make more GPUs visible (HIP_VISIBLE_DEVICES / "
                             "CUDA_VISIBLE_DEVICES)")
    return [torch.device("cuda", i) for i in idx]


def load_model_tp(source: str, *, tensor_parallel_size: int, dtype="auto", device=None, devices=None,
                  chat_template: str | None = None, progress: bool = True, max_model_len: int | None = None,
                  keep_mtp: bool = False):
    """load_model for tensor_parallel_size > 1: a LoadedModel whose .model is a TPModel.
    `devices`: GPU indices, one per rank (default: consecutive from `device`)."""
    from g906.engine.device import auto_dtype_for, resolve_dtype
    from g906.engine.sources import LoadedModel, open_source, tokenizer_and_template

    tp = int(tensor_parallel_size)
    if tp < 1:
        raise G906Error(f"tensor_parallel_size must be at least 1, got {tp}")
    devs = _devices(tp, device, devices)
    cdtype = resolve_dtype(dtype, devs[0])
    source = str(source)
    if not source.startswith("builtin:") and os.path.exists(os.path.expanduser(source)):
        source = os.path.abspath(os.path.expanduser(source))
    if is_synthetic(source):
        src, fmt = open_synthetic(source, cdtype, devs[0]), "synthetic"
    else:
        src, fmt = open_source(source)
        cdtype = resolve_dtype(auto_dtype_for(src, fmt, devs[0], dtype), devs[0])
    config = bound_positions(src.config(), max_model_len, source=source)
    check_tp_size(config, tp)
    if devs[0].type == "cpu":
        _share_cpu_threads(tp)
    t0 = time.perf_counter()
    group = TPGroup(tp, devs)
    try:
        group.launch(source, cdtype, max_model_len)
        model, src, config, stats = load_rank(source, group.comm, dtype=cdtype, device=devs[0], progress=progress,
                                              src=src, max_model_len=max_model_len, keep_mtp=keep_mtp)
        group.wait_for("loaded", STARTUP_TIMEOUT_S * 4, "load its weights")
    except BaseException:
        group.close(graceful=False)       # workers may still be loading: no command, just EOF
        raise
    load_s = time.perf_counter() - t0
    tp_model = TPModel(model, group)
    tok, template = tokenizer_and_template(src, chat_template)
    info = {
        "source": source, "format": fmt, "dtype": str(cdtype).replace("torch.", ""), "device": str(devs[0]),
        "load_seconds": round(load_s, 3), **stats,
        "tensor_parallel_size": tp, "devices": [str(d) for d in devs], "backend": group.comm.backend,
    }
    if fmt in ("builtin", "synthetic"):
        info.update({k: v for k, v in getattr(src, "info", {}).items() if k not in info})
    return LoadedModel(tp_model, model.config, tok, template, fmt, info)
