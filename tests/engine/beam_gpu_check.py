"""GPU check of beam search (run by hand on a GPU machine, not by pytest): beams decoded on the
decode graphs (pipelined requests beside them), with room to spare and with a cache too small
for all beams at once, against the CPU engine's beams, on builtin:tiny-qwen35 in float32
(token for token) and float16 (reported: a near-tie may round the other way).

    python -m tests.engine.beam_gpu_check
"""

from __future__ import annotations

import sys

import torch

from g906.engine.llm_engine import EngineConfig, LLMEngine
from g906.engine.loader import load_model
from g906.engine.sampling_params import SamplingParams

SOURCE = "builtin:tiny-qwen35"
PROMPTS = [[(29 * j + 5 * i) % 500 + 5 for j in range(7 + 13 * i)] for i in range(3)]


def run(eng: LLMEngine) -> dict[str, list[int]]:
    for i, p in enumerate(PROMPTS):
        eng.add_request(f"b{i}", p, SamplingParams(n=3 + i, use_beam_search=True, temperature=0.0, max_tokens=24,
                                                   ignore_eos=True, length_penalty=0.8))
        eng.add_request(f"g{i}", p[:5], SamplingParams(temperature=0.0, max_tokens=40, ignore_eos=True))
    out: dict[str, list[int]] = {}
    while eng.has_unfinished_requests():
        for o in eng.step():
            out.setdefault(o.request_id, []).extend(o.new_token_ids)
    s = eng.stats()
    assert s["kv_blocks_used"] == 0 and s["state_slots_used"] == 0, s
    return out


def main() -> int:
    if not torch.cuda.is_available():
        print("no GPU")
        return 2
    bad = 0
    for dtype in ("float32", "float16"):
        cpu = run(LLMEngine(load_model(SOURCE, dtype=dtype, device="cpu", progress=False),
                            EngineConfig(max_num_seqs=16, num_kv_blocks=128, block_size=16)))
        lm = load_model(SOURCE, dtype=dtype, device="cuda", progress=False)
        for blocks in (128, 12):
            eng = LLMEngine(lm, EngineConfig(max_num_seqs=16, num_kv_blocks=blocks, block_size=16))
            gpu = run(eng)
            same = sum(gpu[k] == cpu[k] for k in cpu)
            print(f"{dtype} blocks={blocks}: {same}/{len(cpu)} outputs equal the CPU's; "
                  f"preemptions {eng.scheduler.num_preemptions}, lookahead steps {eng.num_lookahead_steps}, "
                  f"graphs {eng.runner.graphs is not None}")
            if dtype == "float32" and same != len(cpu):
                bad += 1
    return 1 if bad else 0


if __name__ == "__main__":
    sys.exit(main())
