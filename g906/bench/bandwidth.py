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
    best = float("inf")
    if dev.type == "cuda":
        torch.cuda.synchronize(dev)
        start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        for _ in range(repeats):
            start.record()
            dst.copy_(src)
            end.record()
            end.synchronize()
            best = min(best, start.elapsed_time(end) / 1e3)
    else:
        for _ in range(max(3, repeats // 2)):
            t0 = time.perf_counter()
            dst.copy_(src)
            best = min(best, time.perf_counter() - t0)
    del src, dst
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
    best = float("inf")
    if dev.type == "cuda":
        torch.cuda.synchronize(dev)
        start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        for _ in range(repeats):
            start.record()
            torch.matmul(a, b, out=c)
            end.record()
            end.synchronize()
            best = min(best, start.elapsed_time(end) / 1e3)
    else:
        for _ in range(3):
            t0 = time.perf_counter()
            torch.matmul(a, b, out=c)
            best = min(best, time.perf_counter() - t0)
    del a, b, c
    return 2.0 * n ** 3 / best
