#!/usr/bin/env python
"""MoE decode reads only the chosen experts: the time of one decode step of a synthetic Qwen3.5
MoE shape (64 experts, 8 routed per token, plus the shared expert) against a dense model with the
same active parameters (every layer's MLP of 8 x moe_intermediate + shared features), all else
equal. Both run the engine's own decode step (LLMEngine.step, one sequence) on random weights.

    python benchmarks/moe_decode.py                       # CPU, 4 layers of hidden 1024
    python benchmarks/moe_decode.py --device cuda --layers 40 --hidden 2048 --inter 512 --quant q4_k

Goal: MoE step <= 1.3 x the dense step. The MoE model holds 64 / 8 = 8 x more expert weights
than the dense one computes with; a step that read them all would take several times longer.
Prints the two step times (median of --steps), their ratio and the resident / active bytes of both.
"""

from __future__ import annotations

import argparse
import statistics
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

import torch  # noqa: E402

from g906.bench.synthetic import build_synthetic, weight_stats  # noqa: E402

GOAL = 1.3


def shape_overrides(args, moe: bool) -> dict:
    common = dict(num_hidden_layers=args.layers, hidden_size=args.hidden, vocab_size=args.vocab,
                  num_attention_heads=8, num_key_value_heads=2, head_dim=128, linear_num_key_heads=8,
                  linear_num_value_heads=16, linear_key_head_dim=64, linear_value_head_dim=64)
    if moe:
        return dict(common, num_experts=args.experts, num_experts_per_tok=args.top_k, intermediate_size=args.inter,
                    moe_intermediate_size=args.inter, shared_expert_intermediate_size=args.inter)
    return dict(common, num_experts=0, intermediate_size=args.top_k * args.inter + args.inter)


def step_seconds(loaded, steps: int, sync) -> list[float]:
    from g906.engine.llm_engine import EngineConfig, LLMEngine
    from g906.engine.sampling_params import SamplingParams

    eng = LLMEngine(loaded, EngineConfig(max_num_seqs=1, max_model_len=64 + steps, num_kv_blocks=16,
                                         enforce_eager=True, cpu_kv_cache_gib=0.5))
    eng.add_request("r", list(range(3, 35)), SamplingParams(temperature=0, max_tokens=steps + 4, ignore_eos=True))
    eng.step()                       # the prefill
    for _ in range(2):               # warm-up decode steps
        eng.step()
    out = []
    for _ in range(steps):
        sync()
        t0 = time.perf_counter()
        eng.step()
        sync()
        out.append(time.perf_counter() - t0)
    return out


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--device", default="cpu")
    ap.add_argument("--quant", default="f32", help="f32 / f16 / q8_0 / q4_k (synthetic weights)")
    ap.add_argument("--layers", type=int, default=4)
    ap.add_argument("--hidden", type=int, default=1024)
    ap.add_argument("--inter", type=int, default=256, help="features of one expert (and of the shared expert)")
    ap.add_argument("--experts", type=int, default=64)
    ap.add_argument("--top-k", type=int, default=8)
    ap.add_argument("--vocab", type=int, default=4096)
    ap.add_argument("--steps", type=int, default=20)
    args = ap.parse_args()
    dev = torch.device(args.device)
    sync = (lambda: torch.cuda.synchronize(dev)) if dev.type == "cuda" else (lambda: None)
    rows = {}
    for name, moe in (("dense", False), ("moe", True)):
        loaded = build_synthetic("qwen3.5-35b-a3b", quant=args.quant, device=dev, overrides=shape_overrides(args, moe))
        ws = weight_stats(loaded.model)
        t = statistics.median(step_seconds(loaded, args.steps, sync))
        rows[name] = (t, ws)
        del loaded
    (td, wd), (tm, wm) = rows["dense"], rows["moe"]
    ratio = tm / td
    print(f"device {dev}, {args.quant}, {args.layers} layers, hidden {args.hidden}; MoE {args.experts} experts "
          f"top-{args.top_k} of {args.inter} + shared {args.inter}; dense MLP {args.top_k * args.inter + args.inter}")
    print(f"{'model':>6}  {'step ms':>8}  {'resident MiB':>12}  {'read/token MiB':>14}")
    for name, (t, ws) in rows.items():
        print(f"{name:>6}  {t * 1e3:8.2f}  {ws['weight_bytes'] / 2**20:12.1f}  {ws['bytes_per_token'] / 2**20:14.1f}")
    verdict = "meets" if ratio <= GOAL else "misses"
    print(f"MoE / dense step time: {ratio:.2f}x ({verdict} the goal <= {GOAL}x: {ratio / GOAL * 100:.0f}% of "
          f"the limit); MoE holds {wm['weight_bytes'] / wd['weight_bytes']:.1f}x the dense weights")
    return 0


if __name__ == "__main__":
    sys.exit(main())
