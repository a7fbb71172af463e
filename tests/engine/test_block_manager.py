import pytest

from g906.engine.block_manager import BlockManager, CacheManager, OutOfBlocks, StateSlotPool
from g906.engine.sampling_params import SamplingParams
from g906.engine.sequence import Sequence


def seq(n=5, rid="r"):
    return Sequence(rid, list(range(1, n + 1)), SamplingParams())


def test_cover_allocates_whole_blocks_and_release_returns_them():
    bm = BlockManager(num_blocks=4, block_size=4)
    s = seq(5)
    bm.cover(s, 5)
    assert len(s.block_table) == 2 and bm.num_free_blocks == 2
    bm.cover(s, 8)  # still two blocks
    assert len(s.block_table) == 2
    bm.cover(s, 9)
    assert len(s.block_table) == 3 and bm.num_free_blocks == 1
    assert bm.slot(s, 0) == s.block_table[0] * 4
    assert bm.slot(s, 6) == s.block_table[1] * 4 + 2
    bm.release(s)
    assert s.block_table == [] and bm.num_free_blocks == 4 and bm.ref_counts == [0] * 4


def test_cover_is_all_or_nothing():
    bm = BlockManager(num_blocks=2, block_size=4)
    s = seq()
    with pytest.raises(OutOfBlocks):
        bm.cover(s, 9)
    assert s.block_table == [] and bm.num_free_blocks == 2
    assert not bm.can_cover(s, 9) and bm.can_cover(s, 8)


def test_shared_blocks_free_only_when_last_holder_releases():
    bm = BlockManager(num_blocks=3, block_size=2)
    a, b = seq(4, "a"), seq(4, "b")
    bm.cover(a, 4)
    bm.share(b, a.block_table[:1])
    assert bm.ref_counts[a.block_table[0]] == 2
    shared = a.block_table[0]
    bm.release(a)
    assert bm.num_free_blocks == 2 and bm.ref_counts[shared] == 1
    bm.release(b)
    assert bm.num_free_blocks == 3
    with pytest.raises(ValueError):
        bm.share(b, [shared])


def test_state_slot_pool():
    pool = StateSlotPool(2)
    a, b, c = seq(rid="a"), seq(rid="b"), seq(rid="c")
    sa, sb = pool.acquire(a), pool.acquire(b)
    assert {sa, sb} == {0, 1} and pool.acquire(a) == sa
    with pytest.raises(OutOfBlocks):
        pool.acquire(c)
    pool.release(a)
    assert a.state_slot is None and pool.acquire(c) == sa
    pool.release(a)  # releasing twice is harmless
    assert pool.num_used == 2


def test_cache_manager_frees_both():
    cm = CacheManager(num_blocks=4, block_size=4, num_state_slots=2)
    s = seq(6)
    cm.blocks.cover(s, 6)
    cm.slots.acquire(s)
    s.num_cached_tokens = 6
    cm.free(s)
    assert cm.blocks.num_used_blocks == 0 and cm.slots.num_used == 0 and s.num_cached_tokens == 0
