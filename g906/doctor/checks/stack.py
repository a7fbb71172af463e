"""Software-stack checks: ROCm userspace, the Python interpreter, torch, triton, the compatibility
matrix, rocBLAS Tensile files, RCCL device code, g906's RCCL swap, the engine device, --deep."""

from __future__ import annotations

from g906.doctor import compat
from g906.doctor.checks import Ctx, Result, check, fail, ok, skip, warn
from g906.doctor.facts import normalise_arch
from g906.doctor.memory import resolve_dtype

PIP_ROCM_HINT = "pip install torch --index-url https://download.pytorch.org/whl/rocm6.3  (torch 2.9, the known-good ROCm 6.3 stack)"


def _gfx906_target(ctx: Ctx) -> bool:
    """Are gfx906 GPUs what this machine (or the plan) will compute on?"""
    if ctx.plan is not None:
        return any(normalise_arch(g.get("gfx")) == "gfx906" for g in ctx.plan_gpus())
    return bool(ctx.gfx906_visible)


def _torch_desc(t: dict) -> str:
    v = t.get("version") or "?"
    if t.get("hip"):
        return f"torch {v} (HIP {t['hip']})"
    if t.get("cuda"):
        return f"torch {v} (CUDA {t['cuda']})"
    return f"torch {v} (CPU build)"


# --- ROCm ----------------------------------------------------------------------------------------


@check("rocm.version", "ROCm", "ROCm userspace")
def rocm_version(ctx: Ctx) -> Result:
    r = ctx.facts.rocm
    if not ctx.amd:
        if r.get("version"):
            return ok(f"ROCm {r['version']} at {r.get('path')} (no AMD GPU)")
        return skip("no AMD GPU")
    if r.get("rocm_path_missing"):
        return fail(f"ROCM_PATH={r['rocm_path_missing']} does not exist",
                    fix="point ROCM_PATH at your ROCm install (usually /opt/rocm) or unset it")
    v = r.get("version")
    if not v:
        if ctx.torch_backend == "rocm":
            return ok("no system ROCm found; the pip torch wheel brings its own ROCm libraries",
                      "A system ROCm is only needed for rocminfo, hipcc and building RCCL/kernels.")
        return warn("no ROCm userspace found (/opt/rocm/.info/version)",
                    "Neither /opt/rocm nor ROCM_PATH holds a ROCm install.",
                    "install ROCm 6.3 (the known-good release for gfx906): https://rocm.docs.amd.com, "
                    "or use a pip torch rocm wheel, which brings its own libraries")
    m = compat.matrix()["rocm"]
    detail = f"{r.get('path')} (from {r.get('version_from', '?')})"
    ri = r.get("rocminfo") or {}
    if ri.get("ran") and not ri.get("ok"):
        return warn(f"ROCm {v}: rocminfo fails: {ri.get('error')}", detail,
                    "run rocminfo yourself; usually a permission (render/video group) or driver problem")
    if not ctx.has_gfx906:
        return ok(f"ROCm {v}", detail)
    if compat.at_least(v, m["tensile_dropped_from"]):
        return ok(f"ROCm {v}: gfx906 needs add-ons from {m['tensile_dropped_from']} on",
                  detail + f"\nROCm {m['tensile_dropped_from']}+ ships no gfx906 Tensile files and no gfx906 RCCL; "
                  "see rocblas.tensile and rccl.gfx906 below.")
    if not compat.at_least(v, m["oldest_tested"]):
        return warn(f"ROCm {v} is older than g906 tests ({m['oldest_tested']}+)", detail,
                    "upgrade to ROCm 6.3, the last release that supports gfx906 out of the box")
    return ok(f"ROCm {v} supports gfx906 out of the box", detail)


