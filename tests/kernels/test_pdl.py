"""Programmatic dependent launch (kernels/pdl.py): the launch keywords appear only inside
`graph_launches()` on a CUDA device of compute capability 9+, never elsewhere."""

from __future__ import annotations

import torch

from g906.kernels import pdl


def test_pdl_only_inside_graph_launches(monkeypatch):
    monkeypatch.setattr(pdl, "_pdl_ok", lambda index: True)     # a Hopper, without one here
    monkeypatch.setattr(torch.version, "hip", None)
    monkeypatch.delenv("G906_PDL", raising=False)
    cuda = torch.device("cuda", 0)
    on = {"PDL": True, "launch_pdl": True}
    assert pdl.pdl_args(cuda) == {}                              # eager launches: never
    with pdl.graph_launches():
        assert pdl.pdl_args(cuda) == on
        assert pdl.pdl_args(torch.device("cpu")) == {}          # the interpreter
        with pdl.graph_launches():
            pass
        assert pdl.pdl_args(cuda) == on                          # nesting restores the flag
        monkeypatch.setenv("G906_PDL", "0")
        assert pdl.pdl_args(cuda) == {}
        monkeypatch.delenv("G906_PDL")
        monkeypatch.setattr(torch.version, "hip", "6.4")
        assert pdl.pdl_args(cuda) == {}                          # ROCm has no PDL
        monkeypatch.setattr(torch.version, "hip", None)
        monkeypatch.setattr(pdl, "_pdl_ok", lambda index: False)
        assert pdl.pdl_args(cuda) == {}                          # before sm_90
    assert pdl.pdl_args(cuda) == {}


def test_every_kernel_with_a_pdl_switch_waits_first():
    """A kernel that may start early must wait before its first memory access: pdl_start is
    the first statement of every kernel taking PDL."""
    import importlib
    import inspect

    names = ["activation", "attention", "conv1d", "gdn", "kv_cache", "linear", "norm", "rotary"]
    found = 0
    for name in names:
        mod = importlib.import_module(f"g906.kernels.{name}.kernel")
        for obj in vars(mod).values():
            fn = getattr(obj, "fn", None)
            if (fn is None or getattr(fn, "__module__", None) != mod.__name__
                    or "PDL" not in inspect.signature(fn).parameters):
                continue
            found += 1
            body = inspect.getsource(fn).split('"""')
            code = body[-1] if len(body) >= 3 else inspect.getsource(fn).split("):\n", 1)[1]
            first = next(line.strip() for line in code.splitlines() if line.strip())
            assert first == "pdl_start(PDL)", (name, fn.__name__, first)
    assert found == 12       # 11 decode kernels and the q/k norm + rotary
