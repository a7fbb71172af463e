"""Prefix caching at TP=2 (gloo): every rank restores and snapshots the same state slots and
reads the same cached blocks, so greedy outputs with the cache on equal those with it off."""

from __future__ import annotations

from tests.engine.prefix_workloads import assert_no_leaks, run_workload


def test_tp2_cache_on_equals_cache_off(tp_sources):
    from g906.engine.parallel import load_model_tp

    loaded = load_model_tp(tp_sources["gguf-q8_0"], tensor_parallel_size=2, device="cpu", dtype="float32",
                           progress=False)
    try:
        want, _, off = run_workload(loaded, seed=2, on=False, small_pool=True)
        got, cached, on = run_workload(loaded, seed=2, on=True, small_pool=True)
        assert got == want
        s = on.stats()
        assert s["prefix_cache_hit_tokens"] > 0 and s["prefix_snapshot_evictions"] > 0
        assert_no_leaks(on)
    finally:
        loaded.model.close()
