"""Workloads for the prefix-cache equivalence tests: randomized multi-turn conversations and
shared-prefix batches, run on an LLMEngine with the cache on and with it off; greedy outputs must
agree token for token.

    outs, eng = run_workload(loaded, seed=0, on=True, small_pool=True)"""

from __future__ import annotations

import dataclasses
import random

from g906.engine.llm_engine import EngineConfig, LLMEngine
from g906.engine.sampling_params import SamplingParams


def config(on: bool, *, small_pool: bool, block_size: int = 4, speculative=None) -> EngineConfig:
    # a small cache forces block and snapshot evictions; chunks of 24 tokens cut long prompts
    return EngineConfig(max_num_seqs=4, max_num_batched_tokens=24, max_model_len=256, block_size=block_size,
                        num_kv_blocks=48 if small_pool else 160, enable_prefix_caching=on,
                        prefix_state_stride=16, num_prefix_snapshots=3 if small_pool else 24,
                        speculative=speculative)


class IdText:
    """A tokenizer for models saved without one: a token's text is its id."""

    def decode(self, ids, skip_special_tokens: bool = True) -> str:
        return "".join(f"<{i}>" for i in ids)


def with_tokenizer(loaded):
    return loaded if loaded.tokenizer is not None else dataclasses.replace(loaded, tokenizer=IdText())


def drain(eng: LLMEngine, out: dict[str, list[int]], cached: dict[str, int]) -> None:
    while eng.has_unfinished_requests():
        for o in eng.step():
            out.setdefault(o.request_id, []).extend(o.new_token_ids)
            cached[o.request_id] = o.num_cached_tokens


def run_workload(loaded, *, seed: int, on: bool, small_pool: bool, vocab: int | None = None,
                 engine_kw: dict | None = None, prepare=None, speculative=None, max_tokens: int = 6):
    """Outputs {request id: token ids}, the prompt tokens each request had cached, the engine.
    prepare(engine): called once the engine is built (to switch its runner's decode path);
    speculative: the engine's speculative_config (None: off)."""
    eng = LLMEngine(with_tokenizer(loaded), config(on, small_pool=small_pool, speculative=speculative),
                    **(engine_kw or {}))
    if prepare is not None:
        prepare(eng)
    vocab = vocab or loaded.config.vocab_size
    rng = random.Random(seed)

    def toks(n):
        return [rng.randrange(vocab - 1) for _ in range(n)]

    greedy = SamplingParams(temperature=0.0, ignore_eos=True, max_tokens=max_tokens)
    out: dict[str, list[int]] = {}
    cached: dict[str, int] = {}
    # sequential multi-turn: each turn re-sends the conversation, with the previous answer (a
    # plain chat) or without it (a template that drops the previous turn's reasoning)
    conv = toks(rng.randrange(20, 40))
    for turn in range(5):
        rid = f"turn{turn}"
        eng.add_request(rid, conv, greedy)
        drain(eng, out, cached)
        keep_answer = rng.random() < 0.5
        conv = conv + (out[rid] if keep_answer else []) + toks(rng.randrange(3, 12))
    # concurrent shared prefixes: a burst of requests on one system prompt, then a second wave
    # while the first still runs, and exact repeats
    system = toks(rng.randrange(18, 30))
    prompts = [system + toks(rng.randrange(1, 10)) for _ in range(5)]
    for i, p in enumerate(prompts[:3]):
        eng.add_request(f"burst{i}", p, greedy)
    for _ in range(3):
        for o in eng.step():
            out.setdefault(o.request_id, []).extend(o.new_token_ids)
            cached[o.request_id] = o.num_cached_tokens
    for i, p in enumerate(prompts[3:] + [prompts[0], system], start=3):
        eng.add_request(f"burst{i}", p, greedy)
    drain(eng, out, cached)
    return out, cached, eng


def assert_no_leaks(eng: LLMEngine) -> None:
    s = eng.stats()
    assert s["kv_blocks_used"] == 0 and s["state_slots_used"] == 0
    if eng.prefix is not None:
        assert s["prefix_snapshots_pending"] == 0
        assert all(r == 0 for r in eng.cache.blocks.ref_counts)
