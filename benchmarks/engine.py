#!/usr/bin/env python
"""The engine's figures against the hardware limit and the issue's targets, in one run.

    python benchmarks/engine.py --out "$OUT"            # the full table (H200: a few minutes)
    python benchmarks/engine.py --quick --device cpu    # the same code paths on tiny shapes

Rows (random weights of the real Qwen3.5 shapes, built on the device by g906.bench.synthetic):
  9B F16 / Q8_0 / Q4_K (llama.cpp's Q4_K_M mix) and 0.8B F16: batch-1 decode of 128 tokens after
  a 512-token prompt, as % of the copy-bandwidth limit (weight bytes read per token);
  9B F16 prefill of 512 and of 2048 tokens (own prompts, after the decode row), as % of the
  measured fp16 matmul rate;
  9B F16, 64 concurrent requests of 512 prompt / 256 output tokens (output tok/s).
transformers runs the same random weights (9B F16 and 0.8B F16, batch 1) for the ratio; it
cannot run the GGUF-quantized rows. Each decode row also gets two kernel profiles (where the time
goes): of a few eager steps, and of graph-replayed steps as the engine decodes (each kernel's time
on the critical path, PDL overlap counted once: kernel_timeline). The table is printed at the end; everything (with the date, GPU,
versions and commit) goes to OUT/engine.json (--out is a directory or a .json path; $OUT is
used when set).
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import time
import traceback
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

import torch  # noqa: E402

from g906.bench.bandwidth import measure_copy_bandwidth, measure_matmul_flops  # noqa: E402
from g906.bench.metrics import LengthSpec, Workload  # noqa: E402
from g906.bench.offline import make_engine, run_offline  # noqa: E402
from g906.bench.run_record import environment, free, log, out_path  # noqa: E402
from g906.bench.synthetic import build_synthetic  # noqa: E402
from g906.engine.synthetic import shape_config  # noqa: E402
from g906.engine.model_runner import DEFAULT_PREFILL_GRAPH_TOKENS  # noqa: E402

# the figures (H200, 2026-11-30)
LLAMA_CPP = {"9b-f16-decode": 182.7, "9b-q8_0-decode": 221.7, "9b-q4_k-decode": 236.0, "0.8b-f16-decode": 517.1,
             "9b-f16-prefill512": 16483.0}
TARGETS = {"9b-f16-decode": 225.0, "9b-q8_0-decode": 350.0, "9b-q4_k-decode": 500.0, "0.8b-f16-decode": 1100.0,
           "9b-f16-prefill512": 20000.0, "9b-f16-prefill2048": None, "9b-f16-c64": 4000.0}

QUICK_SHAPE = dict(num_hidden_layers=4, hidden_size=256, intermediate_size=512, vocab_size=2048,
                   num_attention_heads=2, num_key_value_heads=1, head_dim=64, linear_num_key_heads=2,
                   linear_num_value_heads=4, linear_key_head_dim=32, linear_value_head_dim=32)


def matmul_flops_per_token(loaded, context: int) -> float:
    """FLOPs of one prefill token: 2 x the matrix parameters run per token (all but the embedding
    and the LM head, which prefill runs for the last token only) + causal attention over
    `context` tokens (QK^T and PV, half the context on average)."""
    info = loaded.info
    c = loaded.config
    w = info["weight_bytes"] - info["embedding_bytes"]
    if c.tie_word_embeddings is False:
        w -= info["embedding_bytes"]            # the LM head has the embedding's size (dense rows)
    params = w / 2                              # dense fp16 rows (prefill rows are F16 only)
    attn = len(c.full_attention_layers) * 2 * 2 * c.num_attention_heads * c.head_dim * (context / 2)
    return 2 * params + attn


def profile_decode(engine, steps: int = 8, top: int = 15) -> dict:
    """Kernel times of `steps` eager decode steps of one running request (graphs off for the
    profile so the kernels show): the top kernels, GPU-busy vs wall time per step."""
    from g906.engine.sampling_params import SamplingParams

    dev = torch.device(str(engine.loaded.info.get("device", "cpu")))
    graphs = getattr(engine.runner, "graphs", None)
    saved = graphs.use_graphs if graphs is not None else None
    if graphs is not None:
        graphs.use_graphs = False
    vocab = engine.model_config.vocab_size
    engine.add_request("__profile", [(17 * i + 3) % vocab for i in range(64)],
                       SamplingParams(temperature=0, max_tokens=steps + 4, ignore_eos=True))
    engine.step()                                # prefill
    engine.step()
    engine.step()
    acts = [torch.profiler.ProfilerActivity.CPU]
    if dev.type == "cuda":
        acts.append(torch.profiler.ProfilerActivity.CUDA)
        torch.cuda.synchronize(dev)
    t0 = time.perf_counter()
    with torch.profiler.profile(activities=acts) as prof:
        for _ in range(steps):
            engine.step()
    wall = (time.perf_counter() - t0) / steps
    while engine.has_unfinished_requests():
        engine.step()
    if graphs is not None:
        graphs.use_graphs = saved
    ka = prof.key_averages()
    attr = "self_device_time_total" if hasattr(ka[0], "self_device_time_total") else "self_cuda_time_total"
    kernels = [e for e in ka if getattr(e, attr, 0) > 0]
    kernels.sort(key=lambda e: getattr(e, attr), reverse=True)
    busy = sum(getattr(e, attr) for e in kernels) / 1e6 / steps
    rows = [{"name": e.key[:90], "us_per_step": round(getattr(e, attr) / steps, 1),
             "calls_per_step": round(e.count / steps, 1)} for e in kernels[:top]]
    return {"eager_wall_ms_per_step": round(1e3 * wall, 3), "gpu_busy_ms_per_step": round(1e3 * busy, 3),
            "kernels": rows}


def kernel_timeline(events: list[dict], steps: int, top: int = 20) -> dict:
    """Per kernel (name and grid), its time on the critical path of `steps` decode steps: from
    the end of the kernel before it to its own end. Under PDL a kernel starts while the one
    before it finishes, so its own duration counts that overlap twice; this does not, and the
    gaps between steps (the host's) go to the step's first kernel. events: chrome-trace kernel
    events (ts, dur in µs, args.grid)."""
    evs = sorted(events, key=lambda e: e["ts"])
    per: dict[str, list[float]] = {}
    prev_end = None
    for e in evs:
        end = e["ts"] + e["dur"]
        name = f"{e['name'][:60]} {e.get('args', {}).get('grid', '')}".strip()
        eff = end - (e["ts"] if prev_end is None else min(prev_end, end))
        prev_end = end if prev_end is None else max(prev_end, end)
        per.setdefault(name, []).append(eff)
    span = (prev_end - evs[0]["ts"]) / steps if evs else 0.0
    rows = [{"name": k, "us_per_step": round(sum(v) / steps, 1), "calls_per_step": round(len(v) / steps, 1),
             "us_per_call": round(sum(v) / len(v), 2)} for k, v in per.items()]
    rows.sort(key=lambda r: -r["us_per_step"])
    return {"us_per_step": round(span, 1), "kernels_per_step": round(len(evs) / steps, 1), "kernels": rows[:top]}


def profile_graph_decode(engine, steps: int = 8) -> dict:
    """kernel_timeline of `steps` decode steps as the engine runs them (graph replays, PDL)."""
    import tempfile

    from g906.engine.sampling_params import SamplingParams

    dev = torch.device(str(engine.loaded.info.get("device", "cpu")))
    vocab = engine.model_config.vocab_size
    engine.add_request("__graph_profile", [(13 * i + 5) % vocab for i in range(64)],
                       SamplingParams(temperature=0, max_tokens=steps + 8, ignore_eos=True))
    for _ in range(4):                           # prefill, then decode steps out of the window
        engine.step()
    acts = [torch.profiler.ProfilerActivity.CPU]
    if dev.type == "cuda":
        acts.append(torch.profiler.ProfilerActivity.CUDA)
        torch.cuda.synchronize(dev)
    with torch.profiler.profile(activities=acts) as prof:
        for _ in range(steps):
            engine.step()
        if dev.type == "cuda":
            torch.cuda.synchronize(dev)
    while engine.has_unfinished_requests():
        engine.step()
    with tempfile.TemporaryDirectory() as d:
        path = os.path.join(d, "trace.json")
        prof.export_chrome_trace(path)
        with open(path) as f:
            trace = json.load(f)
    kernels = [e for e in trace.get("traceEvents", []) if e.get("cat") == "kernel"]
    return kernel_timeline(kernels, steps)


def run_rows(args, device: torch.device, out: dict, save) -> None:
    """The groups in priority order; each adds its rows and saves the JSON, and a group that
    would start after the time budget is skipped (recorded as such)."""
    quick = args.quick
    ov = QUICK_SHAPE if quick else None
    P, O, P2, N64, O64 = (32, 16, 64, 4, 8) if quick else (512, 128, 2048, 64, 256)
    hf_new = 8 if quick else 32
    rows = out["rows"]
    bw = out["copy_bandwidth_bytes_s"]
    mm = out["matmul_flops_s"]
    t_start = time.perf_counter()

    def add(row_id, label, value, unit, *, limit=None, pct=None, detail=None, error=None):
        t = TARGETS.get(row_id)
        llama = LLAMA_CPP.get(row_id)
        row = {"id": row_id, "label": label, "value": value, "unit": unit, "target": t,
               "llama_cpp": llama, "limit": limit, "pct_of_limit": pct, "transformers": None,
               "ratio_transformers": None,
               "ratio_llama_cpp": (round(value / llama, 2) if value and llama else None),
               "error": error, "detail": detail}
        if row_id == "9b-f16-prefill2048":
            row["target"] = "50% of fp16 matmul"
            row["met"] = None if pct is None else pct >= 50.0
        else:
            row["met"] = None if (value is None or t is None or quick) else value >= t
        rows.append(row)
        save()
        log(f"{label}: {value} {unit}" + (f" ({pct}% of limit)" if pct is not None else "")
            + (f" ERROR {error}" if error else ""))

    def decode_row(row_id, label, loaded, engine):
        wl = Workload(num_requests=2, prompt_len=LengthSpec(P, P), output_len=LengthSpec(O, O), concurrency=1)
        res = run_offline(engine, wl)
        bpt = loaded.info["bytes_per_token"]
        limit = bw / bpt
        dec = res["decode_tok_s"]
        prof = None
        if not args.no_profile:
            try:
                prof = profile_decode(engine)
                prof["graphs"] = profile_graph_decode(engine)
            except Exception as exc:           # a profile is a bonus, never a failure
                prof = {"error": f"{type(exc).__name__}: {exc}"}
        add(row_id, label, dec, "tok/s", limit=round(limit, 1), pct=round(100 * dec / limit, 1),
            detail={"run": res, "bytes_per_token": bpt, "weight_bytes": loaded.info["weight_bytes"],
                    "profile": prof})
        return res

    def g_9b_f16():
        loaded = build_synthetic("qwen3.5-9b", quant="f16", device=device, overrides=ov)
        wl1 = Workload(num_requests=1, prompt_len=LengthSpec(P2, P2), output_len=LengthSpec(O, O), concurrency=1)
        engine = make_engine(loaded, wl1, max_num_seqs=1, max_model_len=P2 + O + 64, max_num_batched_tokens=P2,
                             prefill_graph_tokens=args.prefill_graphs)
        res = decode_row("9b-f16-decode", "9B F16 decode b=1", loaded, engine)
        fpt = matmul_flops_per_token(loaded, P)
        # prefill measured like the 2048 row: its own prompts, after the decode row has kept the
        # GPU busy. The decode row's two prompts come right after the short warm-up, and the
        # first of them ran at half speed on the H200 (2026-11-30: 43-47 ms per 512-token step
        # until the GPU had run steadily for a while, then 22-25 ms); kept in the detail
        wl0 = Workload(num_requests=4, prompt_len=LengthSpec(P, P), output_len=LengthSpec(1, 1), concurrency=1)
        r0 = run_offline(engine, wl0)
        pre = r0["prefill_tok_s"]
        add("9b-f16-prefill512", f"9B F16 prefill {P}", pre, "tok/s", pct=round(100 * pre * fpt / mm, 1),
            detail={"run": r0, "flops_per_token": fpt, "achieved_tflops": round(pre * fpt / 1e12, 1),
                    "decode_row_prefill_tok_s": res["prefill_tok_s"]})
        pg = getattr(engine.runner, "prefill_graphs", None)
        if pg is not None and pg.use_graphs:      # the runner's own eager prefill, same process
            engine.runner.prefill_graphs = None
            r = run_offline(engine, wl0, warm=False)
            engine.runner.prefill_graphs = pg
            out["eager_vs_graphs"]["9b-f16-prefill512-eager"] = r["prefill_tok_s"]
        wl2 = Workload(num_requests=2, prompt_len=LengthSpec(P2, P2), output_len=LengthSpec(1, 1), concurrency=1)
        r2 = run_offline(engine, wl2)
        fpt2 = matmul_flops_per_token(loaded, P2)
        pre2 = r2["prefill_tok_s"]
        add("9b-f16-prefill2048", f"9B F16 prefill {P2}", pre2, "tok/s", pct=round(100 * pre2 * fpt2 / mm, 1),
            detail={"run": r2, "flops_per_token": fpt2, "achieved_tflops": round(pre2 * fpt2 / 1e12, 1)})

    def g_decode(shape, quant, row_id, label):
        def run():
            loaded = build_synthetic(shape, quant=quant, device=device, overrides=ov)
            wl = Workload(num_requests=1, prompt_len=LengthSpec(P, P), output_len=LengthSpec(O, O), concurrency=1)
            engine = make_engine(loaded, wl, max_num_seqs=1, max_model_len=P + O + 64, max_num_batched_tokens=P,
                                 prefill_graph_tokens=args.prefill_graphs)
            decode_row(row_id, label, loaded, engine)
            graphs = getattr(engine.runner, "graphs", None)
            if row_id.startswith("0.8b") and graphs is not None and graphs.use_graphs:
                graphs.use_graphs = False
                r = run_offline(engine, wl, warm=False)
                graphs.use_graphs = True
                out["eager_vs_graphs"][row_id + "-eager"] = r["decode_tok_s"]
        return run

    def g_c64():
        loaded = build_synthetic("qwen3.5-9b", quant="f16", device=device, overrides=ov)
        wl3 = Workload(num_requests=N64, prompt_len=LengthSpec(P, P), output_len=LengthSpec(O64, O64),
                       concurrency=N64)
        engine = make_engine(loaded, wl3, max_num_seqs=N64, max_model_len=P + O64 + 32,
                             max_num_batched_tokens=max(P2, 8 * P), prefill_graph_tokens=args.prefill_graphs)
        r3 = run_offline(engine, wl3)
        c = loaded.config
        ctx_avg = P + O64 / 2
        kv = N64 * ctx_avg * len(c.full_attention_layers) * 2 * c.num_key_value_heads * c.head_dim * 2
        state = N64 * 2 * engine.runner.sizing.state_bytes_per_slot
        step_s = max((loaded.info["bytes_per_token"] + kv + state) / bw,
                     N64 * 2 * (loaded.info["bytes_per_token"] / 2) / mm)
        lim = N64 / step_s
        add("9b-f16-c64", f"9B F16 {N64} x {P}/{O64}", r3["output_tok_s"], "out tok/s", limit=round(lim, 1),
            pct=round(100 * r3["output_tok_s"] / lim, 1),
            detail={"run": r3, "limit_model": "weights + KV (avg context) + GDN state read/write per step, "
                                              "or 2 FLOP/param/token at the matmul rate"})

    def g_hf():
        from g906.bench.hf import build_hf_model, hf_generate_bench

        for key, shape in (("0.8b-f16", "qwen3.5-0.8b"), ("9b-f16", "qwen3.5-9b")):
            if time.perf_counter() - t_start > args.budget_s:
                out["transformers"][key] = {"skipped": "time budget"}
                continue
            try:
                log(f"transformers {key}")
                hf = build_hf_model(shape_config(shape, ov), device=device, dtype=torch.float16
                                    if device.type == "cuda" else torch.float32)
                res = hf_generate_bench(hf, prompt_len=P, new_tokens=hf_new)
                del hf
            except Exception as exc:
                traceback.print_exc()
                res = {"error": f"{type(exc).__name__}: {exc}"}
            free()
            out["transformers"][key] = res
            for r in rows:
                if r["id"] == f"{key}-decode" and res.get("decode_tok_s"):
                    r["transformers"] = res["decode_tok_s"]
                elif r["id"] == f"{key}-prefill512" and res.get("prefill_tok_s"):
                    r["transformers"] = res["prefill_tok_s"]
                else:
                    continue
                r["ratio_transformers"] = round(r["value"] / r["transformers"], 2) if r["value"] else None
            save()

    groups = {
        "9b-f16": (g_9b_f16, "9b-f16-decode", "9B F16"),
        "0.8b-f16": (g_decode("qwen3.5-0.8b", "f16", "0.8b-f16-decode", "0.8B F16 decode b=1"),
                     "0.8b-f16-decode", "0.8B F16"),
        "9b-q4_k": (g_decode("qwen3.5-9b", "q4_k", "9b-q4_k-decode", "9B Q4_K decode b=1"), "9b-q4_k-decode",
                    "9B Q4_K"),
        "9b-q8_0": (g_decode("qwen3.5-9b", "q8_0", "9b-q8_0-decode", "9B Q8_0 decode b=1"), "9b-q8_0-decode",
                    "9B Q8_0"),
        "9b-f16-c64": (g_c64, "9b-f16-c64", "9B F16 x64"),
    }
    for name in args.groups:
        if name == "hf":
            if not args.no_hf:
                g_hf()
            continue
        fn, row_id, label = groups[name]
        if time.perf_counter() - t_start > args.budget_s:
            add(row_id, label, None, "", error="skipped: time budget")
            continue
        log(f"group {name}")
        try:
            fn()
        except Exception as exc:
            traceback.print_exc()
            add(row_id, label, None, "", error=f"{type(exc).__name__}: {exc}")
        free()


GEMV_KEYS = {"BLOCK_N": int, "num_warps": int, "SPLIT": int, "PAIRS": int, "PREFETCH": bool,
             "WSPLIT": bool, "PRELOAD": bool}


def parse_gemv_config(spec: str) -> tuple[tuple[str, int, int], dict]:
    """'Q4_K:4096x4096:BLOCK_N=4,num_warps=2' -> (("Q4_K", 4096, 4096), {...}): the batch-1
    packed GEMV config of one weight type and shape (rows x in-features; kernel.py
    _pq_gemv_config's keys). ValueError naming what is wrong."""
    parts = spec.split(":")
    if len(parts) != 3:
        raise ValueError(f"{spec!r}: expected QTYPE:NxK:KEY=VALUE[,KEY=VALUE...]")
    qtype, shape, kvs = parts
    from g906.kernels.linear.packed_fields import PQ_QTYPES

    if qtype not in PQ_QTYPES:
        raise ValueError(f"{spec!r}: unknown packed type {qtype!r} (one of {', '.join(PQ_QTYPES)})")
    try:
        n, k = (int(v) for v in shape.lower().split("x"))
    except ValueError:
        raise ValueError(f"{spec!r}: shape {shape!r} is not ROWSxIN (e.g. 4096x4096)") from None
    cfg = {}
    for kv in filter(None, kvs.split(",")):
        key, _, val = kv.partition("=")
        if key not in GEMV_KEYS or not val:
            raise ValueError(f"{spec!r}: {kv!r} is not KEY=VALUE with KEY one of {', '.join(GEMV_KEYS)}")
        if GEMV_KEYS[key] is bool:
            if val.lower() not in ("0", "1", "true", "false"):
                raise ValueError(f"{spec!r}: {key} takes true/false or 1/0, not {val!r}")
            cfg[key] = val.lower() in ("1", "true")
        else:
            try:
                cfg[key] = int(val)
            except ValueError:
                raise ValueError(f"{spec!r}: {key} takes an integer, not {val!r}") from None
    return (qtype, n, k), cfg


def apply_gemv_configs(table: dict) -> None:
    """The engine's batch-1 packed GEMVs of these (qtype, rows, in-features) take these configs
    (an in-engine sweep: a GEMV's best config alone is not always its best among the step's
    kernels, docs/PERF.md E20)."""
    from g906.kernels.linear import packed_config as K

    base = getattr(K._pq_gemv_config, "__wrapped__", K._pq_gemv_config)

    def config(T, N, Kd, qtype, device):
        c = base(T, N, Kd, qtype, device)
        if T == 1:
            c.update(table.get((qtype, N, Kd), {}))
        return c

    config.__wrapped__ = base
    K._pq_gemv_config = config


def fmt(x, spec="{:,.0f}") -> str:
    if x is None:
        return "—"
    if isinstance(x, str):
        return x
    return spec.format(x)


def table(out: dict) -> str:
    head = ["row", "g906", "target", "llama.cpp", "limit", "% limit", "transformers", "× tf", "× llama", "met"]
    lines = ["| " + " | ".join(head) + " |", "|" + "---|" * len(head)]
    for r in out["rows"]:
        met = "—" if r.get("met") is None else ("yes" if r["met"] else "NO")
        if r.get("error"):
            met = "error"
        lines.append("| " + " | ".join([
            r["label"], fmt(r["value"]) + (" " + r["unit"] if r["value"] is not None else ""), fmt(r["target"]),
            fmt(r["llama_cpp"]), fmt(r["limit"]), fmt(r["pct_of_limit"], "{:.1f}%"),
            fmt(r["transformers"], "{:,.1f}"), fmt(r["ratio_transformers"], "{:.1f}×"),
            fmt(r["ratio_llama_cpp"], "{:.2f}×"), met]) + " |")
    return "\n".join(lines)


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--out", default=os.environ.get("OUT"), help="directory or .json file for the results")
    ap.add_argument("--device", default=None, help="default: cuda when present, else cpu")
    ap.add_argument("--quick", action="store_true", help="tiny shapes and lengths (a smoke run of every path)")
    ap.add_argument("--no-hf", action="store_true", help="skip transformers")
    ap.add_argument("--no-profile", action="store_true", help="skip the kernel profiles")
    ap.add_argument("--groups", default="9b-f16,0.8b-f16,9b-q4_k,9b-q8_0,9b-f16-c64,hf",
                    help="comma-separated, run in this order: 9b-f16 (decode, prefill 512/2048), 0.8b-f16, "
                         "9b-q4_k, 9b-q8_0, 9b-f16-c64 (64 concurrent), hf (transformers)")
    ap.add_argument("--budget-s", type=float, default=float(os.environ.get("G906_BENCH_BUDGET_S", 330)),
                    help="start no new group after this many seconds (default 330)")
    ap.add_argument("--prefill-graphs", type=int, default=DEFAULT_PREFILL_GRAPH_TOKENS, metavar="N",
                    help="replay prefill steps of up to N tokens from graphs (default: the engine's, "
                         f"{DEFAULT_PREFILL_GRAPH_TOKENS}; 0: eager prefill; the 9B prefill row also runs eager, for "
                         "comparison)")
    ap.add_argument("--gemv-config", action="append", default=[], metavar="QTYPE:NxK:KEY=VALUE,...",
                    help="the batch-1 packed GEMV config of a weight type and shape, e.g. "
                         "Q4_K:4096x4096:BLOCK_N=4,num_warps=2 (keys: " + ", ".join(GEMV_KEYS) + "); repeatable")
    args = ap.parse_args(argv)
    if args.prefill_graphs < 0:
        ap.error(f"--prefill-graphs must be 0 or more, not {args.prefill_graphs}")
    try:
        gemv_configs = dict(parse_gemv_config(spec) for spec in args.gemv_config)
    except ValueError as exc:
        ap.error(f"--gemv-config {exc}")
    if gemv_configs:
        apply_gemv_configs(gemv_configs)
    args.groups = [g.strip() for g in args.groups.split(",") if g.strip()]
    device = torch.device(args.device or ("cuda" if torch.cuda.is_available() else "cpu"))
    t0 = time.perf_counter()
    out = {"env": environment(device, ROOT), "quick": args.quick, "prefill_graph_tokens": args.prefill_graphs,
           "gemv_configs": args.gemv_config, "rows": [], "transformers": {}, "eager_vs_graphs": {}}
    log(f"device {out['env'].get('gpu', device)}; measuring copy bandwidth and the fp16 matmul rate")
    out["copy_bandwidth_bytes_s"] = measure_copy_bandwidth(device)
    out["matmul_flops_s"] = measure_matmul_flops(device)
    log(f"copy {out['copy_bandwidth_bytes_s'] / 1e9:,.0f} GB/s, matmul {out['matmul_flops_s'] / 1e12:,.1f} TFLOP/s")
    path = out_path(args.out, "engine.json")

    def save() -> None:
        out["seconds"] = round(time.perf_counter() - t0, 1)
        out["table_markdown"] = table(out)
        if path is not None:
            path.write_text(json.dumps(out, indent=2, default=str))

    try:
        run_rows(args, device, out, save)
    finally:
        save()
        text = out["table_markdown"]
        if path is not None:
            log(f"wrote {path}")
        env = out["env"]
        print(f"\ng906 engine benchmark — {env['date']}, {env.get('gpu', env['device'])}, commit {env.get('commit')}; "
              f"copy {out['copy_bandwidth_bytes_s'] / 1e9:,.0f} GB/s, fp16 matmul "
              f"{out['matmul_flops_s'] / 1e12:,.1f} TFLOP/s; {out['seconds']} s")
        print(text)
        for k, v in out["eager_vs_graphs"].items():
            print(f"{k}: {v} tok/s (eager, for comparison)")
        for k, v in out["transformers"].items():
            if isinstance(v, dict):
                print(f"transformers {k}: {json.dumps({x: v.get(x) for x in ('prefill_tok_s', 'decode_tok_s', 'fast_path', 'error') if x in v})}")
    return 0 if all(not r.get("error") for r in out["rows"]) else 1


if __name__ == "__main__":
    sys.exit(main())
