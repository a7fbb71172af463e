#!/usr/bin/env python
"""Beam search's cost against its limit (docs/engine.md, Beam search).

    python benchmarks/beam_search.py                                   # the demo model on the CPU
    python benchmarks/beam_search.py --shape qwen3.5-0.8b --device cuda --width 4 --max-tokens 128

A beam search of width W decodes W sequences per step, like W independent greedy requests on the
same prompt; on top of that it waits for every step's logprobs (no pipelined decode), chooses
on the host, and forks (a KV block and a state slot copied per fork). The limit is therefore the
W independent requests' decode rate: the figure is beam search's output tokens per second
(W x max_tokens over its wall time) as a % of theirs. Prefill is included on both sides (the beams
prefill the prompt once, the W requests W times): keep --prompt-len short to compare decoding. The median
of --reps alternated runs; JSON to --out (a file or a directory; $OUT when set)."""

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

from g906.bench.offline import open_model  # noqa: E402
from g906.engine.llm_engine import EngineConfig, LLMEngine  # noqa: E402
from g906.engine.sampling_params import SamplingParams  # noqa: E402


def _sync(loaded) -> None:
    if str(loaded.info.get("device", "cpu")).startswith("cuda"):
        import torch

        torch.cuda.synchronize()


def timed(eng: LLMEngine, loaded, requests: list) -> tuple[float, int]:
    """(seconds, output tokens) of running the requests to their end."""
    _sync(loaded)
    t0 = time.perf_counter()
    for rid, prompt, params in requests:
        eng.add_request(rid, prompt, params)
    tokens = 0
    while eng.has_unfinished_requests():
        for o in eng.step():
            tokens += len(o.new_token_ids)
    _sync(loaded)
    return time.perf_counter() - t0, tokens


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--model", default=None, help="a model source (default: builtin:tiny-qwen35)")
    ap.add_argument("--shape", default=None, help="random weights of a real shape (qwen3.5-0.8b ...) instead")
    ap.add_argument("--device", default=None)
    ap.add_argument("--width", type=int, default=4)
    ap.add_argument("--prompt-len", type=int, default=16)
    ap.add_argument("--max-tokens", type=int, default=96)
    ap.add_argument("--reps", type=int, default=3)
    ap.add_argument("--out", default=os.environ.get("OUT"))
    args = ap.parse_args()
    model = None if args.shape else (args.model or "builtin:tiny-qwen35")
    loaded = open_model(model=model, shape=args.shape, device=args.device)
    eng = LLMEngine(loaded, EngineConfig(max_num_seqs=max(8, args.width), max_model_len=args.prompt_len
                                         + args.max_tokens + 16))
    eng.warm_up()
    vocab = eng.model_config.vocab_size
    prompt = [(7919 * i) % (vocab - 2) + 1 for i in range(args.prompt_len)]
    w, t = args.width, args.max_tokens
    beam = SamplingParams(n=w, use_beam_search=True, temperature=0.0, max_tokens=t, ignore_eos=True)
    greedy = SamplingParams(temperature=0.0, max_tokens=t, ignore_eos=True)
    runs = {"beam": [], "independent": []}
    for r in range(args.reps):
        if eng.prefix is not None:
            eng.prefix.forget()           # both sides prefill the prompt once, from nothing
        runs["beam"].append(timed(eng, loaded, [(f"b{r}", prompt, beam)]))
        if eng.prefix is not None:
            eng.prefix.forget()
        runs["independent"].append(timed(eng, loaded, [(f"g{r}-{i}", prompt, greedy) for i in range(w)]))
    res = {k: {"seconds": statistics.median(s for s, _ in v), "tokens": v[0][1]} for k, v in runs.items()}
    for v in res.values():
        v["tokens_per_s"] = v["tokens"] / v["seconds"]
    pct = 100.0 * res["beam"]["tokens_per_s"] / res["independent"]["tokens_per_s"]
    where = f"{args.shape or model} on {loaded.info.get('device', 'cpu')}"
    print(f"beam search, width {w}, prompt {args.prompt_len}, {t} tokens per beam ({where}):")
    print(f"  beam search          {res['beam']['seconds']:8.3f} s  {res['beam']['tokens_per_s']:9.1f} tok/s")
    print(f"  {w} greedy requests    {res['independent']['seconds']:8.3f} s  "
          f"{res['independent']['tokens_per_s']:9.1f} tok/s  (the limit)")
    print(f"  beam search at {pct:.1f}% of the limit")
    if args.out:
        out = Path(args.out)
        path = out / "beam_search.json" if out.is_dir() else out
        path.write_text(json.dumps({"args": vars(args), "results": res, "percent_of_limit": pct}, indent=2))
    return 0


if __name__ == "__main__":
    sys.exit(main())
