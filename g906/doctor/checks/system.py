"""System checks: platform, GPUs (KFD / NVIDIA), visibility variables, HSA override, busy GPUs,
the amdgpu driver and device-node access."""

from __future__ import annotations

from typing import Any

from g906.doctor.checks import Ctx, Result, check, fail, ok, skip, warn
from g906.doctor.compat import matrix
from g906.doctor.facts import normalise_arch, parse_visible
from g906.doctor.memory import fmt_bytes


def gpu_label(g: dict[str, Any]) -> str:
    name = normalise_arch(g.get("gfx")) or "unknown"
    vram = g.get("vram_bytes")
    return f"GPU {g.get('index')}: {name}" + (f" ({fmt_bytes(vram)})" if vram else "")


@check("system.platform", "System", "Operating system")
def platform_check(ctx: Ctx) -> Result:
    p = ctx.facts.platform
    system, machine = p.get("system"), p.get("machine")
    desc = " ".join(x for x in (p.get("os"), f"kernel {p['kernel']}" if p.get("kernel") else None, machine) if x)
    if system and system != "Linux":
        return warn(f"{system}: ROCm and gfx906 serving need Linux", desc,
                    "run g906 on Linux (the CPU engine works elsewhere, GPUs do not)")
    return ok(desc or "Linux")


@check("gpu.detect", "System", "GPUs")
def gpu_detect(ctx: Ctx) -> Result:
    f = ctx.facts
    if ctx.amd:
        labels = [gpu_label(g) for g in ctx.amd]
        return ok(f"{len(ctx.amd)} AMD GPU(s): " + ", ".join(sorted({normalise_arch(g.get('gfx')) or '?' for g in ctx.amd})),
                  "\n".join(labels), gpus=[g.get("gfx") for g in ctx.amd])
    if f.nvidia.get("present"):
        models = [m.get("model") or m.get("bus") for m in f.nvidia.get("gpus", [])]
        tdev = [d.get("name") for d in ctx.torch.get("devices", []) if d.get("name")] if ctx.torch_backend == "cuda" else []
        names = models or tdev or ["NVIDIA GPU"]
        drv = f.nvidia.get("driver_version")
        return ok(f"NVIDIA: {', '.join(str(n) for n in names)}" + (f" (driver {drv})" if drv else ""),
                  "g906 runs on NVIDIA through PyTorch CUDA; the gfx906-specific checks are skipped.")
    if ctx.torch_backend == "cuda" and int(ctx.torch.get("device_count") or 0) > 0:
        return ok(f"CUDA: {int(ctx.torch['device_count'])} device(s) seen by torch")
    if f.kfd.get("topology") and not ctx.amd:
        return warn("the KFD topology lists no GPU node",
                    "/sys/class/kfd/kfd/topology/nodes has only CPU nodes (simd_count 0).",
                    "check that the amdgpu driver bound to the GPU: sudo dmesg | grep -i amdgpu")
    return ok("no GPU found: the embedded engine will run on the CPU",
              "No KFD GPU nodes, no NVIDIA driver. That is fine for development and tests.")


@check("gpu.arch", "System", "GPU architecture")
def gpu_arch(ctx: Ctx) -> Result:
    if not ctx.amd:
        return skip("no AMD GPU")
    archs = {g["index"]: normalise_arch(g.get("gfx")) for g in ctx.amd}
    others = {i: a for i, a in archs.items() if a != "gfx906"}
    gfx906 = [i for i, a in archs.items() if a == "gfx906"]
    if not others:
        return ok(f"gfx906 on all {len(gfx906)} GPU(s)", "Radeon VII / Radeon Pro VII / Instinct MI50 / MI60 class.")
    if not gfx906:
        return warn(f"no gfx906 GPU (found {', '.join(sorted({a or '?' for a in others.values()}))})",
                    "g906 is tuned and tested for gfx906; other AMD GPUs go through the generic ROCm path.",
                    "nothing to do if this is intended; the gfx906-specific checks are skipped")
    vis_other = [g for g in ctx.visible if normalise_arch(g.get("gfx")) != "gfx906"]
    detail = "\n".join(gpu_label(g) for g in ctx.amd)
    sel = ",".join(str(i) for i in gfx906)
    if ctx.plan is not None:
        used_other = [g for g in ctx.plan_gpus() if normalise_arch(g.get("gfx")) != "gfx906"]
        if used_other and any(normalise_arch(g.get("gfx")) == "gfx906" for g in ctx.plan_gpus()):
            return fail("the recipe would mix gfx906 with " + ", ".join(sorted({normalise_arch(g.get('gfx')) or '?' for g in used_other})),
                        detail + "\nTensor parallel over different architectures does not work (different kernels, "
                        "different RCCL code objects).",
                        f"use only the gfx906 GPUs: set parallel.devices in the recipe, or export HIP_VISIBLE_DEVICES={sel}")
    if not vis_other:
        return ok(f"mixed machine; only gfx906 visible ({len(ctx.gfx906_visible)} GPU(s))", detail)
    return warn(f"mixed GPUs: gfx906 x{len(gfx906)} with " + ", ".join(sorted({a or '?' for a in others.values()})),
                detail + "\nLibraries pick kernels per architecture; a process that sees both can use the wrong one "
                "for tensor parallel and some ROCm builds refuse to start.",
                f"export HIP_VISIBLE_DEVICES={sel}  (or list the gfx906 GPUs in parallel.devices)")


