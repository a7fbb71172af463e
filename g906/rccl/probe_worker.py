"""One rank of `g906 rccl probe`. Run by the *target* interpreter as a plain script (it does not
import g906, which may not be installed there). Prints one JSON line per event, prefixed
"G906PROBE ", and exits 0 (ok), 3 (torch import failed), 4 (cannot run here), 5 (wrong
result) or 6 (a collective raised)."""

import argparse
import json
import sys
import time
import traceback


def emit(event, **data):
    data["event"] = event
    sys.stdout.write("G906PROBE " + json.dumps(data, default=str) + "\n")
    sys.stdout.flush()


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--rank", type=int, required=True)
    ap.add_argument("--world-size", type=int, required=True)
    ap.add_argument("--backend", required=True)
    ap.add_argument("--init", required=True)
    ap.add_argument("--timeout", type=float, default=120)
    ap.add_argument("--sizes", default="1,4096,1048576")
    a = ap.parse_args()
    rank, world = a.rank, a.world_size

    t0 = time.time()
    try:
        import torch
        import torch.distributed as dist
    except BaseException as exc:  # noqa: BLE001 - the point is to report it
        emit("import_failed", rank=rank, error="%s: %s" % (type(exc).__name__, exc))
        return 3
    versions = {"torch": torch.__version__, "hip": getattr(torch.version, "hip", None),
                "cuda": getattr(torch.version, "cuda", None), "import_s": round(time.time() - t0, 2)}
    if a.backend == "nccl":
        try:
            nccl = torch.cuda.nccl.version()
            versions["nccl"] = ".".join(str(x) for x in nccl) if isinstance(nccl, tuple) else str(nccl)
        except Exception as exc:  # noqa: BLE001
            versions["nccl"] = None
            versions["nccl_error"] = str(exc)
    emit("imported", rank=rank, versions=versions)

    if not dist.is_available():
        emit("unavailable", rank=rank, reason="this torch was built without torch.distributed")
        return 4
    device = torch.device("cpu")
    if a.backend == "nccl":
        if not dist.is_nccl_available():
            emit("unavailable", rank=rank, reason="this torch has no NCCL/RCCL backend (a CPU-only build?)")
            return 4
        if not torch.cuda.is_available():
            emit("unavailable", rank=rank, reason="torch sees no GPU (torch.cuda.is_available() is False)")
            return 4
        count = torch.cuda.device_count()
        if count < world:
            emit("unavailable", rank=rank, reason="%d GPU(s) visible, the probe needs %d" % (count, world))
            return 4
        torch.cuda.set_device(rank)
        device = torch.device("cuda", rank)
        props = torch.cuda.get_device_properties(rank)
        emit("device", rank=rank, name=props.name, arch=getattr(props, "gcnArchName", None))
    elif a.backend == "gloo":
        if not dist.is_gloo_available():
            emit("unavailable", rank=rank, reason="this torch has no gloo backend")
            return 4
    else:
        emit("unavailable", rank=rank, reason="unknown backend %r" % a.backend)
        return 4

    import datetime

    try:
        dist.init_process_group(a.backend, init_method=a.init, rank=rank, world_size=world,
                                timeout=datetime.timedelta(seconds=a.timeout))
    except BaseException as exc:  # noqa: BLE001
        emit("error", rank=rank, stage="init_process_group", error="%s: %s" % (type(exc).__name__, exc),
             trace=traceback.format_exc(limit=3))
        return 6
    expected = float(world)
    sizes = [int(s) for s in a.sizes.split(",") if s]
    sample = None
    try:
        for dtype in (torch.float32, torch.float16):
            for n in sizes:
                stage = "all_reduce %s x %d" % (str(dtype).replace("torch.", ""), n)
                t = torch.ones(n, dtype=dtype, device=device)
                dist.all_reduce(t)
                if a.backend == "nccl":
                    torch.cuda.synchronize()
                host = t.float().cpu()
                if n == 4096 and dtype == torch.float32:
                    sample = host[:4].tolist()
                bad = (host != expected).nonzero()
                if bad.numel():
                    i = int(bad[0])
                    emit("wrong", rank=rank, stage=stage, expected=expected, index=i, got=float(host[i]),
                         head=host[:4].tolist())
                    return 5
                stage = "all_gather %s x %d" % (str(dtype).replace("torch.", ""), n)
                mine = torch.full((n,), float(rank + 1), dtype=dtype, device=device)
                outs = [torch.zeros(n, dtype=dtype, device=device) for _ in range(world)]
                dist.all_gather(outs, mine)
                for r, o in enumerate(outs):
                    host = o.float().cpu()
                    bad = (host != float(r + 1)).nonzero()
                    if bad.numel():
                        i = int(bad[0])
                        emit("wrong", rank=rank, stage=stage, expected=float(r + 1), index=i, got=float(host[i]),
                             from_rank=r)
                        return 5
                emit("passed", rank=rank, stage=stage)
        dist.barrier()
    except BaseException as exc:  # noqa: BLE001
        emit("error", rank=rank, stage=stage, error="%s: %s" % (type(exc).__name__, exc),
             trace=traceback.format_exc(limit=3))
        return 6
    finally:
        try:
            dist.destroy_process_group()
        except Exception:  # noqa: BLE001
            pass
    emit("ok", rank=rank, sample=sample, seconds=round(time.time() - t0, 2))
    return 0


if __name__ == "__main__":
    sys.exit(main())
