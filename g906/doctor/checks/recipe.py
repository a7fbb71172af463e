"""Recipe-aware checks (`g906 doctor --recipe R`, and `g906 up`'s preflight): model files, the
architecture, GGUF tensor types, mmproj, tensor parallel, known-bad combinations, memory."""

from __future__ import annotations

import json
import os
from pathlib import Path
from typing import Any

from g906.arch import ARCHITECTURES, Architecture, lookup
from g906.arch import quant
from g906.doctor import compat
from g906.doctor.checks import Ctx, Result, check, fail, ok, skip, warn
from g906.doctor.facts import normalise_arch
from g906.doctor.memory import estimate_memory, fmt_bytes


def _arch_entry(plan: Any) -> Architecture | None:
    return lookup(getattr(plan, "architecture", None))


def _is_moe(plan: Any) -> bool | None:
    entry = _arch_entry(plan)
    if entry is not None:
        return entry.moe
    facts = plan.model_facts or {}
    for k in ("num_experts", "n_routed_experts", "expert_count"):
        if isinstance(facts.get(k), int):
            return facts[k] > 0
    gg = facts.get("gguf") or {}
    if isinstance(gg.get("expert_count"), int):
        return gg["expert_count"] > 0
    arch = (getattr(plan, "architecture", "") or "").lower()
    return True if "moe" in arch else None


def _quant_bits(plan: Any) -> int | None:
    facts = plan.model_facts or {}
    for k in ("quantization_bits", "bits"):
        if isinstance(facts.get(k), int):
            return facts[k]
    path = getattr(plan, "model_path", None)
    if plan.model_format == "hf" and path is not None:
        try:
            cfg = json.loads((Path(path) / "config.json").read_text(encoding="utf-8"))
            qc = cfg.get("quantization_config") or (cfg.get("text_config") or {}).get("quantization_config") or {}
            bits = qc.get("bits") or qc.get("w_bit")
            return int(bits) if bits is not None else None
        except (OSError, ValueError, TypeError, AttributeError):
            return None
    return None


def _model_missing(plan: Any) -> str | None:
    """Why the checks that read the model's own files cannot run: the reason to skip them with
    (the Model files row has already failed for it), or None."""
    if plan.model_format == "builtin":
        return None
    missing = [Path(p) for p in (getattr(plan, "missing_files", None) or [])]
    model = getattr(plan, "model_path", None)
    first = (list(plan.model_files or []) or [model])[0]
    for p in ([model] if model is not None else []) + ([first] if first is not None else []):
        if p is not None and (Path(p) in missing or not Path(p).exists()):
            return f"skipped: the model file is missing ({p}); see Model files"
    if model is None and not plan.model_files:
        return "skipped: no model file to read"
    return None


@check("recipe.model_files", "Recipe", "Model files", needs_plan=True)
def model_files(ctx: Ctx) -> Result:
    plan = ctx.plan
    if plan is None:
        return skip("no recipe given (--recipe R)")
    if plan.model_format == "builtin":
        return ok(f"builtin model {plan.model_source}")
    files = list(plan.model_files or [])
    missing = [str(p) for p in (getattr(plan, "missing_files", None) or [])]
    unreadable = []
    total = 0
    for p in files:
        try:
            with open(p, "rb") as f:
                f.read(1)
            total += os.path.getsize(p)
        except FileNotFoundError:
            missing.append(str(p))
        except OSError as exc:
            unreadable.append(f"{p}: {exc.strerror or exc}")
    if missing:
        return fail(f"{len(set(missing))} model file(s) missing", "\n".join(sorted(set(missing))),
                    "download the missing files (all shards of a split GGUF), or fix model.source in the recipe")
    if unreadable:
        return fail(f"{len(unreadable)} model file(s) unreadable", "\n".join(unreadable),
                    "fix the file permissions (chmod a+r) or run g906 as a user that can read them")
    return ok(f"{len(files)} file(s), {fmt_bytes(total)}", str(plan.model_path or plan.model_source))


@check("recipe.architecture", "Recipe", "Model architecture", needs_plan=True)
def architecture(ctx: Ctx) -> Result:
    plan = ctx.plan
    if plan is None:
        return skip("no recipe given")
    if plan.model_format == "builtin":
        return ok("builtin synthetic model")
    if plan.architecture is None and (reason := _model_missing(plan)):
        return skip(reason)
    entry = _arch_entry(plan)
    if entry is None:
        return fail(f"architecture {plan.architecture!r} is not supported",
                    "Known: " + ", ".join(a.name for a in ARCHITECTURES),
                    "use a Qwen3.5 model (qwen35) or hand over to vLLM with engine.kind = \"vllm\"")
    if plan.engine_kind == "embedded" and not entry.embedded:
        return fail(f"{entry.name} is not run by the embedded engine yet",
                    fix="set engine.kind = \"vllm\" in the recipe (vLLM handoff)")
    return ok(f"{entry.name}" + (" (MoE)" if entry.moe else ""))


