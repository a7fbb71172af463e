"""Kernel registry: every op has a PyTorch reference and (optionally) a Triton kernel.

`dispatch(name, *args, **kwargs)` picks one per call:

- G906_KERNELS=reference: always the reference.
- G906_KERNELS=triton: always the Triton kernel (CPU tensors only under TRITON_INTERPRET=1);
  an op without a Triton kernel, or a call its kernel does not support, raises KernelChoiceError.
- G906_KERNELS=auto (default): CPU tensors get the reference; GPU tensors get the Triton kernel
  when Triton imports and the op's `supports(*args, **kwargs)` accepts the call (dtype the
  device can compute, shapes in range), else the reference.

Triton modules are imported lazily (first GPU call), so importing g906.kernels.ops never
imports triton.
"""

from __future__ import annotations

import functools
import importlib
import itertools
import os
from dataclasses import dataclass, field
from typing import Any, Callable

import torch

MODES = ("reference", "triton", "auto")


class KernelChoiceError(Exception):
    """G906_KERNELS asks for what cannot run: an unknown mode, or a Triton kernel forced where
    there is none or it cannot take the call. `hint` says what to do instead; the engine
    reports both as its own user-facing error."""

    def __init__(self, message: str, hint: str | None = None):
        super().__init__(message)
        self.message = message
        self.hint = hint


@dataclass
class Op:
    name: str
    reference: Callable[..., Any]
    triton: str | None = None                      # "module:function" inside g906.kernels
    supports: Callable[..., bool] | None = None    # extra capability check for the Triton path
    _triton_fn: Callable[..., Any] | None = field(default=None, repr=False)

    def triton_fn(self) -> Callable[..., Any]:
        if self._triton_fn is None:
            mod, fn = self.triton.split(":")
            self._triton_fn = getattr(importlib.import_module(f"{__package__}.{mod}"), fn)
        return self._triton_fn


_OPS: dict[str, Op] = {}


def register(name: str, reference: Callable[..., Any], triton: str | None = None,
             supports: Callable[..., bool] | None = None) -> Op:
    op = Op(name, reference, triton, supports)
    _OPS[name] = op
    return op


def _load_ops() -> None:
    if not _OPS:
        importlib.import_module(f"{__package__}.ops")  # registers every op


def ops() -> dict[str, Op]:
    _load_ops()
    return dict(_OPS)


_MODE_SEEN: list = [None, "auto"]       # (raw G906_KERNELS value, its mode): one env read per call


def mode() -> str:
    raw = os.environ.get("G906_KERNELS", "auto")
    if raw == _MODE_SEEN[0]:
        return _MODE_SEEN[1]
    m = raw.strip().lower() or "auto"
    if m not in MODES:
        raise KernelChoiceError(f"G906_KERNELS={m!r} is not one of {', '.join(MODES)}",
                                hint="unset it or set G906_KERNELS=auto")
    _MODE_SEEN[:] = [raw, m]
    return m


def interpret() -> bool:
    return os.environ.get("TRITON_INTERPRET", "0").strip().lower() in ("1", "true", "yes", "on")


@functools.lru_cache(maxsize=None)
def triton_available() -> bool:
    try:
        import triton  # noqa: F401
        import triton.language  # noqa: F401
    except Exception:
        return False
    return True


@functools.lru_cache(maxsize=None)
def _device_caps(device_type: str, index: int) -> dict[str, Any]:
    caps: dict[str, Any] = {"bf16": False, "arch": "cpu", "rocm": False}
    if device_type != "cuda":
        return caps
    props = torch.cuda.get_device_properties(index)
    rocm = torch.version.hip is not None
    caps["rocm"] = rocm
    if rocm:
        arch = getattr(props, "gcnArchName", "gfx").split(":")[0]
        caps["arch"] = arch
        # gfx906/gfx908 have no bf16 ALU; CDNA2+ (gfx90a, gfx94x, gfx95x) and RDNA3+ do.
        caps["bf16"] = arch.startswith(("gfx90a", "gfx94", "gfx95", "gfx11", "gfx12"))
    else:
        caps["arch"] = f"sm_{props.major}{props.minor}"
        caps["bf16"] = props.major >= 8
    return caps


def device_caps(device: torch.device) -> dict[str, Any]:
    return _device_caps(device.type, device.index if device.index is not None else
                        (torch.cuda.current_device() if device.type == "cuda" else 0))


def dtype_ok(t: torch.Tensor) -> bool:
    """Whether the device computes this dtype natively (bf16 only where it has a bf16 ALU)."""
    if t.dtype in (torch.float16, torch.float32):
        return True
    if t.dtype == torch.bfloat16:
        return t.device.type == "cpu" or device_caps(t.device)["bf16"]
    return False


def _first_tensor(args, kwargs) -> torch.Tensor | None:
    for a in itertools.chain(args, kwargs.values()):
        if isinstance(a, torch.Tensor):
            return a
        if hasattr(a, "data") and isinstance(getattr(a, "data"), torch.Tensor):
            return a.data
    return None


def _auto_picks_triton(op: Op, args, kwargs) -> bool:
    """G906_KERNELS=auto: the Triton kernel for GPU tensors it supports, else the reference."""
    t = _first_tensor(args, kwargs)
    return (t is not None and t.device.type == "cuda" and op.triton is not None and triton_available()
            and (op.supports is None or op.supports(*args, **kwargs)))


def choose(name: str, *args, **kwargs) -> str:
    """'reference' or 'triton' for this call."""
    _load_ops()
    op = _OPS[name]
    m = mode()
    if m == "reference":
        return "reference"
    t = _first_tensor(args, kwargs)
    on_gpu = t is not None and t.device.type == "cuda"
    if m == "triton":
        if op.triton is None:
            raise KernelChoiceError(f"kernel {name!r} has no Triton implementation",
                                    hint="use G906_KERNELS=auto or reference")
        if not on_gpu and not interpret():
            raise KernelChoiceError(f"G906_KERNELS=triton but {name!r} was called on CPU tensors",
                                    hint="set TRITON_INTERPRET=1 to run Triton kernels on the CPU")
        if op.supports is not None and not op.supports(*args, **kwargs):
            raise KernelChoiceError(f"the Triton kernel {name!r} does not support this call "
                                    "(dtype or shape out of its range)", hint="use G906_KERNELS=auto")
        return "triton"
    return "triton" if _auto_picks_triton(op, args, kwargs) else "reference"


def dispatch(name: str, *args, **kwargs):
    op = _OPS.get(name)
    if op is None:
        _load_ops()
        op = _OPS[name]
    # the per-call cost matters (hundreds of calls per eager step): auto mode is decided here
    # without choose()'s second registry lookup and mode read
    if mode() == "auto":
        use_triton = _auto_picks_triton(op, args, kwargs)
    else:
        use_triton = choose(name, *args, **kwargs) == "triton"
    return op.triton_fn()(*args, **kwargs) if use_triton else op.reference(*args, **kwargs)


def call_reference(name: str, *args, **kwargs):
    _load_ops()
    return _OPS[name].reference(*args, **kwargs)


def call_triton(name: str, *args, **kwargs):
    _load_ops()
    return _OPS[name].triton_fn()(*args, **kwargs)