@check("gpu.visibility", "System", "Visible-devices variables")
def gpu_visibility(ctx: Ctx) -> Result:
    env = ctx.facts.env
    hip, cuda, rocr = env.get("HIP_VISIBLE_DEVICES"), env.get("CUDA_VISIBLE_DEVICES"), env.get("ROCR_VISIBLE_DEVICES")
    set_vars = {k: v for k, v in (("HIP_VISIBLE_DEVICES", hip), ("CUDA_VISIBLE_DEVICES", cuda),
                                  ("ROCR_VISIBLE_DEVICES", rocr)) if v is not None}
    if not set_vars:
        return ok("not set: every GPU is visible" if (ctx.amd or ctx.nvidia) else "not set")
    shown = ", ".join(f"{k}={v}" for k, v in set_vars.items())
    if not ctx.amd:
        if ctx.nvidia or not hip:
            return ok(shown)
        return ok(shown, "No AMD GPU: the HIP variables have no effect here.")
    if hip is not None and cuda is not None and parse_visible(hip) != parse_visible(cuda):
        return warn(f"HIP_VISIBLE_DEVICES={hip} and CUDA_VISIBLE_DEVICES={cuda} disagree",
                    "HIP honours both; PyTorch, vLLM and Ray read different ones, so processes can end up on "
                    "different GPUs than you think.",
                    f"set one of them only, e.g. unset CUDA_VISIBLE_DEVICES; export HIP_VISIBLE_DEVICES={hip}")
    n = len(ctx.amd)
    for name, value in set_vars.items():
        for tok in parse_visible(value) or []:
            if tok.isdigit() and int(tok) >= n:
                return fail(f"{name}={value} names GPU {tok}, but there are only {n} GPU(s) (0..{n - 1})",
                            "HIP stops at the first invalid index; the GPUs after it are hidden too.",
                            f"export {name}=" + ",".join(str(i) for i in range(n)))
    if not ctx.visible:
        return fail(f"{shown} hides every GPU", "A HIP process would see no device and fall back to the CPU.",
                    "unset " + " ".join(set_vars))
    return ok(f"{shown}: {len(ctx.visible)} of {n} GPU(s) visible")


@check("gpu.hsa_override", "System", "HSA_OVERRIDE_GFX_VERSION")
def hsa_override(ctx: Ctx) -> Result:
    value = ctx.facts.env.get("HSA_OVERRIDE_GFX_VERSION")
    if value is None:
        return ok("not set")
    if not ctx.amd:
        return warn(f"set to {value} on a machine without AMD GPUs", fix="unset HSA_OVERRIDE_GFX_VERSION")
    parts = value.strip().split(".")
    if ctx.has_gfx906 and parts == ["9", "0", "6"]:
        return warn("set to 9.0.6: the GPU already is gfx906, the override is not needed",
                    "Overrides hide mistakes: a library without gfx906 code then fails in confusing ways.",
                    "unset HSA_OVERRIDE_GFX_VERSION")
    return fail(f"set to {value}: the runtime pretends the GPUs are a different architecture",
                "Code objects built for that architecture are loaded on gfx906 and crash or return wrong results; "
                "libraries that do have gfx906 code are bypassed.",
                "unset HSA_OVERRIDE_GFX_VERSION (in your shell, .bashrc, the service file or the recipe's [env])")


@check("gpu.busy", "System", "Other processes on the GPUs")
def gpu_busy(ctx: Ctx) -> Result:
    if not ctx.amd:
        return skip("no AMD GPU")
    procs = ctx.facts.kfd.get("processes") or []
    used = [g for g in ctx.visible if (g.get("vram_used_bytes") or 0) > 1024 ** 3]
    if not procs and not used:
        return ok("no other process uses the GPUs")
    lines = [f"pid {p['pid']} ({p.get('comm') or '?'}): {fmt_bytes(p.get('vram_bytes') or 0)} VRAM" for p in procs]
    lines += [f"{gpu_label(g)}: {fmt_bytes(g.get('vram_used_bytes'))} in use" for g in used]
    return warn(f"{len(procs)} other process(es) hold GPU memory" if procs else "VRAM already in use",
                "\n".join(lines) + "\nTheir memory is not available to g906; gpu_memory_utilization counts total VRAM.",
                "stop them (kill PID) or lower limits.gpu_memory_utilization")


