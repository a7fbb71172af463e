#!/usr/bin/env python
"""Prefix caching's effect on time to first token, in one run (docs/engine.md, Prefix caching).

    python benchmarks/prefix_cache.py                       # the demo model on the CPU
    python benchmarks/prefix_cache.py --first-len 4096 --turn-len 900        # the issue's 4k -> 12k
    python benchmarks/prefix_cache.py --shape qwen3.5-9b --device cuda       # a real shape (GPU)
    python benchmarks/prefix_cache.py --speculative-config '{"method": "ngram", "num_speculative_tokens": 3}'

Two figures:
  1. An agent conversation of --turns turns, each re-sending the history (first prompt
     --first-len tokens, then the previous answer and --turn-len new tokens per turn), with the
     cache on and with it off: TTFT per turn, its ratio (on / off), the hit rate, and the memory
     of the KV cache and of the state snapshot pool. The issue's goal: from turn 2 on, TTFT with
     the cache <= 15% of TTFT without.
  2. Two requests sharing a --shared-len token prefix (2,000 by default): the second one's TTFT
     with the cache on against the same request on an engine with it off, the median of --reps
     alternated runs; the second request extends the first one's prompt (the issue's case, goal
     on the CPU: a ratio <= 0.3), or shares only the prefix (the first time a prefix is shared
     that way, it resumes at the last stride snapshot; later requests at the branch point).
  3. The n samples of one request (--siblings, 4 by default) on a --shared-len token prompt:
     prompt tokens computed in prefill steps and the time until every sample has its first
     token, cache on / off (the siblings prefill the prompt once with it).
--speculative-config (vLLM's JSON) runs every engine, cache on and off, with speculation.
Everything is also written as JSON to --out (a file or a directory; $OUT is used when set)."""

from __future__ import annotations

import argparse
import json
import os
import statistics
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from g906.bench.multiturn import MultiTurn, run_multiturn  # noqa: E402
from g906.bench.offline import open_model  # noqa: E402
from g906.bench.run_record import out_path  # noqa: E402
from g906.engine.llm_engine import EngineConfig, LLMEngine  # noqa: E402
from g906.engine.sampling_params import SamplingParams  # noqa: E402


def engine(loaded, on: bool, max_len: int, args) -> LLMEngine:
    cfg = EngineConfig(max_num_seqs=4, max_num_batched_tokens=args.max_num_batched_tokens, max_model_len=max_len,
                       block_size=16, enable_prefix_caching=on, cpu_kv_cache_gib=args.cpu_kv_cache_gib,
                       enforce_eager=args.enforce_eager, speculative=args.speculative_config)
    return LLMEngine(loaded, cfg)


def _sync(loaded) -> None:
    if str(loaded.info.get("device", "cpu")).startswith("cuda"):
        import torch

        torch.cuda.synchronize()


def ttft(eng: LLMEngine, rid: str, prompt: list[int]) -> tuple[float, float, int]:
    """Seconds to the first token of one request run alone (wall clock, and this process's CPU
    time: on a shared machine the fairer figure), and the prompt tokens it had cached."""
    _sync(eng.loaded)
    c0 = time.process_time()
    t0 = time.perf_counter()
    eng.add_request(rid, prompt, SamplingParams(temperature=0.0, max_tokens=1, ignore_eos=True))
    cached = 0
    while eng.has_unfinished_requests():
        for o in eng.step():
            cached = o.num_cached_tokens
    _sync(eng.loaded)
    return time.perf_counter() - t0, time.process_time() - c0, cached


