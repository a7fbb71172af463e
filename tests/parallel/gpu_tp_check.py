"""Multi-GPU check and benchmark (not collected by pytest; run by hand on a 2-GPU machine):

    python tests/parallel/gpu_tp_check.py correct [--shape qwen3.5-9b] [--out FILE]
        TP=1 vs TP=2 at a real shape with random weights (fp32, PyTorch reference ops so that
        matmuls are plain fp32): last-position logits of a prefill and of greedy decode steps,
        relative error and whether the greedy tokens agree.
    python tests/parallel/gpu_tp_check.py speed [--shape qwen3.5-9b] [--dtype bfloat16] [--out FILE]
        decode throughput of the whole engine (scheduler, runner, sampler), TP=1 vs TP=2, at
        batch 1 and 8 (prompt 128 tokens, 64 generated, only decode steps timed).

Prints one JSON object (and writes it to --out)."""

from __future__ import annotations

import argparse
import gc
import json
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))

import torch  # noqa: E402


def synth(args, quant: str) -> str:
    q = "&".join(f"{k}={v}" for k, v in args.overrides.items())
    return f"synthetic:{args.shape}?quant={quant}" + (f"&{q}" if q else "")


def rel(a, b) -> float:
    return float((a.float() - b.float()).norm() / b.float().norm().clamp_min(1e-30))


def run_greedy(model, prompt, steps):
    from tests.engine.conftest import TinyRunner

    r = TinyRunner(model, max_seqs=1, max_len=len(prompt) + steps + 16)
    logits = [r.step([0], [prompt])[0].float().cpu()]
    toks = []
    for _ in range(steps):
        toks.append(int(logits[-1].argmax()))
        logits.append(r.step([0], [[toks[-1]]], is_prefill=False)[0].float().cpu())
    del r
    return logits, toks


def correct(args) -> dict:
    import os

    os.environ["G906_KERNELS"] = "reference"
    from g906.bench.synthetic import build_synthetic
    from g906.engine.parallel import load_model_tp

    dev = args.device
    from g906.engine.synthetic import shape_config

    vocab = shape_config(args.shape, args.overrides).vocab_size
    prompt = [(i * 7919 + 11) % vocab for i in range(args.prompt)]
    t0 = time.perf_counter()
    ref = build_synthetic(args.shape, quant="f32", dtype="float32", device=dev, overrides=args.overrides)
    l1, t1 = run_greedy(ref.model, prompt, args.steps)
    tp1_s = time.perf_counter() - t0
    del ref
    gc.collect()
    torch.cuda.empty_cache() if torch.cuda.is_available() else None
    t0 = time.perf_counter()
    tp = load_model_tp(synth(args, "f32"), tensor_parallel_size=2, dtype="float32", device=dev,
                       progress=False)
    l2, t2 = run_greedy(tp.model, prompt, args.steps)
    tp2_s = time.perf_counter() - t0
    tp.model.close()
    errs = [rel(b, a) for a, b in zip(l1, l2)]
    return {"check": "tp2_vs_tp1", "shape": args.shape, "dtype": "float32", "kernels": "reference",
            "prompt_tokens": len(prompt), "decode_steps": args.steps, "max_rel_err": max(errs),
            "rel_errs": errs, "greedy_equal": t1 == t2, "tokens_tp1": t1, "tokens_tp2": t2,
            "seconds_tp1": round(tp1_s, 1), "seconds_tp2": round(tp2_s, 1)}


def decode_rate(loaded, batch: int, prompt_len: int, gen: int) -> dict:
    from g906.engine.llm_engine import EngineConfig, LLMEngine
    from g906.engine.sampling_params import SamplingParams

    eng = LLMEngine(loaded, EngineConfig(max_num_seqs=8, max_num_batched_tokens=2048, max_model_len=1024,
                                         num_kv_blocks=8 * (1024 // 16) + 1))
    sp = SamplingParams(temperature=0.0, ignore_eos=True, max_tokens=gen)
    for rnd in range(2):                    # round 0 warms up (Triton compiles), round 1 is timed
        for i in range(batch):
            vocab = loaded.config.vocab_size
            eng.add_request(f"{rnd}-{i}", [(i * 31 + j * 7 + 5) % vocab for j in range(prompt_len)], sp)
        dec_s, dec_tokens = 0.0, 0
        while eng.has_unfinished_requests():
            if loaded.info.get("device", "").startswith("cuda"):
                torch.cuda.synchronize()
            t = time.perf_counter()
            outs = eng.step()
            if loaded.info.get("device", "").startswith("cuda"):
                torch.cuda.synchronize()
            dt = time.perf_counter() - t
            if eng.runner is not None and outs and all(o.num_output_tokens > 1 for o in outs):
                dec_s += dt
                dec_tokens += len(outs)
    return {"batch": batch, "decode_tok_s": round(dec_tokens / dec_s, 1) if dec_s else None,
            "ms_per_step": round(1000 * dec_s / max(1, dec_tokens / batch), 2)}


def speed(args) -> dict:
    from g906.bench.synthetic import build_synthetic
    from g906.engine.parallel import load_model_tp

    quant = {"bfloat16": "bf16", "float16": "f16", "float32": "f32"}[args.dtype]
    res = {"check": "decode_throughput", "shape": args.shape, "dtype": args.dtype, "prompt_tokens": 128,
           "generated": 64, "tp1": [], "tp2": []}
    ref = build_synthetic(args.shape, quant=quant, dtype=args.dtype, device=args.device,
                          overrides=args.overrides)
    for b in (1, 8):
        res["tp1"].append(decode_rate(ref, b, 128, 64))
    del ref
    gc.collect()
    torch.cuda.empty_cache() if torch.cuda.is_available() else None
    tp = load_model_tp(synth(args, quant), tensor_parallel_size=2, dtype=args.dtype,
                       device=args.device, progress=False)
    try:
        for b in (1, 8):
            res["tp2"].append(decode_rate(tp, b, 128, 64))
    finally:
        tp.model.close()
    return res


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("what", choices=["correct", "speed"])
    ap.add_argument("--shape", default="qwen3.5-9b")
    ap.add_argument("--dtype", default="bfloat16")
    ap.add_argument("--device", default="cuda:0" if torch.cuda.is_available() else "cpu")
    ap.add_argument("--prompt", type=int, default=32)
    ap.add_argument("--steps", type=int, default=8)
    ap.add_argument("--out", default=None)
    ap.add_argument("--override", action="append", default=[], help="KEY=VALUE shape field (tiny CPU trials)")
    args = ap.parse_args()
    from g906.engine.synthetic import parse_overrides

    args.overrides = parse_overrides(args.override)
    out = correct(args) if args.what == "correct" else speed(args)
    text = json.dumps(out, indent=1)
    print(text, flush=True)
    if args.out:
        Path(args.out).write_text(text)


if __name__ == "__main__":
    main()