@check("rocm.torch_match", "ROCm", "torch built for this ROCm")
def rocm_torch_match(ctx: Ctx) -> Result:
    if not ctx.amd or ctx.torch_backend != "rocm":
        return skip("not a ROCm torch on an AMD machine")
    sys_v = ctx.facts.rocm.get("version")
    hip = ctx.torch.get("hip")
    torch_rocm = compat.torch_rocm_from_version(ctx.torch.get("version")) or compat.major_minor(hip)
    if not sys_v or not torch_rocm:
        return skip("the system ROCm or torch's ROCm version is unknown")
    if compat.same_series(sys_v, torch_rocm):
        return ok(f"torch built for ROCm {torch_rocm}, system ROCm {compat.major_minor(sys_v)}")
    sev = fail if compat.version_tuple(sys_v)[:1] != compat.version_tuple(torch_rocm)[:1] else warn
    return sev(f"torch was built for ROCm {torch_rocm} but the system ROCm is {sys_v}",
               "Mixing a torch built for one ROCm with another ROCm userspace is a classic failure: libraries on "
               "LD_LIBRARY_PATH or preloaded from /opt/rocm replace the ones torch was built against "
               "(symbol errors, hangs, rocBLAS aborts).",
               f"install the torch wheel for your ROCm (pip install torch --index-url "
               f"https://download.pytorch.org/whl/rocm{compat.major_minor(sys_v)}) or keep /opt/rocm/lib off "
               "LD_LIBRARY_PATH")


# --- Python, torch, triton ---------------------------------------------------------------------------


@check("python.interpreter", "Python", "Python interpreter")
def python_interpreter(ctx: Ctx) -> Result:
    p = ctx.facts.python
    if p.get("skipped"):
        return skip("not inspected under --root (pass --python PATH to inspect an interpreter)")
    if p.get("missing"):
        return fail(p.get("error") or "interpreter not found", fix="pass the path of a Python 3.10+ interpreter with --python")
    if p.get("timed_out"):
        return fail(p.get("error") or "the probe timed out",
                    "Importing torch hung; typical causes: a GPU held by a crashed process, a stuck driver, or an "
                    "NFS home directory.",
                    "run: python -c 'import torch; print(torch.cuda.device_count())' and see where it stops")
    if p.get("error"):
        return fail(p["error"], fix="run the interpreter by hand to see the error")
    v = p.get("version") or "?"
    if compat.version_tuple(v) < (3, 10):
        return fail(f"Python {v} is too old (g906 needs 3.10+)", fix="use Python 3.10-3.12")
    return ok(f"Python {v} ({p.get('executable')})")


@check("torch.import", "Python", "PyTorch")
def torch_import(ctx: Ctx) -> Result:
    t = ctx.torch
    if t.get("skipped"):
        return skip(t["skipped"])
    if t.get("found") is None:
        return skip("the interpreter could not be probed")
    if not t.get("found"):
        return fail("torch is not installed in " + str(ctx.facts.python.get("executable")),
                    "The embedded engine needs PyTorch.",
                    PIP_ROCM_HINT if ctx.has_gfx906 else "pip install torch")
    if not t.get("import_ok"):
        return fail(f"import torch fails: {t.get('error')}",
                    "A wheel for another ROCm/CUDA, a missing system library or a half-finished install.",
                    "reinstall the matching wheel, e.g. " + (PIP_ROCM_HINT if ctx.has_gfx906 else "pip install --force-reinstall torch"))
    return ok(_torch_desc(t), f"{t.get('path')} (import took {t.get('import_s', '?')} s)")


@check("torch.backend", "Python", "torch build matches the hardware")
def torch_backend(ctx: Ctx) -> Result:
    if not ctx.torch_ok:
        return skip("torch is not importable")
    b = ctx.torch_backend
    if ctx.amd:
        if b == "rocm":
            return ok(f"ROCm build ({_torch_desc(ctx.torch)})")
        return warn(f"{_torch_desc(ctx.torch)} on an AMD GPU machine: the engine will run on the CPU",
                    "This torch cannot use AMD GPUs.", PIP_ROCM_HINT)
    if ctx.facts.nvidia.get("present"):
        if b == "cuda":
            return ok(f"CUDA build ({_torch_desc(ctx.torch)})")
        return warn(f"{_torch_desc(ctx.torch)} on an NVIDIA machine: the engine will run on the CPU",
                    fix="pip install torch  (the default wheel on Linux is built for CUDA)")
    if b == "cpu":
        return ok("CPU build; no GPU here: the embedded engine will run on the CPU")
    return ok(f"{_torch_desc(ctx.torch)}; no GPU found, so the CPU is used")


