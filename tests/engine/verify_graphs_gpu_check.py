"""GPU check of the speculative verify graphs (g906/engine/spec/verify_graphs.py), run by hand on a
GPU machine, not by pytest:

    python -m tests.engine.verify_graphs_gpu_check                 # both parts
    python -m tests.engine.verify_graphs_gpu_check --skip-timing   # equality only (a minute)

1. Greedy token ids on the tiny Markov-like model of spec_models.py (MTP k = 1, 3 and n-gram, three
   requests of different lengths, float32 and float16): verify graphs on, verify graphs off (the
   eager verify step) and no speculation (decode graphs). With graphs on, the verify graphs must
   have been captured and replayed. In float32 all three must match token for token; in float16 the
   padded graph step and the unpadded eager one may round a near-tie differently (reported, not a
   failure), as plain decode and verify steps may (spec_gpu_check.py).
2. The step time at the 9B shape (g906.bench.synthetic, random weights, q4_k by default): a plain
   decode step, and a speculative step (verify + drafting) with the verify graphs on and off, for
   MTP and n-gram at k = 1..3 (benchmarks/speculative.py's measure(), batch 1 and 4). The issue's
   goal: verify <= 1.15x decode at k = 3.

Exit status 1 when a float32 comparison differs or the graphs were not replayed."""

from __future__ import annotations

import argparse
import sys
import tempfile
from pathlib import Path

import torch

from g906.engine.llm_engine import EngineConfig, LLMEngine
from g906.engine.loader import load_model
from g906.engine.sampling_params import SamplingParams

from .conftest import random_prompt
from .spec_models import markov_mtp_dir

SPECS = ({"method": "mtp", "num_speculative_tokens": 1}, {"method": "mtp", "num_speculative_tokens": 3},
         {"method": "ngram", "num_speculative_tokens": 3, "prompt_lookup_min": 1, "prompt_lookup_max": 3})


def equality(device: str = "cuda") -> int:
    d = markov_mtp_dir(Path(tempfile.mkdtemp()))
    prompts = [random_prompt(5, 1), random_prompt(23, 2), random_prompt(40, 3)]
    bad = 0
    for dtype in ("float32", "float16") if device == "cuda" else ("float32",):
        loaded = load_model(str(d), dtype=dtype, device=device, progress=False, keep_mtp=True)

        def run(spec, graphs=True):
            eng = LLMEngine(loaded, EngineConfig(num_kv_blocks=96, max_model_len=512, max_num_batched_tokens=64,
                                                 max_num_seqs=4, speculative=spec))
            if spec is not None and not graphs:
                eng.spec.graphs = None
            for i, p in enumerate(prompts):
                n = (16, 48, 48)[i]          # one request ends early: batches of 3, then 2
                eng.add_request(f"r{i}", p, SamplingParams(temperature=0.0, max_tokens=n, ignore_eos=True))
            out = {f"r{i}": [] for i in range(len(prompts))}
            while eng.has_unfinished_requests():
                for o in eng.step():
                    out[o.request_id] += o.new_token_ids
            vg = eng.spec.graphs.describe() if spec is not None and eng.spec.graphs is not None else None
            return [out[f"r{i}"] for i in range(len(prompts))], eng.stats(), vg

        ref, _, _ = run(None)
        total = sum(map(len, ref))
        for spec in SPECS:
            on, st, vg = run(spec)
            off, _, _ = run(spec, graphs=False)
            replayed = bool(vg and vg["replays"] > 0)
            for name, got in (("graphs on", on), ("graphs off", off)):
                same = sum(a == b for x, y in zip(got, ref) for a, b in zip(x, y))
                ok = got == ref
                bad += (not ok) and dtype == "float32"
                print(f"{dtype} {spec} verify {name}: {'equal' if ok else 'DIFFERENT'} to plain decode "
                      f"({same}/{total} tokens)")
            print(f"   graphs on == off: {on == off}; verify graphs {vg}; accepted "
                  f"{st['spec_num_accepted_tokens']}/{st['spec_num_draft_tokens']}")
            bad += (not replayed) + ((on != off) and dtype == "float32")
        del loaded
        if device == "cuda":
            torch.cuda.empty_cache()
    return bad


def timing(shape: str, quant: str, batches: list[int], context: int, steps: int, device: str = "cuda") -> None:
    sys.path.insert(0, str(Path(__file__).resolve().parents[2] / "benchmarks"))
    import speculative as bench  # benchmarks/speculative.py

    from g906.bench.synthetic import build_synthetic

    dev = torch.device(device)
    # the CPU smoke run: the benchmark's tiny shape
    loaded = build_synthetic(shape, quant=quant, device=dev, overrides=None if dev.type == "cuda" else bench.QUICK_SHAPE)
    bench.attach_random_mtp(loaded)
    from g906.engine.spec import decoder

    decoder.propose_ngram = lambda ids, k, lo, hi: [ids[-1]] * k     # k drafts every step
    print(f"{shape} {quant} on {torch.cuda.get_device_name(dev) if dev.type == 'cuda' else dev}, context {context}")
    print("| batch | method | k | decode ms | step ms graphs | verify ms graphs | x decode | step ms eager | "
          "verify ms eager | x decode | verify speedup |")
    print("|---|---|---|---|---|---|---|---|---|---|---|")
    for batch in batches:
        base = bench.measure(loaded, None, batch=batch, context=context, steps=steps, dev=dev)["step_ms"]
        for method in ("mtp", "ngram"):
            for k in (1, 2, 3):
                spec = {"method": method, "num_speculative_tokens": k}
                g = bench.measure(loaded, spec, batch=batch, context=context, steps=steps, dev=dev, verify_graphs=True)
                e = bench.measure(loaded, spec, batch=batch, context=context, steps=steps, dev=dev, verify_graphs=False)
                if not g["verify_graphs"]:
                    print(f"(batch {batch} {method} k={k}: the verify graphs were not replayed)")
                print(f"| {batch} | {method} | {k} | {base:.2f} | {g['step_ms']:.2f} | {g['verify_ms']:.2f} | "
                      f"{g['verify_ms'] / base:.2f}x | {e['step_ms']:.2f} | {e['verify_ms']:.2f} | "
                      f"{e['verify_ms'] / base:.2f}x | {e['verify_ms'] / g['verify_ms']:.2f}x |")


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--skip-timing", action="store_true")
    ap.add_argument("--device", default="cuda", help="cpu: a smoke run of the script (no graphs there: it fails)")
    ap.add_argument("--shape", default="qwen3.5-9b")
    ap.add_argument("--quant", default="q4_k")
    ap.add_argument("--batches", default="1,4")
    ap.add_argument("--context", type=int, default=512)
    ap.add_argument("--steps", type=int, default=32)
    args = ap.parse_args(argv)
    bad = equality(args.device)
    if not args.skip_timing:
        timing(args.shape, args.quant, [int(b) for b in args.batches.split(",")], args.context, args.steps,
               args.device)
    print("FAILED" if bad else "OK")
    return 1 if bad else 0


if __name__ == "__main__":
    raise SystemExit(main())
