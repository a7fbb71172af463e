"""Programmatic dependent launch (CUDA, sm_90+): a kernel may start while the one before it in
the stream finishes, so the launch latency and the block scheduling of the ~250-400 small
kernels of a decode step overlap their predecessors' tails instead of adding to them.

A kernel taking `PDL: tl.constexpr` calls `pdl_start(PDL)` before it touches what the kernel
before it may write: it waits there for the previous kernel to complete (its writes visible:
`griddepcontrol.wait`), then lets the next kernel be scheduled (`launch_dependents`). When a
kernel runs, every kernel before the previous one has completed (each passed its own wait
before letting its successor start), so before the wait a kernel may read only what the
previous kernel does not write: constants (a GEMV's weights), the step's inputs uploaded
before the graph, a linear-attention layer's own state. It writes nothing before the wait, so
the order of effects is the stream order. `pdl_args(device)` gives the launch
keywords inside `graph_launches()` (the decode graphs' warm-up and capture); elsewhere, and on
other devices (ROCm, the CPU interpreter, pre-Hopper), none, and the kernels compile without
the wait. G906_PDL=0 turns it off.
"""

from __future__ import annotations

import contextlib
import functools
import os

import torch
import triton
import triton.language as tl

from ._triton_util import is_rocm


@triton.jit
def pdl_start(PDL: tl.constexpr):
    if PDL:
        tl.extra.cuda.gdc_wait()
        tl.extra.cuda.gdc_launch_dependents()


_IN_GRAPHS = False


@contextlib.contextmanager
def graph_launches():
    """Kernels launched inside (the decode graphs' warm-up and capture) use PDL."""
    global _IN_GRAPHS
    prev, _IN_GRAPHS = _IN_GRAPHS, True
    try:
        yield
    finally:
        _IN_GRAPHS = prev


@functools.lru_cache(maxsize=16)
def _pdl_ok(index: int) -> bool:
    return torch.cuda.get_device_capability(index) >= (9, 0)


def pdl_args(device: torch.device) -> dict:
    """Launch keywords for a kernel with a PDL constexpr on `device`: only inside
    `graph_launches()`, i.e. for the decode graphs, whose small kernels it is for. Launched
    eagerly it gains nothing (the host is the bottleneck there), and a per-launch check of the
    stream's capture state would slow the host-bound eager launches."""
    if (not _IN_GRAPHS or device.type != "cuda" or is_rocm()
            or os.environ.get("G906_PDL", "1") == "0"):
        return {}
    if not _pdl_ok(device.index if device.index is not None else torch.cuda.current_device()):
        return {}
    return {"PDL": True, "launch_pdl": True}
