"""Scheduler behaviour, driven step by step without a model (the step's effect on a sequence
is plain bookkeeping: the chunk becomes cached, and a sequence that reached its end gains a token)."""

from g906.engine.block_manager import CacheManager
from g906.engine.sampling_params import SamplingParams
from g906.engine.scheduler import Scheduler, SchedulerConfig
from g906.engine.sequence import Sequence, SequenceStatus


def make(max_num_seqs=4, max_batched=32, max_len=256, blocks=64, bs=4, slots=None):
    cm = CacheManager(blocks, bs, slots or max_num_seqs)
    return Scheduler(SchedulerConfig(max_num_seqs, max_batched, max_len), cm), cm


def seq(rid, n, max_tokens=4):
    return Sequence(rid, list(range(1, n + 1)), SamplingParams(max_tokens=max_tokens))


def run_step(sch, log=None):
    batch = sch.schedule()
    if batch is None:
        return None
    for i, s in enumerate(batch.seqs):
        samples = batch.samples(i)
        s.num_cached_tokens += batch.num_new_tokens[i]
        if samples:
            s.append_token(7)
    for s in list(batch.seqs):
        if s.num_output_tokens >= s.params.max_tokens:
            sch.finish(s, "length")
    if log is not None:
        log.append(batch)
    return batch


def drain(sch, limit=10_000):
    log = []
    for _ in range(limit):
        if not sch.has_unfinished():
            return log
        run_step(sch, log)
    raise AssertionError("did not finish")


def test_prefill_then_decode_and_everything_freed():
    sch, cm = make()
    a, b = seq("a", 5), seq("b", 9)
    sch.add(a)
    sch.add(b)
    log = drain(sch)
    assert log[0].is_prefill and [s.request_id for s in log[0].seqs] == ["a", "b"]
    assert log[0].num_new_tokens == [5, 9]
    assert all(not b_.is_prefill for b_ in log[1:])
    assert a.num_output_tokens == 4 and b.num_output_tokens == 4
    assert cm.blocks.num_used_blocks == 0 and cm.slots.num_used == 0
    assert a.status is SequenceStatus.FINISHED and a.finish_reason == "length"


def test_chunked_prefill_respects_budget_and_fixed_boundaries():
    sch, cm = make(max_batched=8)
    a = seq("a", 20, max_tokens=2)
    sch.add(a)
    log = drain(sch)
    prefill = [b for b in log if b.is_prefill]
    assert [b.num_new_tokens for b in prefill] == [[8], [8], [4]]
    assert all(b.num_tokens <= 8 for b in log)
    # a second sequence never splits another's chunk at a different boundary
    sch, cm = make(max_batched=8)
    b, c = seq("b", 3, max_tokens=1), seq("c", 20, max_tokens=1)
    sch.add(b)
    sch.add(c)
    log = drain(sch)
    chunks_c = [bt.num_new_tokens[bt.seqs.index(c)] for bt in log if c in bt.seqs and bt.is_prefill]
    assert chunks_c == [8, 8, 4]


def test_fifo_admission_and_max_num_seqs():
    sch, cm = make(max_num_seqs=2)
    seqs = [seq(f"s{i}", 3, max_tokens=3) for i in range(5)]
    for s in seqs:
        sch.add(s)
    first = sch.schedule()
    assert [s.request_id for s in first.seqs] == ["s0", "s1"]
    assert sch.num_running == 2 and sch.num_waiting == 3
    for i, s in enumerate(first.seqs):
        s.num_cached_tokens += first.num_new_tokens[i]
        s.append_token(7)
    finished = []
    while sch.has_unfinished():
        run_step(sch)
        for s in seqs:
            if s.is_finished and s.request_id not in finished:
                finished.append(s.request_id)
    assert finished == ["s0", "s1", "s2", "s3", "s4"]


