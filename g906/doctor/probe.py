"""The torch/triton probe: run by the interpreter under inspection, never imported by the doctor.

`g906 doctor` runs ``<python> probe.py [--deep]`` in a subprocess with a time limit, so that a
missing, broken or hanging torch is a finding instead of a crash of the doctor itself. This file
uses only the standard library (plus torch where it imports), because the inspected interpreter
may not have g906 installed. It prints one JSON object on the line after MARKER.
"""

import json
import os
import sys
import time
import traceback

MARKER = "--g906-probe-json--"


def _last_line(exc):
    text = "".join(traceback.format_exception_only(type(exc), exc)).strip()
    return text.splitlines()[-1] if text else type(exc).__name__


def _spec_origin(name):
    try:
        import importlib.util

        spec = importlib.util.find_spec(name)
    except Exception as exc:  # a broken parent package, etc.
        return None, _last_line(exc)
    if spec is None:
        return None, None
    origin = spec.origin
    if origin in (None, "namespace") and spec.submodule_search_locations:
        origin = os.path.join(list(spec.submodule_search_locations)[0], "__init__.py")
    return origin, None


def _distribution_of(top_level, candidates):
    """(name, version) of the installed distribution that provides `top_level`."""
    try:
        from importlib import metadata
    except Exception:
        return None, None
    for name in candidates:
        try:
            dist = metadata.distribution(name)
        except Exception:
            continue
        try:
            tops = (dist.read_text("top_level.txt") or "").split()
        except Exception:
            tops = []
        files = []
        if not tops:
            try:
                files = [str(f) for f in (dist.files or [])[:200]]
            except Exception:
                files = []
        if top_level in tops or any(f.startswith(top_level + "/") for f in files) or not (tops or files):
            return dist.metadata.get("Name") or name, dist.version
    try:
        mapping = metadata.packages_distributions()
        names = mapping.get(top_level) or []
        for name in names:
            try:
                return name, metadata.version(name)
            except Exception:
                continue
    except Exception:
        pass
    return None, None


def _static_version(pkg_dir):
    """torch/version.py read as text: known even when `import torch` fails or hangs."""
    import re

    try:
        with open(os.path.join(pkg_dir, "version.py"), encoding="utf-8") as f:
            text = f.read()
    except OSError:
        return {}
    out = {}
    for key, name in (("__version__", "version"), ("hip", "hip"), ("cuda", "cuda"), ("git_version", "git_version")):
        m = re.search(r"^%s\s*(?::[^=]*)?=\s*['\"]([^'\"]*)['\"]" % re.escape(key), text, re.M)
        if m:
            out[name] = m.group(1)
    if out.get("hip"):
        out["backend"] = "rocm"
    elif out.get("cuda"):
        out["backend"] = "cuda"
    elif out.get("version"):
        out["backend"] = "cpu"
    return out


def probe_torch(deep):
    out = {"found": False}
    origin, err = _spec_origin("torch")
    if err:
        out.update(found=True, import_ok=False, error=err)
        return out
    if origin is None:
        return out
    pkg_dir = os.path.dirname(origin)
    out.update(found=True, path=pkg_dir, lib_dir=os.path.join(pkg_dir, "lib"))
    dist, dist_version = _distribution_of("torch", ["torch"])
    out["distribution"] = dist
    out["distribution_version"] = dist_version
    out.update(_static_version(pkg_dir))
    t0 = time.monotonic()
    try:
        import torch
    except BaseException as exc:  # noqa: BLE001 - ImportError, OSError (missing .so), SystemExit...
        out.update(import_ok=False, error=_last_line(exc), import_s=round(time.monotonic() - t0, 3))
        return out
    out.update(import_ok=True, import_s=round(time.monotonic() - t0, 3))
    out["version"] = getattr(torch, "__version__", None)
    v = getattr(torch, "version", None)
    out["hip"] = getattr(v, "hip", None)
    out["cuda"] = getattr(v, "cuda", None)
    out["git_version"] = getattr(v, "git_version", None)
    backend = "cpu"
    if out["hip"]:
        backend = "rocm"
    elif out["cuda"]:
        backend = "cuda"
    out["backend"] = backend
    out["devices"] = []
    out["device_count"] = 0
    out["arch_list"] = []
    if backend == "cpu":
        return out
    try:
        out["arch_list"] = list(torch.cuda.get_arch_list())
    except Exception as exc:
        out["arch_list_error"] = _last_line(exc)
    try:
        out["device_count"] = int(torch.cuda.device_count())
    except Exception as exc:
        out["device_count_error"] = _last_line(exc)
        return out
    for i in range(out["device_count"]):
        d = {"index": i}
        try:
            p = torch.cuda.get_device_properties(i)
            d["name"] = getattr(p, "name", None)
            d["arch"] = getattr(p, "gcnArchName", None) if backend == "rocm" else None
            d["total_memory"] = int(getattr(p, "total_memory", 0) or 0)
            d["capability"] = [getattr(p, "major", None), getattr(p, "minor", None)]
            d["multi_processor_count"] = getattr(p, "multi_processor_count", None)
        except Exception as exc:
            d["error"] = _last_line(exc)
        out["devices"].append(d)
    if deep:
        out["deep"] = deep_checks(torch, out["device_count"])
    return out


