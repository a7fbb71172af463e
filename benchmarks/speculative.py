#!/usr/bin/env python
"""Speculative decoding's cost: one verify step of k+1 positions per sequence against one plain
decode step, the MTP drafter's own cost, and the speedup they project at acceptance rates in the
range peers report for MTP heads.

    python benchmarks/speculative.py --out "$OUT"                      # 9B Q4_K shape, batch 1
    python benchmarks/speculative.py --shape qwen3.5-9b --quant f16 --batch 8
    python benchmarks/speculative.py --eager-verify                    # verify graphs on and off
    python benchmarks/speculative.py --quick --device cpu              # tiny shape, same code paths

Random weights of the real shape (g906.bench.synthetic) plus a random MTP block of the
checkpoint's layout. With random weights the drafts are rejected, so every verify step here
pays the linear-attention rollback: the measured verify cost is the worst case. Per step:

  decode     engine.step() of the plain engine (graphs where the device has them)
  verify     the speculative engine's step minus drafting: k+1 positions per sequence through
             the prefill path, logits of every position, rejection sampling, state rollback;
             replayed from the verify graphs where the engine captures them (a GPU, batches up
             to 16), as the engine runs it; --eager-verify also times it without them
  draft      the MTP block: catch-up over the accepted positions, k-1 autoregressive steps, k
             LM-head projections (n-gram drafting costs next to nothing: its rows are verify
             steps with k drafts every step, whatever the text)

Projected speedup at per-position acceptance a (drafts accepted independently, as the usual
model): tokens per step E = (1 - a^(k+1)) / (1 - a); speedup = E * decode / (verify + draft).
The issue's goal: verify <= 1.15x decode at k = 3 on the GPU for the 9B shape.

--state-costs times the ways to end the linear-attention state at the last accepted token on
one verify chunk: restore + replay (what the engine does), a recompute forward, and the state
copies that keeping every position's state would write."""

from __future__ import annotations

import argparse
import json
import os
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

import torch  # noqa: E402

from g906.bench.run_record import out_path  # noqa: E402
from g906.bench.synthetic import build_synthetic  # noqa: E402
from g906.engine.llm_engine import EngineConfig, LLMEngine  # noqa: E402
from g906.engine.sampling_params import SamplingParams  # noqa: E402

# per-position acceptance rates across what MTP heads are reported to reach (0.6 .. 0.9)
ACCEPTANCE = (0.6, 0.7, 0.8, 0.9)
QUICK_SHAPE = dict(num_hidden_layers=4, hidden_size=256, intermediate_size=512, vocab_size=2048,
                   num_attention_heads=2, num_key_value_heads=1, head_dim=64, linear_num_key_heads=2,
                   linear_num_value_heads=4, linear_key_head_dim=32, linear_value_head_dim=32)


def attach_random_mtp(loaded, seed: int = 5) -> None:
    """A random MTP block of the checkpoint layout (HF names), resident beside the model."""
    from g906.arch.qwen35 import hf_shapes

    model = loaded.model
    model.config.num_mtp_layers = 1
    g = torch.Generator(device="cpu").manual_seed(seed)
    for name, shape in hf_shapes(model.config):
        if not name.startswith("mtp."):
            continue
        t = torch.randn(shape, generator=g) / (shape[-1] ** 0.5 if len(shape) > 1 else 10.0)
        model.mtp_weights[name] = t.to(model.device, model.dtype)


def sync(dev: torch.device) -> None:
    if dev.type == "cuda":
        torch.cuda.synchronize(dev)


