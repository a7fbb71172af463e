"""collect_facts: every collector of the facts package, run against one root, each guarded so
that a crashing collector becomes an entry in Facts.errors instead of stopping the doctor."""

from __future__ import annotations

import concurrent.futures as cf
import os
import sys
import time
from pathlib import Path
from typing import Any, Callable

from g906.doctor.facts.gpus import collect_driver, collect_kfd, collect_nvidia
from g906.doctor.facts.interpreter import NOT_PROBED, interpreter_facts, run_probe
from g906.doctor.facts.model import Facts
from g906.doctor.facts.rccl import collect_rccl, collect_rccl_swap
from g906.doctor.facts.rocblas import collect_rocblas
from g906.doctor.facts.rocm import collect_rocm
from g906.doctor.facts.sysroot import Root
from g906.doctor.facts.system import collect_device_nodes, collect_memory, collect_platform, collect_user
from g906.errors import UsageError
from g906.version import __version__

# Environment variables that change what the GPU stack does (recorded verbatim).
ENV_VARS = (
    "HIP_VISIBLE_DEVICES", "CUDA_VISIBLE_DEVICES", "ROCR_VISIBLE_DEVICES", "GPU_DEVICE_ORDINAL",
    "HSA_OVERRIDE_GFX_VERSION", "ROCBLAS_TENSILE_LIBPATH", "ROCM_PATH", "ROCM_HOME", "HIP_PATH",
    "HIP_PLATFORM", "LD_LIBRARY_PATH", "LD_PRELOAD", "PYTORCH_ROCM_ARCH", "HSA_ENABLE_SDMA",
    "NCCL_P2P_DISABLE", "NCCL_DEBUG", "RCCL_MSCCL_ENABLE", "TORCH_BLAS_PREFER_HIPBLASLT",
    "VLLM_USE_TRITON_FLASH_ATTN", "TRITON_INTERPRET", "G906_STATE_DIR",
)


def collect_facts(
    root: Path | str = Path("/"),
    python: str | None = None,
    timeout_s: float = 30.0,
    *,
    deep: bool = False,
    env: dict[str, str] | None = None,
    identity: tuple[int, list[int]] | None = None,
    probe: dict[str, Any] | None = None,
    run_tools: bool = True,
) -> Facts:
    """Collect the facts of this machine (or of the sysroot `root`).

    python: the interpreter whose torch/triton to inspect (default: this one), run in a
    subprocess limited to `timeout_s`. env: the environment to evaluate (default os.environ).
    identity: (uid, gids) to judge device-node access for (default: this process's).
    probe: recorded probe output to use instead of running the interpreter (tests, --root images).
    run_tools: run rocminfo when present (only on the live system, with the same time limit).
    """
    r = Root(Path(root))
    if not r.root.is_dir():
        raise UsageError(f"--root {root}: not a directory")
    env_all = dict(os.environ if env is None else env)
    facts = Facts(
        collected_at=time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()),
        g906_version=__version__,
        root=str(r.root),
        env={k: env_all[k] for k in ENV_VARS if k in env_all},
    )
    timings: dict[str, float] = {}

    def guarded(name: str, fn: Callable[[], Any], default: Any) -> Any:
        t0 = time.monotonic()
        try:
            return fn()
        except Exception as exc:  # noqa: BLE001 - a broken collector is a finding, not a crash
            facts.errors.append(f"{name}: {type(exc).__name__}: {exc}")
            return default
        finally:
            timings[name] = round(time.monotonic() - t0, 4)

    interpreter = python or sys.executable
    skip_probe = probe is None and python is None and not r.is_real
    with cf.ThreadPoolExecutor(max_workers=2) as pool:
        # the slow parts run side by side: the probe subprocess and rocminfo
        fut_probe = None
        if probe is None and not skip_probe:
            fut_probe = pool.submit(run_probe, interpreter, deep=deep, timeout_s=timeout_s,
                                    env_overrides=({k: v for k, v in env.items()} if env is not None else None))
        facts.platform = guarded("platform", lambda: collect_platform(r), {})
        facts.user = guarded("user", lambda: collect_user(r, identity), {"uid": os.getuid(), "gids": []})
        facts.device_nodes = guarded("device_nodes", lambda: collect_device_nodes(r, facts.user), {})
        gpus_kfd = guarded("kfd", lambda: collect_kfd(r), ([], {}))
        facts.gpus, facts.kfd = gpus_kfd
        facts.driver = guarded("driver", lambda: collect_driver(r), {})
        facts.nvidia = guarded("nvidia", lambda: collect_nvidia(r), {})
        facts.rocm = guarded("rocm", lambda: collect_rocm(r, env_all, run_tools=run_tools and bool(facts.gpus),
                                                          timeout_s=min(timeout_s, 10.0)), {})
        facts.memory = guarded("memory", lambda: collect_memory(r), {})
        t0 = time.monotonic()
        if fut_probe is not None:
            try:
                data = fut_probe.result()
            except Exception as exc:  # noqa: BLE001
                data = {"error": f"probe crashed: {type(exc).__name__}: {exc}"}
        elif skip_probe:
            data = NOT_PROBED
        else:
            data = dict(probe)
        timings["probe_wait"] = round(time.monotonic() - t0, 4)
    facts.python, facts.torch, facts.triton = interpreter_facts(data, interpreter)
    # paths the probe reported are live paths, except for recorded probes of a sysroot
    tr = r if probe is not None else Root(Path("/"))
    facts.rocblas = guarded("rocblas", lambda: collect_rocblas(r, tr, env_all, facts.torch, facts.rocm), {})
    facts.rccl = guarded("rccl", lambda: collect_rccl(r, tr, facts.torch, facts.rocm), {})
    facts.rccl_swap = guarded("rccl_swap", lambda: collect_rccl_swap(facts.torch, tr), {})
    facts.timings = timings
    return facts
