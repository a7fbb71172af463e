"""GPU check of speculative decoding (run by hand on a GPU machine, not by pytest): greedy
outputs with MTP (k = 1, 3) and n-gram against the plain engine (decode graphs) on the tiny
Markov-like model of spec_models.py, in float32 and float16; prints matches and acceptance.

    python -m tests.engine.spec_gpu_check

The verify step runs the prefill kernels where plain decode replays the decode graphs: in
float16 the two paths round differently, so a near-tie may flip a greedy token (float32 should
match token for token)."""

from __future__ import annotations

import tempfile
from pathlib import Path

import torch

from g906.engine.llm_engine import EngineConfig, LLMEngine
from g906.engine.loader import load_model
from g906.engine.sampling_params import SamplingParams

from .conftest import random_prompt
from .spec_models import markov_mtp_dir


def main() -> int:
    d = markov_mtp_dir(Path(tempfile.mkdtemp()))
    prompts = [random_prompt(5, 1), random_prompt(23, 2), random_prompt(40, 3)]
    bad = 0
    for dtype in ("float32", "float16"):
        loaded = load_model(str(d), dtype=dtype, device="cuda", progress=False, keep_mtp=True)

        def run(spec):
            eng = LLMEngine(loaded, EngineConfig(num_kv_blocks=96, max_model_len=512, max_num_batched_tokens=16,
                                                 speculative=spec))
            for i, p in enumerate(prompts):
                eng.add_request(f"r{i}", p, SamplingParams(temperature=0.0, max_tokens=48, ignore_eos=True))
            out = {f"r{i}": [] for i in range(len(prompts))}
            while eng.has_unfinished_requests():
                for o in eng.step():
                    out[o.request_id] += o.new_token_ids
            return [out[f"r{i}"] for i in range(len(prompts))], eng.stats()

        ref, _ = run(None)
        for spec in ({"method": "mtp", "num_speculative_tokens": 1}, {"method": "mtp", "num_speculative_tokens": 3},
                     {"method": "ngram", "num_speculative_tokens": 3, "prompt_lookup_min": 1, "prompt_lookup_max": 3}):
            got, st = run(spec)
            same = sum(a == b for x, y in zip(got, ref) for a, b in zip(x, y))
            ok = got == ref
            bad += (not ok) and dtype == "float32"
            print(f"{dtype} {spec}: {'equal' if ok else 'DIFFERENT'} ({same}/{sum(map(len, ref))} tokens), "
                  f"accepted {st['spec_num_accepted_tokens']}/{st['spec_num_draft_tokens']}, "
                  f"mean acceptance length {st['spec_mean_acceptance_length']}")
        del loaded
        torch.cuda.empty_cache()
    return 1 if bad else 0


if __name__ == "__main__":
    raise SystemExit(main())