@check("recipe.gguf_types", "Recipe", "GGUF tensor types", needs_plan=True)
def gguf_types(ctx: Ctx) -> Result:
    plan = ctx.plan
    if plan is None:
        return skip("no recipe given")
    if plan.model_format != "gguf":
        return skip("not a GGUF model")
    types = dict(plan.gguf_tensor_types or {})
    if not types and (reason := _model_missing(plan)):
        return skip(reason)
    if not types:
        return warn("no tensor types known for this GGUF", fix="check that the GGUF file is complete")
    supported = set(quant.gguf_types())
    bad = {t: n for t, n in types.items() if t not in supported}
    listing = ", ".join(f"{t} x{n}" for t, n in sorted(types.items()))
    experts = (plan.model_facts or {}).get("expert_types")
    if isinstance(experts, dict) and experts:   # MoE: what the routed-expert kernels read
        listing += "; routed experts: " + ", ".join(f"{t} x{n}" for t, n in sorted(experts.items()))
        slow = sorted(t for t in experts if t in supported and t not in quant.fused_types())
        if slow and plan.engine_kind == "embedded":
            listing += (f" ({', '.join(slow)}: no fused expert kernel, the chosen experts are dequantized "
                        "each step: slower)")
    if bad and plan.engine_kind == "embedded":
        return fail(f"tensor type(s) the embedded engine does not support: {', '.join(sorted(bad))}",
                    listing + "\nsupported: " + ", ".join(sorted(supported)),
                    "use a quantization made of supported types (Q4_K_M, Q5_K_M, Q6_K, Q8_0...), "
                    "or engine.kind = \"vllm\"")
    return ok(listing)


@check("recipe.mmproj", "Recipe", "Vision projector (mmproj)", needs_plan=True)
def mmproj(ctx: Ctx) -> Result:
    plan = ctx.plan
    if plan is None:
        return skip("no recipe given")
    if not getattr(plan, "images_enabled", False):
        return skip("images are not enabled (multimodal.image)")
    if plan.model_format == "gguf":
        p = plan.mmproj_path
        if p is None:
            return fail("multimodal.image is set but no mmproj GGUF was found",
                        "Images need the vision projector (mmproj-*.gguf) beside the model.",
                        "download the model's mmproj file next to the GGUF (or set model.mmproj = PATH), "
                        "or remove multimodal.image")
        if not Path(p).is_file():
            return fail(f"mmproj {p} does not exist", fix="download it, or fix model.mmproj")
        return ok(str(p))
    if plan.model_format == "hf":
        facts = plan.model_facts or {}
        if facts.get("multimodal") is False:
            return fail("multimodal.image is set but this checkpoint has no vision tower",
                        fix="use the multimodal checkpoint, or remove multimodal.image")
        return ok("vision tower in the checkpoint")
    return skip("builtin model")


@check("recipe.tensor_parallel", "Recipe", "Tensor parallel and devices", needs_plan=True)
def tensor_parallel(ctx: Ctx) -> Result:
    plan = ctx.plan
    if plan is None:
        return skip("no recipe given")
    tp = ctx.tp
    dev = ctx.target_device
    devices = list(plan.devices) if plan.devices else None
    if dev == "cpu":
        if tp > 1:   # the embedded engine runs TP over gloo on the CPU: correct, but only for testing
            return warn(f"tensor_parallel_size={tp} with no GPU: {tp} CPU processes over gloo (a test setup, no speed-up)",
                        fix="set parallel.tensor_parallel_size = 1 unless you are testing tensor parallelism")
        return ok("one device (CPU)")
    if dev == "cuda":
        n = int(ctx.torch.get("device_count") or 0) or len(ctx.facts.nvidia.get("gpus") or [])
    else:
        n = len(ctx.visible)
    if devices:
        out = [d for d in devices if d >= n]
        if out:
            return fail(f"parallel.devices {devices} names GPU(s) {out}, but only {n} are visible (0..{n - 1})",
                        fix="fix parallel.devices, or HIP_VISIBLE_DEVICES")
    if tp > n:
        return fail(f"tensor_parallel_size={tp} needs {tp} GPUs; {n} visible",
                    fix=f"lower parallel.tensor_parallel_size to {max(1, n)} or make more GPUs visible")
    if dev == "rocm" and tp > 1:
        archs = {normalise_arch(g.get("gfx")) for g in ctx.plan_gpus()}
        if len(archs) > 1:
            return fail("the tensor-parallel GPUs have different architectures: " + ", ".join(sorted(a or "?" for a in archs)),
                        fix="list GPUs of one architecture in parallel.devices")
    return ok(f"TP={tp} on GPU(s) " + ",".join(str(i) for i in (devices or range(tp))) + f" of {n}")


