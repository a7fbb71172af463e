"""The scheduler: continuous batching with chunked prefill and preemption by recompute.

Each step is either a prefill step (chunks of prompts, bounded by max_num_batched_tokens) or a
decode step (one token for every running sequence that has finished its prefill).

- Prefill goes first: sequences part-way through a chunked prefill continue, then waiting
  sequences are admitted in arrival order (FIFO: the first one that does not fit stops
  admission, later ones never overtake it). Admission needs a free state slot, room under
  max_num_seqs, and KV blocks for every token the sequence has.
- A sequence's chunks are always min(remaining, max_num_batched_tokens) long, so its chunk
  boundaries do not depend on what else is in the batch (outputs do not depend on batching).
- Decode grows each running sequence's block table by one token. When blocks run out the
  newest running sequence is preempted: its blocks and state slot are freed and it goes back to
  the front of the queue, to be prefilled again (prompt + tokens generated so far).
- abort() removes a sequence from wherever it is and frees what it holds at once.
- With a prefix cache (g906/engine/prefix_cache.py), admission starts a sequence at the longest
  cached prefix it has (blocks shared, state restored by batch.restores), prefill chunks also
  end at the cache's save points, and each step lists the state snapshots to take after it
  (batch.saves; the engine commits them once the step's tokens are read). A request whose
  prompt a running sequence is still prefilling (the n samples of one request, or the same
  prompt twice) waits at the head of the queue until that prefill has passed the prompt's last
  inner block boundary, then resumes there from the cache: the prompt is prefilled once, and
  each later sibling computes only its last (at most block_size) tokens."""

from __future__ import annotations

import time
from collections import deque
from dataclasses import dataclass, field

from g906.engine.block_manager import CacheManager
from g906.engine.prefix_cache import Hit, PrefixCache, Save, last_inner_boundary, same_prompt
from g906.engine.sequence import Sequence, SequenceStatus


@dataclass
class SchedulerConfig:
    max_num_seqs: int
    max_num_batched_tokens: int
    max_model_len: int

    def __post_init__(self) -> None:
        if self.max_num_seqs < 1 or self.max_num_batched_tokens < 1 or self.max_model_len < 1:
            raise ValueError("scheduler limits must be positive")


@dataclass
class ScheduledBatch:
    is_prefill: bool
    seqs: list[Sequence]
    num_new_tokens: list[int]
    preempted: list[Sequence] = field(default_factory=list)
    restores: list[tuple[int, int]] = field(default_factory=list)   # state copies before the step
    saves: list[Save] = field(default_factory=list)                 # state snapshots after it

    @property
    def num_tokens(self) -> int:
        return sum(self.num_new_tokens)

    def samples(self, i: int) -> bool:
        """Whether sequence i reaches its last token in this step (and so samples the next)."""
        s = self.seqs[i]
        return s.num_cached_tokens + self.num_new_tokens[i] == s.num_tokens


