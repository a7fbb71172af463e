"""Prefix caching (g906/engine/prefix_cache.py): the bookkeeping on its own (keys, parking,
eviction, snapshots), and the engine with the cache on giving the same greedy tokens as with it
off over randomized multi-turn and shared-prefix workloads, sequential and concurrent, with a pool
small enough to force evictions, on HF and GGUF (F16, Q8_0, Q4_K) weights; n > 1 siblings
prefill their prompt once."""

from __future__ import annotations

import pytest

from g906.engine.block_manager import CacheManager
from g906.engine.llm_engine import EngineConfig, LLMEngine
from g906.engine.prefix_cache import PrefixCache, last_inner_boundary
from g906.engine.sampling_params import SamplingParams
from g906.engine.scheduler import Scheduler, SchedulerConfig
from g906.engine.sequence import Sequence

from .conftest import build_tiny_qwen35
from .gguf_writer import write_gguf
from .prefix_workloads import assert_no_leaks, drain, run_workload
from .test_gguf_loader import KQ_OVERRIDES

BS = 4


def _cache(blocks=16, snaps=4, stride=0, seqs=2):
    cm = CacheManager(blocks, BS, seqs)
    pc = PrefixCache(cm.blocks, list(range(100, 100 + snaps)), stride=stride, salt="test")
    return cm, pc, Scheduler(SchedulerConfig(seqs, 64, 256), cm, pc)


def _seq(rid, toks, max_tokens=2):
    return Sequence(rid, list(toks), SamplingParams(max_tokens=max_tokens))


def _run(sch, pc, seq, out_tokens=(7, 8)):
    """Drive seq to its end the way the engine does (without a model): cached counts advance,
    saves are committed after each step, a token is appended when the step reaches the end."""
    sch.add(seq)
    batches = []
    while not seq.is_finished:
        batch = sch.schedule()
        batches.append(batch)
        for i, s in enumerate(batch.seqs):
            sampled = batch.samples(i)       # (as the runner sees it: before the step's tokens count)
            s.num_cached_tokens += batch.num_new_tokens[i]
            if sampled:
                s.append_token(out_tokens[min(s.num_output_tokens, len(out_tokens) - 1)])
            pc.register(s)
        for save in batch.saves:
            pc.commit(save)
        for s in list(batch.seqs):
            if s.num_output_tokens >= s.params.max_tokens:
                sch.finish(s, "length")
    return batches


def test_a_prompt_end_snapshot_lets_the_next_turn_resume_there():
    cm, pc, sch = _cache()
    first = list(range(1, 15))                     # 14 tokens: the prompt end rounds down to 12
    b = _run(sch, pc, _seq("a", first))
    assert b[0].num_new_tokens == [12] and b[1].num_new_tokens == [2]   # cut at the save point
    assert [s.position for s in b[0].saves] == [12]
    assert cm.blocks.num_used_blocks == 0 and len(pc.parked) == 3       # 15 tokens computed: 3 full blocks
    nxt = _seq("b", first + [7, 8, 40, 41, 42])
    batches = _run(sch, pc, nxt)
    # resumed at 12; the chunk stops at this prompt's own end point (16)
    assert nxt.num_hit_tokens == 12 and batches[0].restores and batches[0].num_new_tokens == [4]
    assert pc.hit_tokens == 12 and pc.queried_tokens == 14 + 19


def test_keys_chain_over_tokens_and_images():
    cm, pc, _ = _cache()
    a, b = _seq("a", range(1, 13)), _seq("b", [1, 2, 3, 4, 9, 6, 7, 8, 9, 10, 11, 12])
    ka, kb = pc.keys(a, 3), pc.keys(b, 3)
    assert ka[0] == kb[0] and ka[1] != kb[1] and ka[2] != kb[2]       # a change carries forward
    assert len(pc.keys(_seq("c", [1, 2, 3, 4, 5, -1, 7, 8]), 2)) == 1  # an unread token stops it
    other = PrefixCache(CacheManager(4, BS, 1).blocks, [], salt="another model")
    assert other.keys(_seq("a", range(1, 13)), 1)[0] != ka[0]


def test_parked_blocks_count_as_free_and_are_evicted_lru():
    cm, pc, sch = _cache(blocks=8, snaps=2)
    _run(sch, pc, _seq("a", range(1, 11)))          # 10 + 2 tokens: 3 blocks, 2 registered
    _run(sch, pc, _seq("b", range(50, 60)))
    assert cm.blocks.num_free_blocks == 8 and len(pc.parked) >= 4
    evicted_before = pc.block_evictions
    _run(sch, pc, _seq("c", range(100, 121)))       # 21 tokens + 2: 6 blocks, 4 of them free
    assert pc.block_evictions > evicted_before
    # the oldest ("a") went first: "b"'s prompt still resumes
    probe = _seq("b2", list(range(50, 60)) + [1])
    assert pc.lookup(probe).num_tokens == 8
    assert pc.lookup(_seq("a2", list(range(1, 11)) + [1])).num_tokens == 0