@check("driver.amdgpu", "Access", "amdgpu kernel driver")
def driver_amdgpu(ctx: Ctx) -> Result:
    d = ctx.facts.driver
    if not ctx.amd and not d.get("amdgpu_loaded") and not ctx.facts.device_nodes.get("kfd", {}).get("exists"):
        return skip("no AMD GPU")
    if not d.get("amdgpu_loaded"):
        if ctx.amd:
            return ok("KFD topology present (amdgpu built into the kernel)")
        return fail("the amdgpu driver is not loaded", fix="sudo modprobe amdgpu  (and check dmesg for errors)")
    ver = d.get("amdgpu_version")
    if not ctx.facts.kfd.get("topology"):
        return fail("amdgpu is loaded but there is no KFD topology (/sys/class/kfd)",
                    "ROCm needs the KFD (the compute interface of amdgpu).",
                    "check dmesg for amdgpu/kfd errors; install the amdgpu-dkms driver of your ROCm release")
    return ok("amdgpu loaded" + (f", version {ver}" if ver else " (in-tree driver)"))


def _access(ctx: Ctx, nodes: list[dict[str, Any]], what: str) -> Result:
    user = ctx.facts.user
    missing = [n for n in nodes if not n.get("exists")]
    denied = [n for n in nodes if n.get("exists") and not (n.get("read") and n.get("write"))]
    if missing:
        return fail(f"{', '.join(n.get('path', '?') for n in missing)} missing",
                    f"ROCm opens {what}; without it no GPU is usable.",
                    "load the amdgpu driver (sudo modprobe amdgpu); in a container pass "
                    "--device=/dev/kfd --device=/dev/dri")
    if denied:
        groups = sorted({n.get("group") or "render" for n in denied})
        who = user.get("name") or f"uid {user.get('uid')}"
        pending = [g for g in groups if g in (user.get("configured_not_active") or [])]
        detail = "\n".join(f"{n.get('path', '?')}: mode {n.get('mode')}, group {n.get('group')}" for n in denied)
        detail += f"\n{who} is in: {', '.join(user.get('groups') or []) or 'no groups'}"
        if pending:
            return fail(f"no read/write access to {', '.join(n.get('path', '?') for n in denied)} (group change not active yet)",
                        detail, "log out and back in (or run: newgrp " + pending[0] + ") so the new group applies")
        return fail(f"no read/write access to {', '.join(n.get('path', '?') for n in denied)}", detail,
                    f"sudo usermod -aG {','.join(sorted(set(groups) | {'video', 'render'}))} $USER, then log out and back in")
    return ok(f"{', '.join(n.get('path', '?') for n in nodes)} readable and writable" if len(nodes) <= 2
              else f"{len(nodes)} nodes readable and writable")


@check("access.kfd", "Access", "/dev/kfd access")
def access_kfd(ctx: Ctx) -> Result:
    kfd = ctx.facts.device_nodes.get("kfd") or {"path": "/dev/kfd", "exists": False}
    if not ctx.amd and not kfd.get("exists"):
        return skip("no AMD GPU")
    return _access(ctx, [kfd], "/dev/kfd")


@check("access.render", "Access", "/dev/dri/renderD* access")
def access_render(ctx: Ctx) -> Result:
    nodes = ctx.facts.device_nodes.get("render") or []
    if not ctx.amd:
        return skip("no AMD GPU")
    if not nodes:
        return fail("no /dev/dri/renderD* node", "ROCm opens one render node per GPU.",
                    "load the amdgpu driver; in a container pass --device=/dev/dri")
    # only the nodes of the visible AMD GPUs matter (other render nodes may belong to an iGPU)
    minors = {g.get("drm_render_minor") for g in ctx.visible if g.get("drm_render_minor") is not None}
    relevant = [n for n in nodes if not minors or any(n.get("path", "").endswith(f"renderD{m}") for m in minors)]
    missing_minor = [m for m in minors if not any(n.get("path", "").endswith(f"renderD{m}") for n in nodes)]
    if missing_minor:
        return fail(f"no render node for GPU(s) with minor {', '.join(str(m) for m in sorted(missing_minor))}",
                    fix="in a container pass --device=/dev/dri (all of it)")
    return _access(ctx, relevant or nodes, "/dev/dri/renderD*")


def products() -> str:
    return ", ".join(matrix()["gfx906"]["products"])