def measure(loaded, spec, *, batch: int, context: int, steps: int, dev: torch.device,
            verify_graphs: bool = True) -> dict:
    """Seconds per step (and per part) of `steps` decode or verify steps at `context` tokens.
    verify_graphs False: verify steps run eagerly even where the engine captured verify graphs."""
    eng = LLMEngine(loaded, EngineConfig(max_num_seqs=max(batch, 1), max_model_len=context + steps * 8 + 64,
                                         max_num_batched_tokens=max(2048, context), speculative=spec,
                                         seed=0))
    if eng.spec is not None and not verify_graphs:
        eng.spec.graphs = None
    vocab = loaded.config.vocab_size
    for i in range(batch):
        eng.add_request(f"b{i}", [(31 * j + 7 * i) % vocab for j in range(context)],
                        SamplingParams(temperature=0.0, max_tokens=steps * 8 + 32, ignore_eos=True))
    while any(not s.is_decode for s in eng.scheduler.running) or eng.scheduler.waiting:
        eng.step()                                   # prefill
    for _ in range(3):
        eng.step()                                   # warm the decode / verify path
    parts = {"draft": 0.0}
    if eng.spec is not None:
        inner = eng.spec.after_step

        def timed():
            sync(dev)
            t = time.perf_counter()
            inner()
            sync(dev)
            parts["draft"] += time.perf_counter() - t

        eng.spec.after_step = timed
        parts["draft"] = 0.0
    sync(dev)
    t0 = time.perf_counter()
    for _ in range(steps):
        eng.step()
    sync(dev)
    total = (time.perf_counter() - t0) / steps
    draft = parts["draft"] / steps
    out = {"step_ms": total * 1e3, "draft_ms": draft * 1e3, "verify_ms": (total - draft) * 1e3}
    if eng.spec is not None:
        out["acceptance"] = eng.spec.metrics.to_json()
        vg = eng.spec.graphs
        out["verify_graphs"] = vg is not None and vg.use_graphs and vg.num_replays > 0
    del eng
    return out


