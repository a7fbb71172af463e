"""Cache bookkeeping: paged KV blocks (full-attention layers) and linear-attention state slots.

BlockManager hands out fixed-size KV blocks with reference counts: a block returns to the
free list when its last holder releases it (sharing is what `share` is for; a block written by
one sequence is never handed to another while referenced). StateSlotPool is a fixed pool of
per-sequence slots for the Gated DeltaNet conv + recurrent state (one per running sequence).

With prefix caching (g906/engine/prefix_cache.py attaches itself as `prefix`), a block whose
tokens are registered under a content key is parked rather than freed when its last holder
releases it, counts as free, and is evicted (least recently used first) only when no truly
free block is left.

Both are plain Python; the tensors they index live in g906/engine/cache.py."""

from __future__ import annotations

from collections import deque

from g906.engine.sequence import Sequence


class OutOfBlocks(RuntimeError):
    pass


class BlockManager:
    def __init__(self, num_blocks: int, block_size: int):
        if num_blocks < 1 or block_size < 1:
            raise ValueError(f"need at least one block of at least one token (got {num_blocks} x {block_size})")
        self.num_blocks = num_blocks
        self.block_size = block_size
        self.ref_counts = [0] * num_blocks
        self._free: deque[int] = deque(range(num_blocks))
        self.prefix = None        # a PrefixCache, when prefix caching is on

    # -- queries -------------------------------------------------------------------------------
    @property
    def num_free_blocks(self) -> int:
        """Blocks that can be handed out: free ones and cached blocks nobody holds."""
        return len(self._free) + (len(self.prefix.parked) if self.prefix is not None else 0)

    @property
    def num_used_blocks(self) -> int:
        """Blocks some sequence holds."""
        return self.num_blocks - self.num_free_blocks

    def blocks_needed(self, num_tokens: int) -> int:
        return -(-num_tokens // self.block_size)

    def num_new_blocks(self, seq: Sequence, num_tokens: int) -> int:
        """Blocks seq must gain so that its table covers num_tokens tokens."""
        return max(0, self.blocks_needed(num_tokens) - len(seq.block_table))

    def can_cover(self, seq: Sequence, num_tokens: int) -> bool:
        return self.num_new_blocks(seq, num_tokens) <= self.num_free_blocks

    # -- changes -------------------------------------------------------------------------------
    def _take(self) -> int:
        if self._free:
            block = self._free.popleft()
        elif self.prefix is not None and (block := self.prefix.evict_block()) is not None:
            pass
        else:
            raise OutOfBlocks("no free KV-cache block")
        assert self.ref_counts[block] == 0
        self.ref_counts[block] = 1
        return block

    def cover(self, seq: Sequence, num_tokens: int) -> None:
        """Grow seq's block table to cover num_tokens tokens (all or nothing)."""
        need = self.num_new_blocks(seq, num_tokens)
        if need > self.num_free_blocks:
            raise OutOfBlocks(f"{seq.request_id}: needs {need} blocks, {self.num_free_blocks} free")
        for _ in range(need):
            seq.block_table.append(self._take())

    def share(self, seq: Sequence, blocks: list[int]) -> None:
        """Append already-filled blocks to seq's table (one more reference each); a cached block
        nobody holds (the prefix cache took it out of its parked list) counts too."""
        for b in blocks:
            if self.ref_counts[b] <= 0 and (self.prefix is None or not self.prefix.keeps(b)):
                raise ValueError(f"block {b} is free and cannot be shared")
            self.ref_counts[b] += 1
            seq.block_table.append(b)

    def release(self, seq: Sequence) -> None:
        """Drop seq's references; blocks that nobody holds any more become free."""
        for b in reversed(seq.block_table):
            self.ref_counts[b] -= 1
            assert self.ref_counts[b] >= 0, f"block {b} released twice"
            if self.ref_counts[b] == 0:
                if self.prefix is not None and self.prefix.keeps(b):
                    self.prefix.park(b)
                else:
                    self._free.append(b)
        seq.block_table = []

    def fork(self, parent: Sequence, child: Sequence) -> tuple[int, int] | None:
        """Give child (a beam forked from parent, holding no blocks) parent's blocks: the full
        ones shared (one more reference each), the partly filled last one copied, since both
        will write their next tokens into it. The (source, destination) block whose KV the
        caller must copy, or None; OutOfBlocks (nothing changed) when no block is free for it."""
        full = parent.num_cached_tokens // self.block_size
        partial = parent.num_cached_tokens % self.block_size != 0
        if partial and self.num_free_blocks < 1:
            raise OutOfBlocks(f"{parent.request_id}: no free block for a forked beam")
        shared = parent.block_table[:full]
        for b in shared:
            self.ref_counts[b] += 1
        child.block_table = list(shared)
        if not partial:
            return None
        dst = self._take()
        child.block_table.append(dst)
        return parent.block_table[full], dst

    def free_block(self, block: int) -> None:
        """Return a block nobody holds to the free list (the prefix cache dropping it)."""
        assert self.ref_counts[block] == 0, f"block {block} is held"
        self._free.append(block)

    def slot(self, seq: Sequence, position: int) -> int:
        """The flat cache slot of token `position` of seq."""
        return seq.block_table[position // self.block_size] * self.block_size + position % self.block_size


class StateSlotPool:
    """A fixed pool of linear-attention state slots, one per running sequence."""

    def __init__(self, num_slots: int):
        if num_slots < 1:
            raise ValueError("need at least one state slot")
        self.num_slots = num_slots
        self._free: deque[int] = deque(range(num_slots))
        self._used: set[int] = set()
        self._reserved = 0

    @property
    def num_free(self) -> int:
        return len(self._free)

    @property
    def num_used(self) -> int:
        return len(self._used)

    def acquire(self, seq: Sequence) -> int:
        if seq.state_slot is not None:
            return seq.state_slot
        if not self._free:
            raise OutOfBlocks("no free linear-attention state slot")
        slot = self._free.popleft()
        self._used.add(slot)
        seq.state_slot = slot
        return slot

    @property
    def num_reserved(self) -> int:
        """Slots set aside for beams not forked yet (g906/engine/beam.py)."""
        return self._reserved

    def reserve(self, n: int) -> list[int]:
        """Take n slots out of the pool for a beam group (its later beams); OutOfBlocks if fewer are free."""
        if n > len(self._free):
            raise OutOfBlocks(f"{n} linear-attention state slots wanted, {len(self._free)} free")
        out = [self._free.popleft() for _ in range(n)]
        self._used.update(out)
        self._reserved += n
        return out

    def unreserve(self, slots: list[int]) -> None:
        """Give a beam group's unused reserved slots back to the pool."""
        for slot in slots:
            self._used.remove(slot)
            self._free.append(slot)
        self._reserved -= len(slots)

    def release(self, seq: Sequence) -> None:
        slot = seq.state_slot
        if slot is None:
            return
        self._used.remove(slot)
        self._free.append(slot)
        seq.state_slot = None


class CacheManager:
    """Both pools together: what a sequence holds, and what freeing a sequence returns."""

    def __init__(self, num_blocks: int, block_size: int, num_state_slots: int):
        self.blocks = BlockManager(num_blocks, block_size)
        self.slots = StateSlotPool(num_state_slots)

    def acquire_slot(self, seq: Sequence) -> None:
        """A state slot for an admitted sequence. The first beam of a beam group also reserves
        a slot for each later beam; a later beam takes one of those (so a group always has its
        width in slots and cannot wait for another group's)."""
        group = seq.beam
        if group is None:
            self.slots.acquire(seq)
        elif group.started:
            if seq.state_slot is None:
                seq.state_slot = group.spare_slots.pop()
                self.slots._reserved -= 1
        else:
            self.slots.acquire(seq)
            group.spare_slots = self.slots.reserve(group.width - 1)
            group.started = True

    def free(self, seq: Sequence) -> None:
        self.blocks.release(seq)
        group = seq.beam
        if group is not None and group.started and seq.state_slot is not None and not group.closed:
            group.spare_slots.append(seq.state_slot)     # the group's until it ends
            self.slots._reserved += 1
            seq.state_slot = None
        else:
            self.slots.release(seq)
        seq.num_cached_tokens = 0
        seq.num_registered_blocks = 0
