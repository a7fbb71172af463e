"""Copy bandwidth of a device, measured here: the limit that batch-1 decode is compared with.

A device-to-device copy of `nbytes` (1 GiB on GPUs, 64 MiB on the CPU) is timed several times;
the rate counts bytes read plus bytes written (2 x nbytes per copy), the best of the repeats.
Decode at batch 1 must read every weight once per token, so

    limit tok/s = copy bandwidth / bytes read per token
"""

from __future__ import annotations

import time

import torch


def measure_copy_bandwidth(device, nbytes: int | None = None, repeats: int = 10) -> float:
    """Bytes per second (read + write) of a large copy on `device`."""
    dev = torch.device(device)
    if nbytes is None:
        nbytes = (1 << 30) if dev.type == "cuda" else (64 << 20)
    n = nbytes // 2
    src = torch.empty(n, dtype=torch.float16, device=dev).fill_(1.0)
    dst = torch.empty_like(src)
    dst.copy_(src)
    best = _best_seconds(lambda: dst.copy_(src), dev, repeats if dev.type == "cuda" else max(3, repeats // 2))
    return 2.0 * n * 2 / best


def limit_tok_s(bandwidth: float, bytes_per_token: int) -> float:
    return bandwidth / bytes_per_token if bytes_per_token > 0 else float("inf")


def measure_matmul_flops(device, n: int | None = None, dtype=torch.float16, repeats: int = 10) -> float:
    """FLOP/s of an n x n x n matmul (8192 on GPUs, 512 fp32 on the CPU), the best of the repeats."""
    dev = torch.device(device)
    if dev.type != "cuda":
        dtype = torch.float32
    n = n or (8192 if dev.type == "cuda" else 512)
    a = torch.randn(n, n, device=dev, dtype=dtype)
    b = torch.randn(n, n, device=dev, dtype=dtype)
    c = a @ b
    best = _best_seconds(lambda: torch.matmul(a, b, out=c), dev, repeats if dev.type == "cuda" else 3)
    return 2.0 * n ** 3 / best


def _best_seconds(fn, dev: torch.device, repeats: int) -> float:
    """The fastest of `repeats` runs of fn (already warmed up): CUDA events on a GPU, the host
    clock on the CPU."""
    best = float("inf")
    if dev.type == "cuda":
        torch.cuda.synchronize(dev)
        start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        for _ in range(repeats):
            start.record()
            fn()
            end.record()
            end.synchronize()
            best = min(best, start.elapsed_time(end) / 1e3)
    else:
        for _ in range(repeats):
            t0 = time.perf_counter()
            fn()
            best = min(best, time.perf_counter() - t0)
    return best