def shared_prefix(loaded, args) -> dict:
    """The second request's TTFT with the cache on / off, two ways: it extends the first one's
    prompt ("extends": the next turn of a conversation), or only shares its first --shared-len
    tokens ("diverges": one system prompt, another question). Alternated runs; medians."""
    vocab = loaded.config.vocab_size
    prefix = [(i * 7919 + 17) % (vocab - 2) for i in range(args.shared_len)]
    tail_a = [(i * 31 + 5) % (vocab - 2) for i in range(64)]
    tail_b = [(i * 17 + 3) % (vocab - 2) for i in range(64)]
    cases = {"extends": (prefix, prefix + tail_b), "diverges": (prefix + tail_a, prefix + tail_b)}
    on, off = engine(loaded, True, args.shared_len + 256, args), engine(loaded, False, args.shared_len + 256, args)
    for e in (on, off):
        e.warm_up()
    out = {}
    for name, (first, second) in cases.items():
        t_on, t_off, ratios, c_on, c_off, cpu_ratios, cached = [], [], [], [], [], [], 0
        for r in range(args.reps):
            on.prefix.forget()
            ttft(on, f"{name}-first-{r}", first)          # fills the cache
            a, ca, cached = ttft(on, f"{name}-second-{r}", second)
            b, cb, _ = ttft(off, f"{name}-second-{r}", second)
            t_on.append(a)
            t_off.append(b)
            ratios.append(a / b)
            c_on.append(ca)
            c_off.append(cb)
            cpu_ratios.append(ca / cb)
        out[name] = {"shared_len": args.shared_len, "prompt_len": len(second), "cached_tokens": cached,
                     "ttft_on_ms": statistics.median(t_on) * 1e3, "ttft_off_ms": statistics.median(t_off) * 1e3,
                     "ratio": statistics.median(ratios), "ratios": ratios,
                     "cpu_on_ms": statistics.median(c_on) * 1e3, "cpu_off_ms": statistics.median(c_off) * 1e3,
                     "cpu_ratio": statistics.median(cpu_ratios), "goal": 0.3}
    return out


def siblings(loaded, args) -> dict:
    """n samples of one --shared-len token prompt: prompt tokens computed in prefill steps and
    seconds until every sample has its first token, with the cache on and off."""
    vocab = loaded.config.vocab_size
    prompt = [(i * 7919 + 29) % (vocab - 2) for i in range(args.shared_len)]
    out = {}
    for on in (True, False):
        eng = engine(loaded, on, args.shared_len + 64, args)
        eng.warm_up()
        before = eng.stats()["prompt_tokens"]
        params = SamplingParams(temperature=0.8, seed=0, max_tokens=1, ignore_eos=True, n=args.siblings)
        _sync(loaded)
        t0 = time.perf_counter()
        for i in range(args.siblings):
            eng.add_request(f"sib-{i}", prompt, params.for_child(i))
        while eng.has_unfinished_requests():
            eng.step()
        _sync(loaded)
        out["on" if on else "off"] = {"prefill_tokens": eng.stats()["prompt_tokens"] - before,
                                      "all_first_tokens_ms": (time.perf_counter() - t0) * 1e3}
        del eng
    return {"n": args.siblings, "prompt_len": args.shared_len, **out,
            "ratio": out["on"]["all_first_tokens_ms"] / out["off"]["all_first_tokens_ms"]}