@check("recipe.known_bad", "Recipe", "Known-bad combinations", needs_plan=True)
def known_bad(ctx: Ctx) -> Result:
    plan = ctx.plan
    if plan is None:
        return skip("no recipe given")
    arch = ctx.target_arch if ctx.target_device == "rocm" else None
    dtype = plan.dtype
    hits = compat.known_bad(arch=arch, moe=_is_moe(plan), quantization=plan.quantization, bits=_quant_bits(plan),
                            dtype=dtype, engine=plan.engine_kind)
    if not hits:
        return ok("none apply" + (f" on {arch}" if arch else ""))
    worst = fail if any(h.status == "fail" for h in hits) else warn
    first = next(h for h in hits if h.status == ("fail" if worst is fail else "warn"))
    return worst(f"{first.id}: {first.reason}",
                 "\n".join(f"[{h.status}] {h.id}: {h.reason}" for h in hits),
                 "; ".join(h.fix for h in hits), ids=[h.id for h in hits])


@check("recipe.memory", "Recipe", "Memory per device", needs_plan=True)
def memory(ctx: Ctx) -> Result:
    plan = ctx.plan
    if plan is None:
        return skip("no recipe given")
    dev = ctx.target_device
    if plan.model_format == "builtin" and not plan.model_facts:
        return ok("builtin synthetic model: a few MiB")
    if reason := _model_missing(plan):      # no sizes to estimate from (it would say "about 0 KiB")
        return skip(reason)
    if dev == "rocm":
        gpus = ctx.plan_gpus()
        caps = [int(g.get("vram_bytes") or 0) or None for g in gpus]
        tdevs = ctx.torch.get("devices") or []
        for i, c in enumerate(caps):
            if c is None and i < len(tdevs):
                caps[i] = tdevs[i].get("total_memory")
        labels: list[Any] = [g.get("index") for g in gpus]
    elif dev == "cuda":
        tdevs = ctx.torch.get("devices") or []
        idx = list(plan.devices) if plan.devices else list(range(ctx.tp))
        caps = [tdevs[i].get("total_memory") if i < len(tdevs) else None for i in idx]
        labels = idx
    else:
        caps = [ctx.facts.memory.get("total_bytes")]
        labels = ["cpu"]
    if not labels:
        return skip("no device to place the model on")
    est = estimate_memory(plan, device_kind=dev, capacities=[c or 0 for c in caps] if all(caps) else None,
                          arch=ctx.target_arch, devices=labels)
    header = f"{'device':>6}  {'weights':>9}  {'KV cache':>9}  {'lin.state':>9}  {'activ.':>9}  {'total':>9}  {'budget':>9}"
    rows = [header]
    for d in est.per_device:
        rows.append(f"{str(d.device):>6}  {fmt_bytes(d.weights):>9}  {fmt_bytes(d.kv_cache):>9}  "
                    f"{fmt_bytes(d.linear_state + d.prefix_snapshots):>9}  {fmt_bytes(d.activations + d.overhead):>9}  "
                    f"{fmt_bytes(d.total):>9}  {fmt_bytes(d.budget):>9}")
    util = plan.gpu_memory_utilization
    ctx_desc = f"max_model_len {est.max_model_len} x max_num_seqs {est.max_num_seqs}, {est.dtype}, TP={est.tensor_parallel_size}"
    detail = "\n".join(rows) + "\n" + ctx_desc + ("\n" + "\n".join(est.assumptions) if est.assumptions else "")
    data = {"estimate": est.to_json()}
    worst = max(est.per_device, key=lambda d: d.total)
    if est.fits is None:
        return warn(f"needs about {fmt_bytes(worst.total)} per device; device memory unknown", detail,
                    "compare with your GPUs' memory (rocm-smi --showmeminfo vram / nvidia-smi)", **data)
    if est.fits:
        return ok(f"about {fmt_bytes(worst.total)} of {fmt_bytes(worst.budget)} per device", detail, **data)
    over = worst.total - (worst.budget or 0)
    kv_share = worst.kv_cache / worst.total if worst.total else 0
    hint = []
    if kv_share > 0.3:
        hint.append("lower limits.max_model_len or limits.max_num_seqs (the KV cache is "
                    f"{fmt_bytes(worst.kv_cache)})")
    if dev != "cpu":
        if ctx.tp < max(1, len(ctx.visible)):
            hint.append("raise parallel.tensor_parallel_size")
        if util < 0.95:
            hint.append("raise limits.gpu_memory_utilization (now " + str(util) + ")")
    hint.append("or use a smaller quantization of the model")
    where = "RAM" if dev == "cpu" else f"{'VRAM' } x {util}"
    sev = warn if dev == "cpu" else fail
    return sev(f"does not fit: needs about {fmt_bytes(worst.total)} per device, {fmt_bytes(worst.budget)} available "
               f"({where}; {fmt_bytes(over)} over)", detail, "; ".join(hint), **data)
