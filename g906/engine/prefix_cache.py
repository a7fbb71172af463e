"""Prefix caching for the hybrid model: reuse full-attention KV blocks and linear-attention state.

Qwen3.5 is hybrid: the full-attention layers keep per-token KV (paged blocks), the Gated DeltaNet
layers keep one recurrent + conv state that exists only at the end of what was processed. A
cached prefix therefore needs both: the KV blocks of its tokens and a snapshot of every GDN
layer's state at its end. A request resumes at the longest prefix that has both.

KV blocks. A full block's key is a hash chain: hash(previous block's key, its token ids, the
content hashes of the images whose placeholders it holds), seeded with a salt naming the model,
dtype and quantization. Once a block's tokens are computed it is registered under its key; when
its last holder releases it, it stays cached ("parked", LRU) instead of going back to the free
list, and a later request sharing the prefix takes it again (reference counts: BlockManager).
A parked block is evicted, least recently used first, only when no free block is left.

State snapshots. Extra linear-attention state slots (the snapshot pool, its size budgeted in
EngineConfig) hold copies of a running sequence's state at block-aligned positions, keyed by the
key of the block that ends there (so a snapshot is usable exactly when its whole chain of blocks
is). Positions: the end of each prompt (rounded down to the block size: the usual resume point of
the next agent turn, since Qwen3.5's template rewrites the previous answer; and the boundary
before it when the prompt fills its last block, where the same prompt again, or an n > 1
sibling, resumes: a lookup leaves at least one token to compute), the point where a
prompt leaves the cached blocks of an earlier one (a shared system prompt: the next request
that shares it resumes there), every `stride` tokens of a long prefill, and the last block
boundary a sequence reaches while it decodes (its "tail": each new one replaces the previous,
and the last one stays when the sequence ends).
Prefill chunks are cut at these positions so that the state exists there. Eviction is LRU, tails
and stride points first, prompt ends last.

A save is planned when a step is scheduled (a slot reserved, the copy made by the runner right
after the step's forward, in device order) and committed when the step's tokens are read (the
token ids, and so the key, may only be known then). Restores are copies made before the forward
of the step that admits the sequence. Everything here is host bookkeeping; the runner makes the
copies (on every tensor-parallel rank, which all hold the same block ids and slots).

With speculative decoding (g906/engine/spec) only committed positions are published: a verify
step's accepted tokens advance num_cached_tokens, so rejected drafts never reach a registered
block, and its planned save is moved to the last block boundary inside the accepted tokens, the
state there replayed into the snapshot slot by the rollback (never a draft's state)."""

from __future__ import annotations

import hashlib
from array import array
from collections import OrderedDict
from dataclasses import dataclass, field

from g906.engine.block_manager import BlockManager
from g906.engine.sequence import Sequence

END, STRIDE, TAIL = "end", "stride", "tail"
_EVICT_ORDER = (TAIL, STRIDE, END)        # which snapshots go first when the pool is full


@dataclass
class Hit:
    blocks: list[int] = field(default_factory=list)
    num_tokens: int = 0                    # the resume position (len(blocks) * block_size)
    snapshot: int | None = None            # the snapshot slot to restore
    branch: int = 0                        # where the cached KV blocks end (>= num_tokens)


@dataclass
class Save:
    seq: Sequence
    position: int
    slot: int
    kind: str


def image_hashes(mm) -> list[tuple[int, int, bytes]]:
    """(start, end, content hash) of each image's placeholder span (memoised on mm)."""
    got = getattr(mm, "content_hashes", None)
    if got is None:
        got = []
        for (start, n), im in zip(mm.spans, mm.images):
            h = hashlib.blake2b(digest_size=16)
            h.update(repr((tuple(im.grid), tuple(im.pixel_values.shape), str(im.pixel_values.dtype))).encode())
            h.update(im.pixel_values.tobytes())
            got.append((int(start), int(start + n), h.digest()))
        mm.content_hashes = got
    return got


