#!/usr/bin/env python
"""Tensor parallel over two GPUs against one GPU and llama.cpp's split modes, the same files, in
one run (the two-GPU issue's table).

    python benchmarks/tp_versus_llama_cpp.py --out "$OUT"                    # a two-GPU machine
    python benchmarks/tp_versus_llama_cpp.py --quick --device cpu --llama-bin DIR   # gloo dry run

Per file (9B F16, 27B Q4_K_M, 35B-A3B Q4_K_M; random weights of the real shapes written by
g906.bench.gguf_out): g906 at TP=1 (when it fits one GPU) and TP=2, batch-1 decode tg128 after a
512-token prompt and 64 concurrent requests of 512 / 128 (offline engine, decode graphs as the
engine takes them); llama.cpp's llama-bench and llama-batched-bench with `-sm layer` and
`-sm row` on the same file. First, TP=2 against TP=1 at the 9B shape: greedy tokens and the
logits' largest difference (tests/parallel/gpu_tp_check.py correct, fp32 reference ops).

Limits: TP=2 decode reads half the weights per GPU, so its limit is twice one GPU's (copy rate /
bytes per token); the all-reduces cost the rest. Goals (the issue): 9B F16 TP=2 batch 1 >= 1.6x
TP=1 and ahead of llama.cpp's best split mode on every row; 64 concurrent TP=2 >= 1.7x TP=1.
llama.cpp is found or built as benchmarks/versus_llama_cpp.py does (.llama/). Results:
OUT/tp-versus-llama-cpp.json."""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import time
import traceback
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))
sys.path.insert(0, str(ROOT / "benchmarks"))

import torch  # noqa: E402

import versus_llama_cpp as vs  # noqa: E402
from g906.bench.bandwidth import measure_copy_bandwidth, measure_matmul_flops  # noqa: E402
from g906.bench.metrics import LengthSpec, Workload  # noqa: E402
from g906.bench.offline import add_weight_stats, make_engine, run_offline  # noqa: E402
from g906.bench.run_record import free  # noqa: E402
from g906.engine.loader import load_model  # noqa: E402

FILES = (("9b-f16", "9B F16"), ("27b-q4_k", "27B Q4_K_M"), ("35b-a3b-q4_k", "35B-A3B Q4_K_M"))
SPLITS = ("layer", "row")


def g906_figures(run: vs.Run, path: Path, tp: int, n64: int) -> dict:
    """Batch-1 decode and n64 concurrent requests on `path` at tensor_parallel_size tp."""
    t = time.perf_counter()
    devices = list(range(tp)) if run.device.type == "cuda" else None
    loaded = load_model(str(path), device=str(run.device), tensor_parallel_size=tp, devices=devices,
                        progress=False)
    if tp == 1:
        add_weight_stats(loaded)
    out = {"load_s": round(time.perf_counter() - t, 1), "bytes_per_token": loaded.info.get("bytes_per_token")}
    P, O = run.P, run.O
    wl = Workload(num_requests=n64, prompt_len=LengthSpec(P, P), output_len=LengthSpec(O, O), concurrency=n64)
    engine = make_engine(loaded, wl, max_num_seqs=n64, max_model_len=P + O + 64, max_num_batched_tokens=max(P, 2048))
    try:
        out["b1"] = run.decode(engine, 1)
        out["c64"] = run_offline(engine, wl)
    finally:
        close = getattr(loaded.model, "close", None)
        del engine
        if callable(close):
            close()
        del loaded
        free()
    return out


def logits_check(run: vs.Run) -> dict | None:
    """TP=2 against TP=1 at the 9B shape: greedy tokens and logits (gpu_tp_check.py correct)."""
    out = run.work / "tp-correct.json"
    args = [sys.executable, str(ROOT / "tests" / "parallel" / "gpu_tp_check.py"), "correct", "--out", str(out)]
    if run.args.quick:
        args += ["--device", "cpu", *sum((["--override", f"{k}={v}"] for k, v in vs.QUICK.items()), [])]
    try:
        r = subprocess.run(args, capture_output=True, text=True, timeout=400)
    except subprocess.TimeoutExpired:
        return {"error": "gpu_tp_check.py correct ran past 400 s"}
    if r.returncode != 0 or not out.is_file():
        return {"error": f"gpu_tp_check.py exited {r.returncode}: {(r.stderr or r.stdout)[-500:]}"}
    return json.loads(out.read_text())