def state_costs(loaded, *, batch: int, k: int, context: int, reps: int, dev: torch.device) -> dict:
    """The three ways to end the linear-attention state at the last accepted token, timed on one
    verify chunk of k+1 tokens per sequence (ms): keep (the verify forward with the states kept,
    against a plain one), replay (restore + recurrence over k accepted tokens: the worst case),
    recompute (a forward over the k accepted tokens again) and per-position (k+1 copies of the
    recurrent and conv states per layer: what keeping every position's state writes at least)."""
    from g906.engine.cache import ModelCache
    from g906.engine.context import ForwardContext

    model, cfg = loaded.model, loaded.config
    bs = 16
    nb = batch * ((context + k + bs) // bs + 1)
    cache = ModelCache.allocate(cfg, num_blocks=nb, block_size=bs, num_state_slots=batch, dtype=model.dtype,
                                device=dev)
    model.bind_cache(cache)
    per = nb // batch
    tables = torch.arange(nb, dtype=torch.int32, device=dev).view(batch, per)

    def ctx(start: int, n: int, keep: bool) -> tuple:
        i32 = dict(dtype=torch.int32, device=dev)
        pos = torch.arange(start, start + n, device=dev).repeat(batch)
        rows = torch.arange(batch, device=dev).repeat_interleave(n)
        slots = (tables[rows, pos // bs].long() * bs + pos % bs)
        c = ForwardContext(True, torch.arange(0, batch * n + 1, n, **i32), torch.full((batch,), start + n, **i32),
                           torch.full((batch,), start, **i32), slots, tables, torch.arange(batch, **i32),
                           torch.full((batch,), start > 0, dtype=torch.bool, device=dev), n, start + n,
                           keep_linear_inputs=keep)
        ids = torch.randint(0, cfg.vocab_size, (batch * n,), device=dev)
        return ids, pos, c

    model.forward(*ctx(0, context, False))            # the context, once

    def timed(fn) -> float:
        fn()
        sync(dev)
        t = time.perf_counter()
        for _ in range(reps):
            fn()
        sync(dev)
        return (time.perf_counter() - t) / reps * 1e3

    plain = timed(lambda: model.forward(*ctx(context, k + 1, False)))
    kept = timed(lambda: model.forward(*ctx(context, k + 1, True)))
    keep_n = torch.full((batch,), k, dtype=torch.int32, device=dev)

    def replay():
        model.forward(*ctx(context, k + 1, True))
        model.rollback_linear_state(keep_n)

    replay_ms = timed(replay) - kept
    recompute = timed(lambda: model.forward(*ctx(context, k, False)))
    per_pos = timed(lambda: [(cache.ssm.clone(), cache.conv.clone()) for _ in range(k + 1)])
    return {"verify_plain_ms": plain, "verify_keep_ms": kept, "replay_ms": replay_ms,
            "recompute_ms": recompute, "per_position_copies_ms": per_pos}


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--shape", default="qwen3.5-9b")
    ap.add_argument("--quant", default="q4_k")
    ap.add_argument("--device", default=None)
    ap.add_argument("--batch", type=int, default=1)
    ap.add_argument("--context", type=int, default=512, help="tokens in each sequence before the timed steps")
    ap.add_argument("--steps", type=int, default=32)
    ap.add_argument("--ks", default="1,2,3")
    ap.add_argument("--state-costs", action="store_true",
                    help="only time the ways to end the linear-attention state at the last accepted token")
    ap.add_argument("--eager-verify", action="store_true",
                    help="also time each row with the verify graphs off (the eager verify step)")
    ap.add_argument("--quick", action="store_true", help="a tiny shape and short lengths (CPU smoke run)")
    ap.add_argument("--out", default=os.environ.get("OUT"), help="directory or .json file for the results")
    args = ap.parse_args(argv)
    dev = torch.device(args.device or ("cuda" if torch.cuda.is_available() else "cpu"))
    overrides = QUICK_SHAPE if args.quick else None
    if args.quick:
        args.context, args.steps = min(args.context, 64), min(args.steps, 8)
    loaded = build_synthetic(args.shape, quant=args.quant, device=dev, overrides=overrides)
    attach_random_mtp(loaded)
    ks = [int(k) for k in args.ks.split(",")]
    res = {"shape": args.shape + (" (quick)" if args.quick else ""), "quant": args.quant, "device": str(dev),
           "gpu": torch.cuda.get_device_name(dev) if dev.type == "cuda" else None, "batch": args.batch,
           "context": args.context, "steps": args.steps, "rows": []}
    if args.state_costs:
        for k in [int(k) for k in args.ks.split(",")]:
            c = state_costs(loaded, batch=args.batch, k=k, context=args.context, reps=args.steps, dev=dev)
            print(f"k={k} state: verify {c['verify_plain_ms']:.2f} ms, with states kept {c['verify_keep_ms']:.2f} ms; "
                  f"rollback by replay {c['replay_ms']:.2f} ms, by recompute {c['recompute_ms']:.2f} ms, "
                  f"per-position state copies {c['per_position_copies_ms']:.2f} ms")
        return 0
    # n-gram rows: k drafts every step whatever the text (the verify cost at full draft length)
    from g906.engine.spec import decoder

    decoder.propose_ngram = lambda ids, k, lo, hi: [ids[-1]] * k
    base = measure(loaded, None, batch=args.batch, context=args.context, steps=args.steps, dev=dev)
    res["decode_ms"] = base["step_ms"]
    print(f"{res['shape']} {args.quant} on {res['gpu'] or dev}, batch {args.batch}, context {args.context}")
    print(f"plain decode step: {base['step_ms']:.2f} ms")
    eager_col = " eager verify ms | x decode |" if args.eager_verify else ""
    print("| method | k | verify ms | graphs | x decode | draft ms |" + eager_col + " "
          + " | ".join(f"speedup a={a}" for a in ACCEPTANCE) + " |")
    print("|---|---|---|---|---|---|" + ("---|---|" if args.eager_verify else "") + "---|" * len(ACCEPTANCE))
    for method in ("mtp", "ngram"):
        for k in ks:
            spec = {"method": method, "num_speculative_tokens": k}
            m = measure(loaded, spec, batch=args.batch, context=args.context, steps=args.steps, dev=dev)
            cost = m["verify_ms"] + m["draft_ms"]
            proj = {a: (1 - a ** (k + 1)) / (1 - a) * base["step_ms"] / cost for a in ACCEPTANCE}
            row = dict(method=method, k=k, **m, verify_x_decode=m["verify_ms"] / base["step_ms"],
                       projected_speedup={str(a): round(v, 3) for a, v in proj.items()})
            extra = ""
            if args.eager_verify:
                e = measure(loaded, spec, batch=args.batch, context=args.context, steps=args.steps, dev=dev,
                            verify_graphs=False)
                row["eager_verify_ms"] = e["verify_ms"]
                extra = f" {e['verify_ms']:.2f} | {e['verify_ms'] / base['step_ms']:.2f}x |"
            res["rows"].append(row)
            print(f"| {method} | {k} | {m['verify_ms']:.2f} | {'yes' if m['verify_graphs'] else 'no'} | "
                  f"{row['verify_x_decode']:.2f}x | {m['draft_ms']:.2f} |{extra} "
                  + " | ".join(f"{v:.2f}x" for v in proj.values()) + " |")
    p = out_path(args.out, "speculative.json")
    if p is not None:
        p.write_text(json.dumps(res, indent=1))
        print(f"wrote {p}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
