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
the same for every row).

    python benchmarks/structured.py --speculative-config '{"method": "mtp", "num_speculative_tokens": 3}'

runs every row with speculative decoding (constrained requests speculate too: the grammar mask at
every verified position) and adds each row's mean acceptance length; --mask-costs K prints the
host cost of one verify step's masks for a constrained sequence (Guide.speculate over K drafts:
K+1 masks, consume and roll back) against one plain step's mask (Guide.fill), per grammar."""

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


def acceptance(llm: LLM, before: dict) -> float | None:
    """Mean acceptance length since `before` (tokens per verify row), None without speculation."""
    st = llm.engine.stats()
    drafts = st.get("spec_num_drafts", 0) - before.get("spec_num_drafts", 0)
    if "spec_num_drafts" not in st or not drafts:
        return None
    return 1.0 + (st["spec_num_accepted_tokens"] - before.get("spec_num_accepted_tokens", 0)) / drafts


def mask_costs(llm: LLM, k: int, reps: int = 50) -> None:
    """Host time of one verify step's masks (k drafts the grammar allows) against one plain mask."""
    import torch

    from g906.engine.structured.guide import Guide
    from g906.engine.structured.mask import allocate, allowed

    eng = llm.engine
    vocab = int(eng.model_config.vocab_size)
    bm = allocate(k + 1, vocab)
    for name, c in CONSTRAINTS.items():
        if c is None:
            continue
        guide = Guide(eng.grammars.matcher(c), eos_ids=sorted(eng.eos_token_ids))
        for _ in range(8):                     # into the grammar: a few allowed tokens first
            guide.fill(bm, 0, allow_eos=False)
            guide.accept(int(allowed(bm[:1], vocab, torch.device("cpu"))[0].nonzero()[-1]))
        drafts = []
        for _ in range(k):
            guide.mask_after(drafts, bm, 0, allow_eos=False)
            drafts.append(int(allowed(bm[:1], vocab, torch.device("cpu"))[0].nonzero()[-1]))
        t0 = time.perf_counter()
        for _ in range(reps):
            guide.fill(bm, 0, allow_eos=False)
        one = (time.perf_counter() - t0) / reps
        t0 = time.perf_counter()
        for _ in range(reps):
            n, _ = guide.speculate(drafts, bm, 0, [False] * (k + 1))
        spec = (time.perf_counter() - t0) / reps
        print(f"{name:6s} one mask {1e6 * one:8.1f} us   verify masks (k={k}, {n} drafts kept) "
              f"{1e6 * spec:8.1f} us  ({spec / one:4.1f}x)", flush=True)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--model", default="builtin:tiny-qwen35")
    ap.add_argument("--device", default=None, help="cpu / cuda (default: the engine's choice)")
    ap.add_argument("--tokens", type=int, default=64, help="output tokens per request")
    ap.add_argument("--batches", default="1,16")
    ap.add_argument("--repeats", type=int, default=2, help="best of this many runs per row")
    ap.add_argument("--json", help="also write the rows here")
    ap.add_argument("--speculative-config", help="vLLM's speculative_config (JSON): every row speculates")
    ap.add_argument("--mask-costs", type=int, metavar="K", help="also time one verify step's masks over K drafts")
    args = ap.parse_args()
    kw = {"device": args.device} if args.device else {}
    if args.speculative_config:
        kw["speculative_config"] = json.loads(args.speculative_config)
    llm = LLM(args.model, **kw)
    if args.mask_costs:
        mask_costs(llm, args.mask_costs)
    for name, c in CONSTRAINTS.items():            # warm-up: compile the grammars, touch every path
        run(llm, 2, 4, c)
    rows = []
    for batch in [int(b) for b in args.batches.split(",")]:
        base = None
        for name, c in CONSTRAINTS.items():
            best, n, acc = 0.0, 0, None
            for _ in range(args.repeats):
                before = llm.engine.stats()
                tok_s, n = run(llm, batch, args.tokens, c)
                if tok_s > best:
                    best, acc = tok_s, acceptance(llm, before)
            base = best if name == "none" else base
            rows.append((batch, name, best, n, best / base, acc))
            al = f"  acceptance length {acc:.2f}" if acc is not None else ""
            print(f"batch {batch:3d}  {name:6s} {best:9.1f} tok/s  ({n} tokens)  {100 * best / base:6.1f}% of "
                  f"unconstrained{al}", flush=True)
    print("\nbatch  constraint   tok/s   % of unconstrained   acceptance length")
    for batch, name, best, _, ratio, acc in rows:
        print(f"{batch:5d}  {name:10s} {best:8.1f}   {100 * ratio:6.1f}%   {'-' if acc is None else f'{acc:.2f}'}")
    if args.json:
        Path(args.json).write_text(json.dumps({"model": args.model, "tokens": args.tokens,
                                               "speculative_config": kw.get("speculative_config"), "rows": [
            {"batch": b, "constraint": name, "tok_s": round(best, 2), "tokens": n, "of_unconstrained": round(r, 4),
             "acceptance_length": None if acc is None else round(acc, 4)}
            for b, name, best, n, r, acc in rows]}, indent=1))


if __name__ == "__main__":
    main()
