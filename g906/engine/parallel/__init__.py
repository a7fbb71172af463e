"""Tensor parallelism for the embedded engine (torch.distributed: NCCL/RCCL on GPUs, gloo on CPU).

    sharding.py  per-rank head/row index sets, the rank's local ModelConfig, weight sharding
    layers.py    row-parallel Linear (all-reduce), vocab-parallel embedding, the rank's model
    channel.py   the rank-0 -> workers control channel (header broadcast + one packed payload)
    group.py     process-group setup, timeouts, the test fault hook
    worker.py    the worker process (`python -m g906.engine.parallel.worker`)
    engine.py    rank 0: spawn workers, TPModel (the model the runner drives), watchdog, shutdown

Which tensor-parallel sizes a model allows is g906.arch.tp (torch-free: the recipe resolver uses
it too). See docs/parallel.md. Importing this package does not import torch."""

from __future__ import annotations

from g906.arch.tp import check_tp_size, tp_message, tp_problems, valid_tp_sizes  # noqa: F401


def load_model_tp(*args, **kwargs):
    """Load a model split over tensor_parallel_size ranks (see engine.load_model_tp)."""
    from g906.engine.parallel.engine import load_model_tp as _load

    return _load(*args, **kwargs)