@check("torch.devices", "Python", "GPUs seen by torch")
def torch_devices(ctx: Ctx) -> Result:
    if not ctx.torch_ok:
        return skip("torch is not importable")
    t = ctx.torch
    n = int(t.get("device_count") or 0)
    names = [f"{d.get('index')}: {d.get('name') or '?'} {d.get('arch') or ''}".strip() for d in t.get("devices", [])]
    if ctx.torch_backend == "rocm" and ctx.amd:
        expect = len(ctx.visible)
        if n == 0 and expect:
            return fail(f"torch sees no GPU although {expect} AMD GPU(s) are visible",
                        t.get("device_count_error") or "Usually missing /dev/kfd or render-node access, or an "
                        "HSA_OVERRIDE_GFX_VERSION that matches no GPU.",
                        "fix the Access checks above; then: python -c 'import torch; print(torch.cuda.device_count())'")
        if n != expect:
            return warn(f"torch sees {n} GPU(s), the KFD topology {expect} visible", "\n".join(names),
                        "check HIP_VISIBLE_DEVICES / ROCR_VISIBLE_DEVICES")
        errs = [d for d in t.get("devices", []) if d.get("error")]
        if errs:
            return fail(f"torch cannot query GPU {errs[0]['index']}: {errs[0]['error']}", "\n".join(names),
                        "check the GPU with rocminfo / rocm-smi; hide a broken GPU with HIP_VISIBLE_DEVICES")
        return ok(f"{n} GPU(s): " + ", ".join(sorted({(d.get('arch') or '?') for d in t.get('devices', [])})),
                  "\n".join(names))
    if ctx.torch_backend == "cuda":
        if n == 0:
            return (fail if ctx.facts.nvidia.get("present") else ok)(
                "torch (CUDA) sees no GPU" if ctx.facts.nvidia.get("present") else "no CUDA GPU; the CPU is used",
                t.get("device_count_error") or "",
                "check the NVIDIA driver (nvidia-smi) and CUDA_VISIBLE_DEVICES" if ctx.facts.nvidia.get("present") else None)
        return ok(f"{n} CUDA GPU(s)", "\n".join(names))
    return skip("no GPU build of torch" if ctx.torch_backend == "cpu" else "no AMD GPU")


@check("torch.arch_list", "Python", "torch compiled for gfx906")
def torch_arch_list(ctx: Ctx) -> Result:
    if not _gfx906_target(ctx) or ctx.torch_backend != "rocm":
        return skip("no gfx906 GPU with a ROCm torch")
    archs = ctx.torch.get("arch_list") or []
    if not archs:
        return warn("torch did not report its compiled architectures", ctx.torch.get("arch_list_error", ""),
                    "run: python -c 'import torch; print(torch.cuda.get_arch_list())'")
    base = {normalise_arch(a) for a in archs}
    if "gfx906" in base:
        return ok("gfx906 is in torch's arch list", " ".join(archs))
    return fail("this torch has no gfx906 kernels (" + " ".join(archs) + ")",
                "Every torch GPU op fails with 'invalid device function' / 'no kernel image is available'.",
                "install a torch wheel or build that includes gfx906 (PYTORCH_ROCM_ARCH=gfx906 when building), "
                "e.g. " + PIP_ROCM_HINT)


@check("triton.gfx906", "Python", "Triton")
def triton_gfx906(ctx: Ctx) -> Result:
    tr = ctx.facts.triton
    if tr.get("skipped"):
        return skip(tr["skipped"])
    if tr.get("found") is None:
        return skip("the interpreter could not be probed")
    hint = compat.matrix()["triton"]["fork_hint"]
    desc = f"{tr.get('distribution') or 'triton'} {tr.get('version') or '?'}"
    if _gfx906_target(ctx) and ctx.target_device == "rocm":
        if not tr.get("found"):
            return warn("Triton is not installed: the engine uses its PyTorch reference ops (slower)", fix=hint)
        if tr.get("error"):
            return warn(f"Triton is broken: {tr['error']}", fix=hint)
        if "amd" not in (tr.get("backends") or ["amd"]):
            return warn(f"{desc} has no AMD backend (backends: {', '.join(tr.get('backends') or [])})", fix=hint)
        if compat.triton_is_gfx906_build(tr):
            return ok(f"{desc} (a gfx906 build)")
        return warn(f"{desc} looks like upstream Triton, which has no gfx906 target",
                    "Triton kernels fail to compile for gfx906; the engine falls back to its PyTorch reference ops "
                    "(correct, slower).", hint)
    if not tr.get("found"):
        if ctx.target_device == "cpu":
            return ok("not installed (not needed on the CPU)")
        return warn("Triton is not installed: the engine uses its PyTorch reference ops (slower)",
                    fix="pip install triton")
    if tr.get("error"):
        return warn(f"Triton is broken: {tr['error']}", fix="pip install --force-reinstall triton")
    if ctx.target_device == "cpu":
        return ok(f"{desc} (on the CPU the kernels run only under TRITON_INTERPRET=1)")
    return ok(desc)