def last_inner_boundary(n: int, bs: int) -> int:
    """The last block boundary strictly inside n tokens: where a request with exactly this
    prompt (a repeat, or an n > 1 sibling) resumes, since a lookup leaves a token to compute."""
    return ((n - 1) // bs) * bs


def same_prompt(a: Sequence, b: Sequence) -> bool:
    """Whether two sequences have the same prompt: token ids and images."""
    n = a.num_prompt_tokens
    if n != b.num_prompt_tokens or (a.mm is None) != (b.mm is None):
        return False
    if a.mm is not None and image_hashes(a.mm) != image_hashes(b.mm):
        return False
    return a.token_ids[:n] == b.token_ids[:n]


class PrefixCache:
    def __init__(self, blocks: BlockManager, snapshot_slots: list[int], *, stride: int = 0, salt: str = ""):
        bs = blocks.block_size
        if stride < 0 or stride % bs:
            raise ValueError(f"prefix_state_stride must be 0 or a multiple of the block size {bs}, not {stride}")
        self.blocks = blocks
        blocks.prefix = self
        self.block_size = bs
        self.stride = stride
        self.salt = hashlib.blake2b(salt.encode(), digest_size=16).digest()
        self.by_key: dict[bytes, int] = {}
        self.key_of: dict[int, bytes] = {}
        self.parked: OrderedDict[int, None] = OrderedDict()       # unreferenced cached blocks, LRU first
        self.num_snapshot_slots = len(snapshot_slots)
        self._snap_free: list[int] = list(snapshot_slots)
        self.snaps: dict[str, OrderedDict[bytes, int]] = {k: OrderedDict() for k in _EVICT_ORDER}
        self._snap_kind: dict[bytes, str] = {}
        self.num_pending_saves = 0
        # counters (Prometheus and stats)
        self.queried_tokens = 0
        self.hit_tokens = 0
        self.block_evictions = 0
        self.snapshot_evictions = 0
        self.snapshots_saved = 0

    # -- keys --------------------------------------------------------------------------------------
    def keys(self, seq: Sequence, num_blocks: int) -> list[bytes]:
        """The keys of seq's first num_blocks full blocks (fewer where a token is not known yet)."""
        ks = seq.block_keys
        toks, bs = seq.token_ids, self.block_size
        imgs = image_hashes(seq.mm) if seq.mm is not None else ()
        while len(ks) < num_blocks:
            lo = len(ks) * bs
            chunk = toks[lo:lo + bs]
            if len(chunk) < bs or min(chunk) < 0:     # a sampled token the host has not read yet
                break
            h = hashlib.blake2b(ks[-1] if ks else self.salt, digest_size=16)
            h.update(array("q", chunk).tobytes())
            for start, end, img in imgs:
                if start < lo + bs and end > lo:
                    h.update(img)
            ks.append(h.digest())
        return ks[:num_blocks]

    # -- lookup and admission ----------------------------------------------------------------------
    def lookup(self, seq: Sequence) -> Hit:
        """The longest cached prefix of seq (leaving at least one token to compute) that has
        both its KV blocks and a state snapshot at its end."""
        ks = self.keys(seq, (seq.num_tokens - 1) // self.block_size)
        blocks = []
        for k in ks:
            b = self.by_key.get(k)
            if b is None:
                break
            blocks.append(b)
        branch = len(blocks) * self.block_size
        for n in range(len(blocks), 0, -1):
            slot = self._snapshot(ks[n - 1])
            if slot is not None:
                return Hit(blocks[:n], n * self.block_size, slot, branch)
        return Hit(branch=branch)

    def num_parked(self, blocks: list[int]) -> int:
        return sum(1 for b in blocks if b in self.parked)

    def admit(self, seq: Sequence, hit: Hit) -> list[tuple[int, int]]:
        """Give seq the hit's blocks; the state copy (snapshot -> seq's slot) to make before its
        first step. seq holds its state slot already."""
        first = seq.num_preemptions == 0
        if first:
            self.queried_tokens += seq.num_prompt_tokens
        # where this prompt leaves a cached one: its state there is the next branch's resume point
        seq.prefix_branch = hit.branch if hit.branch > hit.num_tokens else 0
        if not hit.blocks:
            return []
        for b in hit.blocks:
            self.parked.pop(b, None)
        self.blocks.share(seq, hit.blocks)
        seq.num_cached_tokens = hit.num_tokens
        if first:
            seq.num_hit_tokens = hit.num_tokens
            self.hit_tokens += hit.num_tokens
        self._touch(self.key_of[hit.blocks[-1]])
        return [(hit.snapshot, seq.state_slot)]

    # -- blocks ------------------------------------------------------------------------------------
    def keeps(self, block: int) -> bool:
        return block in self.key_of

    def park(self, block: int) -> None:
        self.parked[block] = None

    def evict_block(self) -> int | None:
        """Unregister the least recently used parked block and return it (None: none parked)."""
        if not self.parked:
            return None
        block, _ = self.parked.popitem(last=False)
        key = self.key_of.pop(block)
        del self.by_key[key]
        self._drop_snapshot(key)
        self.block_evictions += 1
        return block

    def register(self, seq: Sequence) -> None:
        """Register seq's computed full blocks under their keys (the first holder of a key keeps it)."""
        done = min(seq.num_cached_tokens // self.block_size, len(seq.block_table))
        start = seq.num_registered_blocks
        if done <= start:
            return
        ks = self.keys(seq, done)
        for i in range(start, len(ks)):
            b, k = seq.block_table[i], ks[i]
            if k not in self.by_key and b not in self.key_of:
                self.by_key[k] = b
                self.key_of[b] = k
        seq.num_registered_blocks = len(ks)

    # -- snapshots ---------------------------------------------------------------------------------
    def next_point(self, seq: Sequence, start: int) -> int | None:
        """The first save position after `start` in seq's prefill, or None."""
        bs = self.block_size
        points = [(seq.num_prompt_tokens // bs) * bs, last_inner_boundary(seq.num_prompt_tokens, bs),
                  (seq.num_tokens // bs) * bs, seq.prefix_branch]
        if self.stride:
            points.append((start // self.stride + 1) * self.stride)
        after = [p for p in points if p > start]
        return min(after) if after else None

    def plan_save(self, seq: Sequence, end: int, *, decode: bool) -> Save | None:
        """A save of seq's state after a step that ends at `end` (None: not a save point, or no
        slot can be had)."""
        bs = self.block_size
        if end % bs or end == 0 or seq.state_slot is None:
            return None
        if decode:
            kind = TAIL
        elif end in ((seq.num_prompt_tokens // bs) * bs, last_inner_boundary(seq.num_prompt_tokens, bs),
                     seq.prefix_branch):
            kind = END
        elif end == (seq.num_tokens // bs) * bs:
            kind = TAIL
        elif self.stride and end % self.stride == 0:
            kind = STRIDE
        else:
            return None
        ks = self.keys(seq, end // bs)
        if len(ks) == end // bs:
            have = self._snap_kind.get(ks[-1])
            if have is not None:
                if kind == END and have != END:      # a prompt end is kept longest
                    self._move(ks[-1], END)
                return None
        slot = self._reserve()
        if slot is None:
            return None
        self.num_pending_saves += 1
        return Save(seq, end, slot, kind)

    def cancel(self, save: Save) -> None:
        """Give a planned save's slot back (its step did not end where it was planned)."""
        self.num_pending_saves -= 1
        self._snap_free.append(save.slot)

    def commit(self, save: Save) -> None:
        """Key a save's snapshot now that its tokens are known (or give its slot back)."""
        self.num_pending_saves -= 1
        seq, n = save.seq, save.position // self.block_size
        ks = self.keys(seq, n)
        if len(ks) < n or ks[-1] in self._snap_kind:
            self._snap_free.append(save.slot)
            return
        key = ks[-1]
        if save.kind == TAIL:
            old = seq.tail_key
            if old is not None and self._snap_kind.get(old) == TAIL:
                self._drop_snapshot(old)
            seq.tail_key = key
        self.snaps[save.kind][key] = save.slot
        self._snap_kind[key] = save.kind
        self.snapshots_saved += 1

    def _snapshot(self, key: bytes) -> int | None:
        kind = self._snap_kind.get(key)
        return None if kind is None else self.snaps[kind][key]

    def _touch(self, key: bytes) -> None:
        kind = self._snap_kind.get(key)
        if kind is not None:
            self.snaps[kind].move_to_end(key)

    def _move(self, key: bytes, kind: str) -> None:
        slot = self.snaps[self._snap_kind[key]].pop(key)
        self.snaps[kind][key] = slot
        self._snap_kind[key] = kind

    def _drop_snapshot(self, key: bytes) -> None:
        kind = self._snap_kind.pop(key, None)
        if kind is not None:
            self._snap_free.append(self.snaps[kind].pop(key))

    def _reserve(self) -> int | None:
        if self._snap_free:
            return self._snap_free.pop()
        for kind in _EVICT_ORDER:
            if self.snaps[kind]:
                key, slot = self.snaps[kind].popitem(last=False)
                del self._snap_kind[key]
                self.snapshot_evictions += 1
                return slot
        return None

    def forget(self) -> None:
        """Drop every cached block nobody holds and every snapshot; zero the counters."""
        while self.parked:
            self.blocks.free_block(self.evict_block())
        for kind in _EVICT_ORDER:
            for key in list(self.snaps[kind]):
                self._drop_snapshot(key)
        self.queried_tokens = self.hit_tokens = 0
        self.block_evictions = self.snapshot_evictions = self.snapshots_saved = 0

    # -- introspection -----------------------------------------------------------------------------
    @property
    def num_snapshots(self) -> int:
        return len(self._snap_kind)

    def stats(self) -> dict:
        return {
            "prefix_cache_queried_tokens": self.queried_tokens,
            "prefix_cache_hit_tokens": self.hit_tokens,
            "prefix_cache_blocks": len(self.key_of),
            "prefix_cache_blocks_parked": len(self.parked),
            "prefix_cache_block_evictions": self.block_evictions,
            "prefix_snapshots_total": self.num_snapshot_slots,
            "prefix_snapshots_used": self.num_snapshots,
            "prefix_snapshots_pending": self.num_pending_saves,
            "prefix_snapshot_evictions": self.snapshot_evictions,
            "prefix_snapshots_saved": self.snapshots_saved,
        }