def deep_checks(torch, count):
    res = {"matmul": [], "allreduce": None}
    for i in range(count):
        r = {"device": i}
        t0 = time.monotonic()
        try:
            g = torch.Generator().manual_seed(0)
            a = torch.randn(256, 256, generator=g)
            b = torch.randn(256, 256, generator=g)
            ref = a @ b
            dev = torch.device("cuda", i)
            got = (a.to(dev, torch.float16) @ b.to(dev, torch.float16)).float().cpu()
            torch.cuda.synchronize(dev)
            err = float((got - ref).abs().max() / ref.abs().max())
            r.update(ok=err < 1e-2, rel_err=err)
        except BaseException as exc:  # noqa: BLE001
            r.update(ok=False, error=_last_line(exc))
        r["seconds"] = round(time.monotonic() - t0, 3)
        res["matmul"].append(r)
    if count >= 2:
        res["allreduce"] = allreduce_check(torch)
    return res


def _allreduce_worker(rank, world, port, q):
    import torch
    import torch.distributed as dist

    try:
        torch.cuda.set_device(rank)
        dist.init_process_group("nccl", init_method=f"tcp://127.0.0.1:{port}", rank=rank, world_size=world)
        x = torch.full((1024,), float(rank + 1), device=f"cuda:{rank}")
        dist.all_reduce(x)
        torch.cuda.synchronize()
        q.put((rank, float(x[0].item()), None))
        dist.destroy_process_group()
    except BaseException as exc:  # noqa: BLE001
        q.put((rank, None, _last_line(exc)))


def allreduce_check(torch):
    import multiprocessing as mp
    import socket

    world = 2
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    ctx = mp.get_context("spawn")
    q = ctx.Queue()
    procs = [ctx.Process(target=_allreduce_worker, args=(r, world, port, q)) for r in range(world)]
    t0 = time.monotonic()
    for p in procs:
        p.start()
    results = {}
    errors = []
    try:
        for _ in range(world):
            rank, value, err = q.get(timeout=90)
            results[rank] = value
            if err:
                errors.append(f"rank {rank}: {err}")
    except Exception:
        errors.append("timed out waiting for the all-reduce (a hang usually means RCCL has no code for this GPU)")
    for p in procs:
        p.join(timeout=5)
        if p.is_alive():
            p.kill()
    expected = float(sum(range(1, world + 1)))
    ok = not errors and all(v == expected for v in results.values()) and len(results) == world
    return {"ok": ok, "world_size": world, "errors": errors, "seconds": round(time.monotonic() - t0, 3)}


TRITON_DISTS = ["triton", "pytorch-triton-rocm", "pytorch-triton", "triton-rocm", "triton-gfx906", "triton-nightly"]


def probe_triton():
    out = {"found": False}
    origin, err = _spec_origin("triton")
    if err:
        out.update(found=True, error=err)
        return out
    if origin is None:
        return out
    pkg = os.path.dirname(origin)
    out.update(found=True, path=pkg)
    dist, version = _distribution_of("triton", TRITON_DISTS)
    out["distribution"] = dist
    out["version"] = version
    backends_dir = os.path.join(pkg, "backends")
    try:
        out["backends"] = sorted(
            d for d in os.listdir(backends_dir)
            if os.path.isdir(os.path.join(backends_dir, d)) and not d.startswith("_")
        )
    except OSError:
        out["backends"] = []
    mentions = False
    for rel in ("backends/amd/compiler.py", "backends/amd/driver.py", "_C/include/triton/Dialect/TritonGPU/IR/Dialect.h"):
        try:
            with open(os.path.join(pkg, rel), "rb") as f:
                if b"gfx906" in f.read():
                    mentions = True
                    break
        except OSError:
            continue
    out["mentions_gfx906"] = mentions
    return out


def main(argv):
    deep = "--deep" in argv
    out = {
        "python": {
            "executable": sys.executable,
            "version": ".".join(str(x) for x in sys.version_info[:3]),
            "prefix": sys.prefix,
        }
    }
    t0 = time.monotonic()
    for key, fn in (("triton", probe_triton), ("torch", lambda: probe_torch(deep))):
        try:
            out[key] = fn()
        except BaseException as exc:  # noqa: BLE001
            out[key] = {"found": True, "import_ok": False, "error": "probe crashed: " + _last_line(exc)}
    out["probe_s"] = round(time.monotonic() - t0, 3)
    sys.stdout.write("\n" + MARKER + "\n" + json.dumps(out) + "\n")
    sys.stdout.flush()


if __name__ == "__main__":
    main(sys.argv[1:])