def test_snapshot_pool_keeps_prompt_ends_longest():
    cm, pc, sch = _cache(blocks=64, snaps=2, stride=4)
    _run(sch, pc, _seq("a", range(1, 18)))          # stride points 4, 8, 12 and the end at 16
    kinds = {k for k, d in pc.snaps.items() if d}
    assert "end" in kinds and pc.snapshot_evictions > 0
    assert pc.lookup(_seq("a2", list(range(1, 18)) + [5])).num_tokens == 16


def test_stride_snapshots_resume_a_shared_head():
    cm, pc, sch = _cache(blocks=64, snaps=8, stride=8)
    _run(sch, pc, _seq("a", range(1, 30)))
    probe = _seq("b", list(range(1, 20)) + [99] * 5)   # shares 19 tokens: the stride point 16
    assert pc.lookup(probe).num_tokens == 16


def test_a_shared_head_gets_a_snapshot_where_a_prompt_leaves_it():
    cm, pc, sch = _cache(blocks=64, snaps=8)
    head = list(range(1, 22))                          # 21 shared tokens: 5 whole blocks
    _run(sch, pc, _seq("a", head + [90, 91, 92, 93, 94, 95]))     # snapshot at its end (24) only
    b = _seq("b", head + [70, 71, 72, 73, 74, 75, 76])
    batches = _run(sch, pc, b)
    assert b.num_hit_tokens == 0 and b.prefix_branch == 20          # no snapshot inside the head yet
    assert batches[0].num_new_tokens == [20] and batches[0].saves[0].position == 20
    c = _seq("c", head + [50, 51, 52, 53, 54])
    _run(sch, pc, c)
    assert c.num_hit_tokens == 20                      # the third prompt on the head resumes there


def test_forget_drops_everything():
    cm, pc, sch = _cache()
    _run(sch, pc, _seq("a", range(1, 15)))
    pc.forget()
    assert not pc.parked and pc.num_snapshots == 0 and cm.blocks.num_free_blocks == 16
    assert pc.lookup(_seq("b", list(range(1, 15)) + [3])).num_tokens == 0


def test_bad_stride_is_refused():
    with pytest.raises(ValueError, match="multiple of the block size"):
        PrefixCache(CacheManager(4, BS, 1).blocks, [], stride=6)


# -- the engine: cache on == cache off ------------------------------------------------------------

@pytest.fixture(scope="module")
def sources(tiny_qwen35_hf_dir, tiny_qwen35_hf_model, tmp_path_factory):
    d = tmp_path_factory.mktemp("prefix-cache-models")
    kq = build_tiny_qwen35(seed=3, **KQ_OVERRIDES)
    return {
        "hf": str(tiny_qwen35_hf_dir),
        "gguf-F16": str(write_gguf(tiny_qwen35_hf_model, d / "tiny-F16.gguf", qtype="F16")[0]),
        "gguf-Q8_0": str(write_gguf(tiny_qwen35_hf_model, d / "tiny-Q8_0.gguf", qtype="Q8_0")[0]),
        "gguf-Q4_K": str(write_gguf(kq, d / "kq-Q4_K.gguf", qtype="Q4_K", strict=True)[0]),
    }


@pytest.mark.parametrize("source", ["hf", "gguf-F16", "gguf-Q8_0", "gguf-Q4_K"])
def test_cache_on_equals_cache_off(sources, source, torch_one_thread):
    from g906.engine.loader import load_model

    loaded = load_model(sources[source], dtype="float32", device="cpu", progress=False)
    for seed, small in ((0, True), (1, False)):
        want, _, off = run_workload(loaded, seed=seed, on=False, small_pool=small)
        got, cached, on = run_workload(loaded, seed=seed, on=True, small_pool=small)
        assert got == want, f"{source} seed {seed}: outputs differ with the prefix cache on"
        s = on.stats()
        assert s["prefix_cache_hit_tokens"] > 0 and sum(cached.values()) == s["prefix_cache_hit_tokens"]
        assert any(cached[f"turn{i}"] for i in range(1, 5))           # later turns resume
        if small:
            assert s["prefix_cache_block_evictions"] > 0 and s["prefix_snapshot_evictions"] > 0
        assert s["prompt_tokens"] < off.stats()["prompt_tokens"]       # less was prefilled
        assert_no_leaks(on)
        assert_no_leaks(off)