def test_fifo_big_head_blocks_later_small_ones():
    sch, cm = make(max_batched=8, blocks=5, bs=4)  # 20 token slots
    a = seq("a", 12, max_tokens=6)
    sch.add(a)
    run_step(sch)  # a: first chunk
    big, small = seq("big", 16, max_tokens=1), seq("small", 2, max_tokens=1)
    sch.add(big)
    sch.add(small)
    b = sch.schedule()
    # "big" cannot be admitted (not enough blocks): "small" must not overtake it
    assert [s.request_id for s in b.seqs] == ["a"]


def test_preemption_by_recompute_completes_everything():
    # 6 blocks of 4 tokens = 24 slots; three sequences that each grow to 6+10 = 16 tokens
    sch, cm = make(max_num_seqs=3, blocks=6, bs=4, max_len=64)
    seqs = [seq(f"s{i}", 6, max_tokens=10) for i in range(3)]
    for s in seqs:
        sch.add(s)
    log = drain(sch)
    assert sch.num_preemptions > 0
    assert any(b.preempted for b in log)
    assert all(s.num_output_tokens == 10 for s in seqs)
    assert cm.blocks.num_used_blocks == 0 and cm.slots.num_used == 0
    # a preempted sequence is prefilled again over prompt + generated tokens
    pre = [b for b in log if b.preempted][0].preempted[0]
    assert pre.num_preemptions >= 1


def test_state_slots_bound_running():
    sch, cm = make(max_num_seqs=4, slots=2)
    for i in range(3):
        sch.add(seq(f"s{i}", 3))
    b = sch.schedule()
    assert len(b.seqs) == 2 and cm.slots.num_used == 2


def test_abort_anywhere_frees_at_once():
    sch, cm = make(max_batched=8)
    a, b, c = seq("a", 20), seq("b", 3), seq("c", 3)
    for s in (a, b, c):
        sch.add(s)
    run_step(sch)  # a mid-prefill
    assert a.status is SequenceStatus.RUNNING and a.num_cached_tokens == 8
    sch.abort(a)  # mid-prefill
    sch.abort(c)  # waiting
    assert a.finish_reason == "abort" and c.is_finished
    assert cm.blocks.num_used_blocks == 0 or b.block_table
    drain(sch)
    assert cm.blocks.num_used_blocks == 0 and cm.slots.num_used == 0
    sch.abort(b)  # finished: no-op
    assert b.finish_reason == "length"


def test_abort_during_decode():
    sch, cm = make()
    a, b = seq("a", 3, max_tokens=50), seq("b", 3, max_tokens=50)
    sch.add(a)
    sch.add(b)
    for _ in range(4):
        run_step(sch)
    sch.abort(a)
    batch = sch.schedule()
    assert batch.seqs == [b]
    sch.abort(b)
    assert cm.blocks.num_used_blocks == 0 and cm.slots.num_used == 0 and not sch.has_unfinished()


def test_can_admit_matches_what_schedule_then_does():
    """can_admit() is admission's test without its effects: a place, a state slot, blocks."""
    sch, cm = make(max_num_seqs=2, blocks=6, bs=4)
    assert not sch.can_admit()                          # nothing waits
    sch.add(seq("a", 8))
    sch.add(seq("b", 8))
    sch.add(seq("c", 8))
    assert sch.can_admit()
    run_step(sch)                                       # admits a and b (2 places)
    assert sch.num_running == 2 and not sch.can_admit()
    sch.finish(sch.running[0], "stop")
    assert sch.can_admit()                              # a place, a slot and blocks again
    before = (sch.num_running, sch.num_waiting)
    sch.can_admit()
    assert (sch.num_running, sch.num_waiting) == before  # no effect
    batch = sch.schedule()
    assert batch.is_prefill and [s.request_id for s in batch.seqs] == ["c"]
    big = make(max_num_seqs=4, blocks=3, bs=4)[0]
    big.add(seq("long", 20))                            # needs 5 blocks of 4: never fits
    assert not big.can_admit() and big.schedule() is None
