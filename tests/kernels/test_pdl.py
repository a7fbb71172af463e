"""Programmatic dependent launch (g906/kernels/pdl.py): the launch keywords appear only inside
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


# kernels that read, before their wait, what the kernel before them does not write (pdl.py):
# the GEMVs their weights, the recurrent step its slot's state and conv taps
EARLY_READERS = {"_gemv_kernel", "_pq_gemv_program", "_gdn_decode_kernel"}
# kernels whose programs are such a function (called with the kernel's PDL)
DELEGATES = {"_pq_gemv_kernel": "_pq_gemv_program", "_pq_gemv_pair_kernel": "_pq_gemv_program"}


def test_every_kernel_with_a_pdl_switch_waits_first():
    """A kernel that may start early must wait before it touches its predecessor's outputs:
    pdl_start is the first statement of every kernel taking PDL, except the few that read
    constants first, and those write nothing before it."""
    import importlib
    import inspect
    import pkgutil

    import g906.kernels

    found = 0
    for info in pkgutil.walk_packages(g906.kernels.__path__, "g906.kernels."):
        name = info.name
        if name.count(".") < 3:          # the ops' packages' modules (not pdl.py's own helper)
            continue
        mod = importlib.import_module(name)
        for obj in vars(mod).values():
            fn = getattr(obj, "fn", None)
            if (fn is None or getattr(fn, "__module__", None) != mod.__name__
                    or "PDL" not in inspect.signature(fn).parameters):
                continue
            found += 1
            body = inspect.getsource(fn).split('"""')
            code = body[-1] if len(body) >= 3 else inspect.getsource(fn).split("):\n", 1)[1]
            lines = [line.strip() for line in code.splitlines() if line.strip()]
            if fn.__name__ in DELEGATES:
                assert not any(w in line for line in lines for w in ("store", "atomic")), fn.__name__
                assert any(line.startswith(DELEGATES[fn.__name__] + "(") for line in lines), fn.__name__
                continue
            if fn.__name__ not in EARLY_READERS:
                assert lines[0] == "pdl_start(PDL)", (name, fn.__name__, lines[0])
                continue
            before = lines[:lines.index("pdl_start(PDL)")]
            assert not any(w in line for line in before for w in ("store", "atomic", "conv_finish")), \
                (fn.__name__, before)
    # 11 decode kernels, the q/k norm + rotary, the two argmax passes, the packed GEMV's program
    # and its pair kernel, the quantized embedding
    assert found == 17
