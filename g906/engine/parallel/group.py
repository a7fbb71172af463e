"""Process-group setup for one tensor-parallel engine, and the test-only fault hook.

Two groups over the same ranks:
  compute  the default group: NCCL (RCCL on ROCm) on GPUs, gloo on CPU. The model's collectives
           (all-reduce after row-parallel layers and the embedding, the logits gather) and each
           step's payload run here, with a finite timeout (G906_TP_TIMEOUT seconds, default 300):
           a collective stuck that long raises instead of hanging.
  ctrl     a gloo group for the control headers. Workers wait here between steps, possibly for
           hours (an idle server), so its timeout is long; a dead rank 0 is noticed by the
           workers' parent watch instead (see worker.py).

Rendezvous is a FileStore in a fresh temporary directory (no ports to pick). gloo binds to the
loopback interface unless GLOO_SOCKET_IFNAME says otherwise (the ranks share one host)."""

from __future__ import annotations

import os
from dataclasses import dataclass
from datetime import timedelta

import torch
import torch.distributed as dist

from g906.envvars import positive_env
from g906.errors import G906Error

DEFAULT_TIMEOUT_S = 300.0
CTRL_TIMEOUT = timedelta(days=30)


def timeout_s() -> float:
    return positive_env("G906_TP_TIMEOUT", DEFAULT_TIMEOUT_S, float, "seconds")


def backend_for(device: torch.device) -> str:
    return "nccl" if device.type == "cuda" else "gloo"


def _loopback_default() -> None:
    if "GLOO_SOCKET_IFNAME" not in os.environ and os.path.exists("/sys/class/net/lo"):
        os.environ["GLOO_SOCKET_IFNAME"] = "lo"


@dataclass
class Comm:
    """One rank's view of the tensor-parallel group."""

    rank: int
    size: int
    device: torch.device
    backend: str
    ctrl: object            # the gloo control group
    timeout_s: float

    @property
    def is_driver(self) -> bool:
        return self.rank == 0

    def all_reduce(self, t: torch.Tensor) -> torch.Tensor:
        dist.all_reduce(t)
        return t

    def gather_rows(self, local: torch.Tensor) -> torch.Tensor | None:
        """Gather equally shaped [N, P] pieces onto rank 0 as [N, size * P]; None elsewhere."""
        if self.rank == 0:
            parts = [torch.empty_like(local) for _ in range(self.size)]
            dist.gather(local, parts, dst=0)
            return torch.cat(parts, dim=-1)
        dist.gather(local, None, dst=0)
        return None


def init_distributed(rank: int, size: int, device: torch.device, store_path: str, tmo: float) -> Comm:
    if dist.is_initialized():
        raise G906Error(
            "a torch.distributed process group already exists in this process",
            hint="close the other tensor-parallel engine first (LLM.close()), or run with tensor_parallel_size 1",
        )
    _loopback_default()
    backend = backend_for(device)
    kw = {}
    if backend == "nccl":
        torch.cuda.set_device(device)
        kw["device_id"] = device
    dist.init_process_group(backend, init_method=f"file://{store_path}", rank=rank, world_size=size,
                            timeout=timedelta(seconds=tmo), **kw)
    ctrl = dist.new_group(backend="gloo", timeout=CTRL_TIMEOUT)
    return Comm(rank, size, device, backend, ctrl, tmo)


def abort_distributed() -> None:
    """Tear the groups down without waiting for peers (after a failure)."""
    if not dist.is_initialized():
        return
    try:
        abort = getattr(dist.distributed_c10d, "_abort_process_group", None)
        if abort is not None:
            abort()
            return
    except Exception:  # noqa: BLE001 - best effort
        pass
    destroy_distributed()


def destroy_distributed() -> None:
    if dist.is_initialized():
        try:
            dist.destroy_process_group()
        except Exception:  # noqa: BLE001 - best effort on the way out
            pass


# -- the test-only fault hook -----------------------------------------------------------------

@dataclass(frozen=True)
class Fault:
    """G906_TP_FAULT="rank=1,step=3,kind=exit|raise|hang": worker `rank` misbehaves when it
    receives its step-th forward command (counted from 1; warm-up steps count)."""

    rank: int
    step: int
    kind: str


def fault_from_env() -> Fault | None:
    raw = os.environ.get("G906_TP_FAULT")
    if not raw:
        return None
    try:
        kv = dict(p.split("=", 1) for p in raw.split(",") if p)
        f = Fault(int(kv.get("rank", 1)), int(kv.get("step", 1)), kv.get("kind", "exit"))
    except ValueError:
        raise G906Error(f"G906_TP_FAULT={raw!r}: expected rank=N,step=N,kind=exit|raise|hang") from None
    if f.kind not in ("exit", "raise", "hang"):
        raise G906Error(f"G906_TP_FAULT kind {f.kind!r}: expected exit, raise or hang")
    return f