@check("compat.stack", "ROCm", "Known-good gfx906 stack")
def compat_stack(ctx: Ctx) -> Result:
    if not _gfx906_target(ctx) or ctx.torch_backend != "rocm":
        return skip("no gfx906 GPU with a ROCm torch")
    rocm = ctx.facts.rocm.get("version")
    tver = ctx.torch.get("version")
    thip = compat.torch_rocm_from_version(tver) or compat.major_minor(ctx.torch.get("hip"))
    triton = ctx.facts.triton.get("version")
    matches = compat.match_stacks(rocm or thip, tver, thip, triton)
    best = matches[0] if matches else None
    have = f"ROCm {rocm or '(torch-bundled ' + str(thip) + ')'}, {_torch_desc(ctx.torch)}, triton {triton or 'none'}"
    if best and best.full:
        needs = {"triton_gfx906": "a Triton built for gfx906 (triton.gfx906)",
                 "tensile_gfx906": "gfx906 Tensile files (rocblas.tensile)",
                 "rccl_gfx906_for_tp": "a gfx906 RCCL for tensor parallel (rccl.gfx906)"}
        extra = [needs.get(n, n) for n in best.needs]
        return ok(f"matches the known-good stack {best.id}",
                  have + "\n" + best.note + ("\nthis stack also needs: " + "; ".join(extra) if extra else ""),
                  stack=best.id)
    if best and best.matched["torch_hip"] and best.matched["torch"]:
        off = [k for k, v in best.matched.items() if not v]
        return warn(f"close to {best.id}, but {', '.join(off)} differ(s)", have + "\nknown good: " + best.note,
                    "align the differing component with the known-good stack: " + best.note)
    notes = "\n".join(f"  {m.id}: {m.note}" for m in matches)
    return warn("not a known-good gfx906 combination", have + "\nknown good:\n" + notes,
                "move to one of the known-good stacks above (ROCm 6.3 + torch 2.9 is the simplest)")


# --- libraries -----------------------------------------------------------------------------------------


@check("rocblas.tensile", "Libraries", "rocBLAS Tensile files for gfx906")
def rocblas_tensile(ctx: Ctx) -> Result:
    if not _gfx906_target(ctx):
        return skip("no gfx906 GPU in use")
    if ctx.torch_inspected and ctx.torch_backend not in ("rocm", None):
        return skip("torch is not a ROCm build")
    rb = ctx.facts.rocblas
    if not rb.get("library"):
        if ctx.torch_backend == "rocm":
            return fail("no librocblas.so found (torch/lib or $ROCM_PATH/lib)",
                        fix="reinstall the torch ROCm wheel, or install rocblas from your ROCm release")
        return skip("no librocblas.so found")
    shown = [s for s in rb.get("search", []) if s.get("exists")] or rb.get("search", [])
    searched = "\n".join(
        f"  {s['path']}: " + ("missing" if not s.get("exists") else
                              (f"{s.get('file_count', 0)} gfx906 file(s)" if s.get("file_count") else
                               "no gfx906 files" + (f" (has {', '.join(s.get('archs')[:6])})" if s.get("archs") else "")))
        for s in shown)
    absent = len(rb.get("search", [])) - len(shown)
    if absent:
        searched += f"\n  ({absent} other candidate folder(s) do not exist)"
    lib = rb["library"]
    if rb.get("found"):
        return ok(f"gfx906 Tensile files in {rb['found_in']}", f"rocBLAS: {lib}\nsearched:\n{searched}")
    env = rb.get("env_override")
    where = env or rb.get("install_dir")
    detail = (f"rocBLAS: {lib}\n" + (f"ROCBLAS_TENSILE_LIBPATH={env} is searched exclusively.\n" if env else "")
              + f"searched:\n{searched}\n"
              "Without them rocBLAS aborts at the first matmul: \"Cannot read TensileLibrary... for GPU arch gfx906\".")
    return fail("no gfx906 Tensile files where rocBLAS looks" + (" (ROCBLAS_TENSILE_LIBPATH)" if env else ""),
                detail,
                f"copy TensileLibrary_lazy_gfx906.dat (or TensileLibrary_gfx906.dat) and the *gfx906*.co / *.hsaco "
                f"files from a ROCm 6.3 rocBLAS (/opt/rocm-6.3*/lib/rocblas/library) into {where}"
                + ("" if env else ", or set ROCBLAS_TENSILE_LIBPATH to a directory that holds them"),
                install_dir=where)