def test_pipelined_padded_decode_with_the_cache_equals_the_plain_engine(torch_one_thread):
    """The GPU's decode call site (padded, pipelined: step N+1 queued before step N is read; run
    eagerly on the CPU): decode-time snapshots are copied at launch and keyed a step later."""
    from g906.engine.loader import load_model

    from .padded_decode import padded_decode

    lm = load_model("builtin:tiny-qwen35", dtype="float32", device="cpu", progress=False)

    def pipelined(eng):
        eng.runner.graphs = padded_decode(eng, lm, max_num_seqs=4)[0]

    want, _, _ = run_workload(lm, seed=5, on=False, small_pool=False)
    got, cached, eng = run_workload(lm, seed=5, on=True, small_pool=False, prepare=pipelined)
    assert got == want
    s = eng.stats()
    assert eng.num_lookahead_steps > 0 and s["prefix_cache_hit_tokens"] > 0
    assert_no_leaks(eng)


def test_n_siblings_and_a_repeat_share_the_prompt(torch_one_thread):
    from g906 import LLM

    with LLM("builtin:tiny-qwen35", block_size=4, num_kv_blocks=64, max_num_batched_tokens=32) as llm:
        prompt = list(range(3, 40))
        p = SamplingParams(temperature=0.0, ignore_eos=True, max_tokens=5, n=3)
        first = llm.generate([prompt], p)[0]
        again = llm.generate([prompt], p)[0]
        assert [o.token_ids for o in first.outputs] == [o.token_ids for o in again.outputs]
        assert len({tuple(o.token_ids) for o in first.outputs}) == 1
        s = llm.engine.stats()
        assert s["prefix_cache_hit_tokens"] >= 3 * 36    # the repeat's three children
        assert_no_leaks(llm.engine)
    with LLM("builtin:tiny-qwen35", block_size=4, num_kv_blocks=64, enable_prefix_caching=False) as off:
        assert off.engine.prefix is None and "prefix_cache_hit_tokens" not in off.engine.stats()
        assert [o.token_ids for o in off.generate([prompt], p)[0].outputs] == [o.token_ids for o in first.outputs]


@pytest.fixture(scope="module")
def builtin_tiny():
    from g906.engine.loader import load_model

    return load_model("builtin:tiny-qwen35", dtype="float32", device="cpu", progress=False)


@pytest.mark.parametrize("prompt_len", [37, 36], ids=["partial-last-block", "full-last-block"])
def test_n_siblings_prefill_the_prompt_once(builtin_tiny, prompt_len, torch_one_thread):
    """n = 4 children admitted together: the first prefills the prompt, the others wait for it
    and resume at its last inner block boundary (computing only the tokens after it); outputs
    equal those of the cache off, where each child prefills the whole prompt."""
    bs = 4
    resume = last_inner_boundary(prompt_len, bs)
    runs = {}
    for on in (True, False):
        eng = LLMEngine(builtin_tiny, EngineConfig(block_size=bs, num_kv_blocks=96, max_num_batched_tokens=64,
                                                   max_model_len=128, enable_prefix_caching=on))
        for name, first, p in (("greedy", 3, SamplingParams(temperature=0.0, ignore_eos=True, max_tokens=6, n=4)),
                               ("seeded", 60, SamplingParams(temperature=1.0, top_p=0.95, seed=11, ignore_eos=True,
                                                             max_tokens=6, n=4))):
            before = eng.stats()["prompt_tokens"]
            hits = eng.stats().get("prefix_cache_hit_tokens", 0)
            for i in range(4):
                eng.add_request(f"{name}:{i}", list(range(first, first + prompt_len)), p.for_child(i))
            out: dict[str, list[int]] = {}
            cached: dict[str, int] = {}
            drain(eng, out, cached)
            runs[on, name] = [out[f"{name}:{i}"] for i in range(4)]
            prefilled = eng.stats()["prompt_tokens"] - before
            if on:
                # the children after the first took `resume` tokens from the cache; the prompt's
                # last tokens may run in a decode step (one uncached token), not counted here
                assert [cached[f"{name}:{i}"] for i in range(4)] == [0, resume, resume, resume]
                assert resume <= prefilled <= prompt_len + 3 * (prompt_len - resume), name
                assert eng.stats()["prefix_cache_hit_tokens"] - hits == 3 * resume
            else:
                assert prefilled == 4 * prompt_len
        assert_no_leaks(eng)
    assert runs[True, "greedy"] == runs[False, "greedy"] and len({tuple(o) for o in runs[True, "greedy"]}) == 1
    assert runs[True, "seeded"] == runs[False, "seeded"] and len({tuple(o) for o in runs[True, "seeded"]}) > 1
