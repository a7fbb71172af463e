"""Kernel tests: Triton kernels vs their PyTorch references.

Without a GPU the kernels run in Triton's interpreter on CPU tensors. TRITON_INTERPRET is read
when a kernel is decorated, i.e. when its module is first imported, so it is set (per test,
through monkeypatch, so nothing leaks into other folders' tests or their subprocesses) before
the kernel modules are imported, and kernel modules imported earlier without it are reloaded.
Outputs the kernels allocate start as NaN (G906_KERNELS_POISON=1), so unwritten elements fail.
"""

from __future__ import annotations

import importlib
import sys

import pytest
import torch

HAS_GPU = torch.cuda.is_available()
DEVICE = "cuda" if HAS_GPU else "cpu"


def _ensure_interpreted():
    from g906.kernels import registry

    for name, mod in list(sys.modules.items()):
        if not (name.startswith("g906.kernels.") and name.endswith(".kernel")):
            continue
        jitted = [v for v in vars(mod).values() if type(v).__name__ == "JITFunction"]
        if jitted:
            importlib.reload(mod)
            for op in registry.ops().values():
                op._triton_fn = None


@pytest.fixture(autouse=True)
def _kernel_env(monkeypatch):
    monkeypatch.setenv("G906_KERNELS_POISON", "1")
    monkeypatch.delenv("G906_KERNELS", raising=False)
    if not HAS_GPU:
        monkeypatch.setenv("TRITON_INTERPRET", "1")
        _ensure_interpreted()
    yield