@check("rccl.gfx906", "Libraries", "RCCL device code for gfx906")
def rccl_gfx906(ctx: Ctx) -> Result:
    if not _gfx906_target(ctx):
        return skip("no gfx906 GPU in use")
    if ctx.torch_inspected and ctx.torch_backend not in ("rocm", None):
        return skip("torch is not a ROCm build")
    rc = ctx.facts.rccl
    tp = ctx.tp
    n = len(ctx.gfx906_visible)
    needed = tp > 1 if ctx.plan is not None else n > 1
    why = (f"the recipe uses tensor_parallel_size={tp}" if ctx.plan is not None else f"{n} gfx906 GPUs are visible")
    fix = ("g906 rccl install PACKAGE  (a librccl built with gfx906 code; parallel.rccl in the recipe lets "
           "`g906 up` install it)")
    if not rc.get("library"):
        if needed:
            return fail(f"no librccl.so found, and {why}", fix=fix)
        return skip("no librccl.so found (only needed for tensor parallel)")
    lib = rc["library"]
    if rc.get("error"):
        res = fail if needed else warn
        return res(f"cannot read {lib}: {rc['error']}", fix="reinstall torch, or " + fix)
    ver = rc.get("version")
    desc = f"{lib} (RCCL {ver or 'version unknown'}, SONAME {rc.get('soname') or '?'})"
    archs = rc.get("gfx_targets") or []
    detail = desc + "\ndevice code for: " + (", ".join(archs) or "none found")
    if rc.get("has_gfx906"):
        # target features: code built for sramecc+ (MI50/MI60) does not load on sramecc- (Radeon VII)
        from g906.binfmt import has_gfx_target

        device_targets = sorted({d.get("arch") for d in ctx.torch.get("devices", [])
                                 if normalise_arch(d.get("arch")) == "gfx906" and ":" in str(d.get("arch"))})
        ids = rc.get("offload_targets") or []
        mismatched = [t for t in device_targets if ids and not has_gfx_target(ids, t)]
        if not mismatched:
            return ok(f"RCCL has gfx906 code (RCCL {ver or '?'})", detail)
        msg = (f"RCCL's gfx906 code is built for other target features than the GPU ({', '.join(mismatched)})")
        detail += "\nentries: " + ", ".join(i for i in ids if "gfx906" in i)
        if needed:
            return fail(msg, detail + "\nThe code objects do not load: TP fails with \"invalid device function\".",
                        "install an RCCL built for this GPU's target (e.g. plain gfx906, which fits both settings): " + fix)
        return warn(msg, detail, fix)
    if ctx.plan is None and n > 1:
        return warn("RCCL has no gfx906 code: tensor parallel over these GPUs would fail",
                    detail + "\nOne GPU per model works; TP>1 fails at init with \"invalid device function\".",
                    fix, archs=archs)
    if not needed:
        return ok("RCCL has no gfx906 code; fine for one GPU (tensor parallel would fail)", detail,
                  archs=archs)
    package = getattr(ctx.plan, "rccl_package", None) if ctx.plan is not None else None
    if package:
        return warn(f"RCCL has no gfx906 code; `g906 up` installs parallel.rccl = {package} first",
                    detail, f"nothing to do for `g906 up`; by hand: g906 rccl install {package}", archs=archs)
    return fail(f"RCCL has no gfx906 code, and {why}",
                detail + "\nTensor parallel fails at init with \"invalid device function\" / \"invalid kernel file\".",
                fix, archs=archs)


