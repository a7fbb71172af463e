#!/usr/bin/env python
"""Structured outputs' cost: decode tok/s constrained vs unconstrained, at batch 1 and 16.

    python benchmarks/structured.py                        # builtin:tiny-qwen35 on the CPU
    python benchmarks/structured.py --model PATH --device cuda --tokens 256

Each row runs `batch` requests of `tokens` output tokens each (ignore_eos; the constrained
grammars never complete, so every request runs to its length and the batches stay the same):
  none   - no constraint (the baseline; decode steps are pipelined)
  regex  - a character class, the cheapest mask
  json   - an endless JSON array of objects (llguidance's JSON lexer and parser on every token)
Printed: output tok/s of each row and its ratio to the baseline (the issue's goal: >= 95% at
batch 16 on the GPU). The figures are wall-clock over the whole generation (prefill included,
the same for every row)."""

from __future__ import annotations

import argparse
import json
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from g906 import LLM, SamplingParams, StructuredOutputsParams  # noqa: E402

ITEM = {"type": "object", "properties": {"name": {"type": "string"}, "n": {"type": "integer"},
                                         "tags": {"type": "array", "items": {"type": "string"}}},
        "required": ["name", "n"]}
CONSTRAINTS = {
    "none": None,
    "regex": StructuredOutputsParams(regex=r"[a-zA-Z0-9 ,.:;]*"),
    "json": StructuredOutputsParams(grammar='start: "[" item ("," item)*\nitem: %json ' + json.dumps(ITEM)),
}


def run(llm: LLM, batch: int, tokens: int, constraint) -> tuple[float, int]:
    params = [SamplingParams(max_tokens=tokens, ignore_eos=True, seed=i, temperature=1.0,
                             structured_outputs=constraint) for i in range(batch)]
    prompts = [f"Request {i}: list some items." for i in range(batch)]
    t0 = time.perf_counter()
    outs = llm.generate(prompts, params)
    dt = time.perf_counter() - t0
    n = sum(len(o.outputs[0].token_ids) for o in outs)
    return n / dt, n


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--model", default="builtin:tiny-qwen35")
    ap.add_argument("--device", default=None, help="cpu / cuda (default: the engine's choice)")
    ap.add_argument("--tokens", type=int, default=64, help="output tokens per request")
    ap.add_argument("--batches", default="1,16")
    ap.add_argument("--repeats", type=int, default=2, help="best of this many runs per row")
    ap.add_argument("--json", help="also write the rows here")
    args = ap.parse_args()
    llm = LLM(args.model, device=args.device) if args.device else LLM(args.model)
    for name, c in CONSTRAINTS.items():            # warm-up: compile the grammars, touch every path
        run(llm, 2, 4, c)
    rows = []
    for batch in [int(b) for b in args.batches.split(",")]:
        base = None
        for name, c in CONSTRAINTS.items():
            best, n = max(run(llm, batch, args.tokens, c) for _ in range(args.repeats))
            base = best if name == "none" else base
            rows.append((batch, name, best, n, best / base))
            print(f"batch {batch:3d}  {name:6s} {best:9.1f} tok/s  ({n} tokens)  {100 * best / base:6.1f}% of "
                  f"unconstrained", flush=True)
    print("\nbatch  constraint   tok/s   % of unconstrained")
    for batch, name, best, _, ratio in rows:
        print(f"{batch:5d}  {name:10s} {best:8.1f}   {100 * ratio:6.1f}%")
    if args.json:
        Path(args.json).write_text(json.dumps({"model": args.model, "tokens": args.tokens, "rows": [
            {"batch": b, "constraint": name, "tok_s": round(best, 2), "tokens": n, "of_unconstrained": round(r, 4)}
            for b, name, best, n, r in rows]}, indent=1))


if __name__ == "__main__":
    main()