def conversation(loaded, args) -> dict:
    mt = MultiTurn(turns=args.turns, first_len=args.first_len, turn_len=args.turn_len, output_len=args.output_len,
                   seed=0)
    out = {}
    for on in (True, False):
        eng = engine(loaded, on, mt.max_len + 16, args)
        eng.warm_up()
        out["on" if on else "off"] = run_multiturn(eng, mt)
        del eng
    rows = []
    for a, b in zip(out["on"]["turns"], out["off"]["turns"]):
        rows.append({"turn": a["turn"], "prompt_tokens": a["prompt_tokens"], "cached_tokens": a["cached_tokens"],
                     "ttft_on_ms": a["ttft_ms"], "ttft_off_ms": b["ttft_ms"], "ratio": a["ttft_ms"] / b["ttft_ms"]})
    sizing = out["on"]["cache"]
    return {"workload": mt.describe(), "turns": rows, "hit_rate": out["on"]["hit_rate"],
            "ratio_turns_2_on": statistics.median([r["ratio"] for r in rows[1:]]) if len(rows) > 1 else None,
            "goal": 0.15,
            "memory": {"kv_cache_bytes": sizing["num_blocks"] * sizing["kv_bytes_per_block"],
                       "snapshot_pool_bytes": sizing["num_snapshots"] * sizing["state_bytes_per_slot"],
                       "num_snapshots": sizing["num_snapshots"],
                       "snapshots_used": out["on"]["stats"].get("prefix_snapshots_used"),
                       "cached_blocks": out["on"]["stats"].get("prefix_cache_blocks")}}


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--model", default="builtin:tiny-qwen35")
    ap.add_argument("--shape", default=None, help="random weights of a real shape (qwen3.5-9b ...) instead")
    ap.add_argument("--quant", default="f16")
    ap.add_argument("--device", default=None)
    ap.add_argument("--dtype", default="auto")
    ap.add_argument("--turns", type=int, default=10)
    ap.add_argument("--first-len", type=int, default=1024)
    ap.add_argument("--turn-len", type=int, default=224)
    ap.add_argument("--output-len", type=int, default=16)
    ap.add_argument("--shared-len", type=int, default=2000)
    ap.add_argument("--reps", type=int, default=3)
    ap.add_argument("--max-num-batched-tokens", type=int, default=2048)
    ap.add_argument("--cpu-kv-cache-gib", type=float, default=1.0)
    ap.add_argument("--enforce-eager", action="store_true")
    ap.add_argument("--skip-conversation", action="store_true")
    ap.add_argument("--siblings", type=int, default=4, help="n of the siblings figure (0: skip it)")
    ap.add_argument("--speculative-config", type=json.loads, default=None,
                    help="vLLM's speculative_config as JSON, for every engine")
    ap.add_argument("--out", default=os.environ.get("OUT"))
    args = ap.parse_args()

    loaded = open_model(model=None if args.shape else args.model, shape=args.shape, quant=args.quant,
                        dtype=args.dtype, device=args.device, progress=False)
    res: dict = {"model": args.shape or args.model, "device": str(loaded.info.get("device", "cpu")),
                 "date": time.strftime("%Y-%m-%d %H:%M:%S UTC", time.gmtime()),
                 "speculative": args.speculative_config}
    res["shared_prefix"] = shared = shared_prefix(loaded, args)
    for name, sp in shared.items():
        print(f"shared {sp['shared_len']}-token prefix, second request {name} the first: TTFT "
              f"{sp['ttft_on_ms']:.1f} ms with the cache, {sp['ttft_off_ms']:.1f} ms without: ratio {sp['ratio']:.3f} "
              f"(goal <= {sp['goal']}); CPU time {sp['cpu_on_ms']:.1f} / {sp['cpu_off_ms']:.1f} ms: ratio "
              f"{sp['cpu_ratio']:.3f}; {sp['cached_tokens']} of {sp['prompt_len']} tokens cached", flush=True)
    if args.siblings > 1:
        res["siblings"] = sib = siblings(loaded, args)
        print(f"\nn = {sib['n']} samples of a {sib['prompt_len']}-token prompt: {sib['on']['prefill_tokens']} prompt "
              f"tokens prefilled with the cache, {sib['off']['prefill_tokens']} without; every first token after "
              f"{sib['on']['all_first_tokens_ms']:.1f} / {sib['off']['all_first_tokens_ms']:.1f} ms: ratio "
              f"{sib['ratio']:.3f}", flush=True)
    if not args.skip_conversation:
        res["conversation"] = conv = conversation(loaded, args)
        print(f"\n{'turn':>4} {'prompt':>7} {'cached':>7} {'TTFT on ms':>11} {'TTFT off ms':>12} {'ratio':>6}")
        for r in conv["turns"]:
            print(f"{r['turn']:>4} {r['prompt_tokens']:>7} {r['cached_tokens']:>7} {r['ttft_on_ms']:>11.1f} "
                  f"{r['ttft_off_ms']:>12.1f} {r['ratio']:>6.3f}")
        m = conv["memory"]
        print(f"hit rate (turns 2..): {conv['hit_rate']:.1%}; median TTFT ratio from turn 2: "
              f"{conv['ratio_turns_2_on']:.3f} (goal <= {conv['goal']}); KV cache {m['kv_cache_bytes'] / 2**20:.1f} MiB, "
              f"snapshot pool {m['snapshot_pool_bytes'] / 2**20:.1f} MiB ({m['num_snapshots']} slots, "
              f"{m['snapshots_used']} used), {m['cached_blocks']} cached blocks")
    path = out_path(args.out, "prefix_cache.json")
    if path is not None:
        path.write_text(json.dumps(res, indent=1))
        print(f"\nwrote {path}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