@check("rccl.swap", "Libraries", "g906 RCCL swap state")
def rccl_swap(ctx: Ctx) -> Result:
    s = ctx.facts.rccl_swap
    if not s.get("applicable"):
        return skip(s.get("reason") or "no torch library directory")
    state = s.get("state")
    if state == "none":
        return ok("no RCCL swap by g906")
    if state == "damaged":
        return fail("the RCCL swap manifest is damaged", s.get("error", ""), "g906 rccl status  (then follow its advice)")
    if state in ("installing", "rolling_back"):
        return fail(f"an RCCL swap was interrupted ({state}, step {s.get('step')})",
                    "torch/lib may hold a half-swapped RCCL until the transaction is finished or undone.",
                    "g906 rccl rollback  (or g906 rccl install again)")
    if state == "rolled_back":
        return ok("the g906 RCCL swap was rolled back; torch's own RCCL is in place")
    sizes = s.get("current_sizes") or {}
    new_size = s.get("new_size")
    changed = [k for k, v in sizes.items() if new_size is not None and v != new_size]
    if changed:
        return warn("torch/lib's RCCL is no longer the one g906 installed (torch reinstalled?)",
                    "changed: " + ", ".join(changed), "g906 rccl status; g906 rccl install PACKAGE to swap again")
    return ok(f"gfx906 RCCL installed by g906 (RCCL {s.get('new_rccl_version') or '?'}, {s.get('source')})")


# --- engine and --deep ---------------------------------------------------------------------------------


@check("engine.device", "Engine", "Where the embedded engine runs")
def engine_device(ctx: Ctx) -> Result:
    dev = ctx.engine_device
    arch = ctx.target_arch
    requested = getattr(ctx.plan, "dtype", "auto") if ctx.plan is not None else "auto"
    dtype = resolve_dtype(requested, dev, arch)
    if ctx.plan is not None and getattr(ctx.plan, "engine_kind", "embedded") == "vllm":
        return ok("engine.kind = \"vllm\": the recipe hands over to vLLM", f"vLLM would run on: {dev}")
    if dev == "rocm":
        gpus = ctx.gfx906_visible or ctx.visible
        return ok(f"the embedded engine will run on {len(gpus)} x {arch or 'AMD GPU'} via ROCm ({dtype})",
                  engine_device=dev, dtype=dtype)
    if dev == "cuda":
        names = sorted({d.get("name") or "?" for d in ctx.torch.get("devices", [])})
        return ok(f"the embedded engine will run on CUDA: {', '.join(names)} ({dtype})", engine_device=dev, dtype=dtype)
    if ctx.amd or ctx.facts.nvidia.get("present"):
        return warn(f"the embedded engine will run on the CPU ({dtype}) although a GPU is present",
                    "torch cannot use the GPU (see the Python checks).", "fix the failing torch checks above",
                    engine_device="cpu", dtype=dtype)
    return ok(f"the embedded engine will run on the CPU ({dtype})", "No GPU: fine for development, tests and small models.",
              engine_device="cpu", dtype=dtype)


@check("deep.matmul", "Deep", "fp16 matmul on each GPU", deep=True, preflight=False)
def deep_matmul(ctx: Ctx) -> Result:
    d = ctx.torch.get("deep")
    if not isinstance(d, dict):
        return skip("run with --deep")
    rows = d.get("matmul") or []
    if not rows:
        return skip("no GPU to test")
    bad = [r for r in rows if not r.get("ok")]
    detail = "\n".join(f"GPU {r['device']}: " + ("ok" if r.get("ok") else r.get("error") or f"rel err {r.get('rel_err')}")
                       + f" ({r.get('seconds')} s)" for r in rows)
    if bad:
        return fail(f"matmul failed on GPU {bad[0]['device']}: {bad[0].get('error') or 'wrong result'}", detail,
                    "see rocblas.tensile and torch.arch_list")
    return ok(f"fp16 matmul correct on {len(rows)} GPU(s)", detail)


@check("deep.allreduce", "Deep", "all-reduce over 2 GPUs", deep=True, preflight=False)
def deep_allreduce(ctx: Ctx) -> Result:
    d = ctx.torch.get("deep")
    if not isinstance(d, dict):
        return skip("run with --deep")
    a = d.get("allreduce")
    if not a:
        return skip("fewer than 2 GPUs")
    if a.get("ok"):
        return ok(f"all-reduce over {a.get('world_size')} GPUs correct ({a.get('seconds')} s)")
    return fail("all-reduce failed: " + ("; ".join(a.get("errors") or []) or "wrong result"),
                fix="see rccl.gfx906: g906 rccl install PACKAGE")