def g_file(run: vs.Run, key: str, label: str, ngpu: int) -> None:
    path = run.file(key)
    N = run.N64
    res = {}
    for tp in (1, 2):
        if tp > ngpu:
            continue
        try:
            res[tp] = g906_figures(run, path, tp, N)
        except Exception as exc:            # TP=1 of the larger files may not fit one GPU
            traceback.print_exc()
            res[tp] = {"error": f"{type(exc).__name__}: {exc}"}
            free()
    llama = {}
    for split in SPLITS:
        llama[split] = {
            "b1": run.llama_call(f"{key} -sm {split} tg", lambda t, s=split: t.bench(path, n_gen=run.O, depth=run.P,
                                                                                  split=s)),
            "c64": run.llama_call(f"{key} -sm {split} batched", lambda t, s=split: t.batched(
                path, pp=run.P, tg=run.O, parallel=[N], split=s)),
        }
    bpt = next((r.get("bytes_per_token") for r in res.values() if r.get("bytes_per_token")), None)
    bw = run.res["copy_bandwidth_bytes_s"]
    one = res.get(1, {})
    two = res.get(2, {})
    best_b1 = max((v["b1"]["tok_s"] for v in llama.values() if v["b1"]), default=None)
    best_c64 = max((r[0]["speed_tg"] for v in llama.values() if (r := v["c64"])), default=None)
    b1_1 = (one.get("b1") or {}).get("decode_tok_s")
    b1_2 = (two.get("b1") or {}).get("decode_tok_s")
    c_1 = (one.get("c64") or {}).get("decode_tok_s")
    c_2 = (two.get("c64") or {}).get("decode_tok_s")
    detail = {"g906": res, "llama_cpp": llama, "tp2_over_tp1_b1": b1_1 and b1_2 and round(b1_2 / b1_1, 2),
              "tp2_over_tp1_c64": c_1 and c_2 and round(c_2 / c_1, 2)}
    run.row(f"{key}-tp2-decode", f"{label} TP=2 decode b=1 (TP=1: {vs._r(b1_1)})", "tok/s", b1_2, best_b1,
            limit=2 * bw / bpt if bpt else None, detail=detail, error=two.get("error"))
    run.row(f"{key}-tp2-c{N}", f"{label} TP=2 {N} x {run.P}/{run.O} decode (TP=1: {vs._r(c_1)})", "tok/s", c_2,
            best_c64, detail={"tp2_over_tp1_c64": detail["tp2_over_tp1_c64"]}, error=two.get("error"))
    run.drop(key)


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--out", default=os.environ.get("OUT"))
    ap.add_argument("--device", default=None)
    ap.add_argument("--quick", action="store_true", help="tiny shapes, gloo on the CPU (a dry run)")
    ap.add_argument("--files", default=",".join(k for k, _ in FILES))
    ap.add_argument("--budget-s", type=float, default=480.0)
    ap.add_argument("--llama-bin", default=str(ROOT / ".llama" / "bin"))
    ap.add_argument("--llama-src", default=str(ROOT / ".llama" / "llama.cpp-src.tar.gz"))
    ap.add_argument("--work", default="/dev/shm/g906-tp" if Path("/dev/shm").is_dir() else "/tmp/g906-tp")
    args = ap.parse_args(argv)
    args.groups, args.dense = [], []
    if args.quick:                      # heads that two ranks can split
        for shape in (vs.QUICK, vs.QUICK_MOE):   # and row-parallel inputs of whole Q4_K blocks per rank
            shape.update(num_attention_heads=4, num_key_value_heads=2, head_dim=128, linear_key_head_dim=128,
                         linear_value_head_dim=128, linear_num_key_heads=4, linear_num_value_heads=8,
                         intermediate_size=1024)
        vs.QUICK_MOE.update(moe_intermediate_size=512, shared_expert_intermediate_size=512)
    device = torch.device(args.device or ("cuda" if torch.cuda.is_available() else "cpu"))
    ngpu = torch.cuda.device_count() if device.type == "cuda" else (2 if args.quick else 0)
    if ngpu < 2:                        # before any file of the real shapes is written
        print("this needs two GPUs (or --quick --device cpu for the gloo dry run)", file=sys.stderr)
        return 2
    run = vs.Run(args)
    run.out_name = "tp-versus-llama-cpp.json"
    run.res["gpus"] = ngpu
    os.environ.setdefault("NCCL_NVLS_ENABLE", "0")          # never NVLink multicast (shared hosts)
    run.start_llama()
    run.res["copy_bandwidth_bytes_s"] = measure_copy_bandwidth(run.device)
    run.res["matmul_flops_s"] = measure_matmul_flops(run.device)
    run.res["tp_correct"] = logits_check(run)
    run.save()
    labels = dict(FILES)
    for key in [k.strip() for k in args.files.split(",") if k.strip()]:
        if run.elapsed() > args.budget_s:
            run.res["skipped"].append(f"{key}: time budget")
            continue
        try:
            g_file(run, key, labels[key], ngpu)
        except Exception as exc:
            traceback.print_exc()
            run.res.setdefault("errors", []).append(f"{key}: {type(exc).__name__}: {exc}")
        free()
        run.save()
    print(json.dumps({k: run.res["tp_correct"].get(k) for k in ("greedy_equal", "max_rel_err")}
                     if isinstance(run.res["tp_correct"], dict) else run.res["tp_correct"]))
    print(vs.table(run.res))
    for e in run.res.get("errors", []) + run.res["llama_cpp"].get("errors", []) + run.res["skipped"]:
        print("note:", e[:300])
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