class Scheduler:
    def __init__(self, config: SchedulerConfig, cache: CacheManager, prefix: PrefixCache | None = None):
        self.config = config
        self.cache = cache
        self.prefix = prefix
        self.waiting: deque[Sequence] = deque()
        self.running: list[Sequence] = []
        self.num_preemptions = 0

    # -- queue -----------------------------------------------------------------------------------
    def add(self, seq: Sequence) -> None:
        seq.status = SequenceStatus.WAITING
        self.waiting.append(seq)

    def has_unfinished(self) -> bool:
        return bool(self.waiting or self.running)

    @property
    def num_waiting(self) -> int:
        return len(self.waiting)

    @property
    def num_running(self) -> int:
        return len(self.running)

    def finish(self, seq: Sequence, reason: str) -> None:
        """Mark seq finished (reason "stop" / "length" / "abort") and free its cache at once."""
        if seq.status is SequenceStatus.FINISHED:
            return
        if seq.status is SequenceStatus.RUNNING:
            self.running.remove(seq)
        else:
            try:
                self.waiting.remove(seq)
            except ValueError:
                pass
        self.cache.free(seq)
        seq.status = SequenceStatus.FINISHED
        seq.finish_reason = reason

    def abort(self, seq: Sequence) -> None:
        self.finish(seq, "abort")

    def preempt(self, seq: Sequence) -> None:
        """Send a running sequence back to the front of the queue, its cache freed (it is
        prefilled again)."""
        self._preempt(seq)

    def _preempt(self, seq: Sequence) -> None:
        self.running.remove(seq)
        self.cache.free(seq)
        seq.status = SequenceStatus.WAITING
        seq.num_preemptions += 1
        self.num_preemptions += 1
        self.waiting.appendleft(seq)

    def _admission(self, seq: Sequence, budget: int) -> Hit | None:
        """Admission's test: a place, a state slot, a first chunk (after the cached prefix)
        within the token budget, and KV blocks for every token the cache does not hold.
        The cached prefix to start from, or None when the sequence cannot be admitted."""
        if not self._has_place(seq):
            return None
        # a request scoring its prompt (prompt_logprobs) must compute every prompt position
        reuse = self.prefix is not None and seq.params.prompt_logprobs is None
        hit = self.prefix.lookup(seq) if reuse else Hit()
        if reuse and self._computing_same_prompt(seq, hit):
            return None
        if self._chunk(seq, hit.num_tokens) > budget:
            return None
        blocks = self.cache.blocks
        need = blocks.num_new_blocks(seq, seq.num_tokens) - len(hit.blocks)
        free = blocks.num_free_blocks - (self.prefix.num_parked(hit.blocks) if hit.blocks else 0)
        return hit if need <= free else None

    def _computing_same_prompt(self, seq: Sequence, hit: Hit) -> bool:
        """Whether a running sequence with the same prompt (an n > 1 sibling, or the same
        request twice) is still prefilling it, short of the point where seq could resume from
        its blocks and snapshot. seq then waits for it rather than prefilling the prompt again."""
        n = seq.num_prompt_tokens
        point = last_inner_boundary(n, self.prefix.block_size)
        if hit.num_tokens >= point:
            return False
        for other in self.running:
            if (other.num_cached_tokens < point and other.num_prompt_tokens == n
                    and same_prompt(seq, other)):
                return True
        return False

    def _has_place(self, seq: Sequence) -> bool:
        """A place under max_num_seqs and a state slot. Beam search (g906/engine/beam.py): the
        first beam of a group needs the group's width in both (the rest are set aside for its
        later beams, which then take those)."""
        group = seq.beam
        if group is not None and group.started:
            return seq.state_slot is not None or bool(group.spare_slots)
        need = 1 if group is None else group.width
        slots = self.cache.slots
        return (len(self.running) + slots.num_reserved + need <= self.config.max_num_seqs
                and slots.num_free >= need)

    def can_admit(self) -> bool:
        """Whether the next schedule() would admit the first waiting sequence (without its effects)."""
        return bool(self.waiting) and self._admission(self.waiting[0], self.config.max_num_batched_tokens) is not None

    # -- one step ----------------------------------------------------------------------------------
    def schedule(self) -> ScheduledBatch | None:
        batch = self._schedule_prefill()
        if batch is not None:
            return batch
        batch = self._schedule_decode()
        if batch is None and self.waiting and self._make_room():
            batch = self._schedule_prefill()
        return batch

    def _make_room(self) -> bool:
        """Nothing can run, and beams that already have this round's logprobs hold the cache
        while they wait for the rest of their group (g906/engine/beam.py), which may be waiting
        for that very cache: preempt them (newest first) until the first waiting sequence fits.
        They are prefilled again after it."""
        idle = [s for s in self.running if s.beam is not None and s.num_uncached_tokens == 0]
        done = False
        while idle and not self.can_admit():
            seq = idle.pop()
            self._preempt(seq)
            self.waiting.remove(seq)      # behind the one it makes room for: its logprobs are
            self.waiting.append(seq)      # kept, it is not needed before the group chooses
            done = True
        return done

    def _chunk(self, seq: Sequence, start: int | None = None) -> int:
        start = seq.num_cached_tokens if start is None else start
        n = min(seq.num_tokens - start, self.config.max_num_batched_tokens)
        if self.prefix is not None:
            point = self.prefix.next_point(seq, start)
            if point is not None:
                n = min(n, point - start)
        return n

    def _plan_saves(self, batch: ScheduledBatch) -> ScheduledBatch:
        if self.prefix is not None:
            for seq, n in zip(batch.seqs, batch.num_new_tokens):
                save = self.prefix.plan_save(seq, seq.num_cached_tokens + n, decode=not batch.is_prefill)
                if save is not None:
                    batch.saves.append(save)
        return batch

    def _schedule_prefill(self) -> ScheduledBatch | None:
        budget = self.config.max_num_batched_tokens
        seqs: list[Sequence] = []
        chunks: list[int] = []
        for seq in self.running:
            if seq.is_decode or seq.num_uncached_tokens == 0:
                continue      # (a beam waiting for its group's next tokens: g906/engine/beam.py)
            n = self._chunk(seq)
            if n > budget:
                continue
            seqs.append(seq)
            chunks.append(n)
            budget -= n
        restores: list[tuple[int, int]] = []
        while self.waiting:
            hit = self._admission(self.waiting[0], budget)
            if hit is None:
                break
            seq = self.waiting.popleft()
            self.cache.acquire_slot(seq)
            if self.prefix is not None:
                restores += self.prefix.admit(seq, hit)
            self.cache.blocks.cover(seq, seq.num_tokens)
            n = self._chunk(seq)
            seq.status = SequenceStatus.RUNNING
            if seq.scheduled_at is None:
                seq.scheduled_at = time.monotonic()
            self.running.append(seq)
            seqs.append(seq)
            chunks.append(n)
            budget -= n
        if not seqs:
            return None
        return self._plan_saves(ScheduledBatch(True, seqs, chunks, restores=restores))

    def _schedule_decode(self) -> ScheduledBatch | None:
        blocks = self.cache.blocks
        seqs: list[Sequence] = []
        preempted: list[Sequence] = []
        for seq in list(self.running):
            if seq.status is not SequenceStatus.RUNNING or not seq.is_decode:
                continue  # preempted earlier in this loop (or still prefilling)
            while not blocks.can_cover(seq, seq.num_tokens):
                victim = self.running[-1]
                self._preempt(victim)
                preempted.append(victim)
                if victim is seq:
                    break
            else:
                blocks.cover(seq, seq.num_tokens)
                seqs.append(seq)
        if not seqs:
            return None if not preempted else ScheduledBatch(False, [], [], preempted)
        return self._plan_saves(ScheduledBatch(False, seqs, [1] * len(seqs), preempted))
