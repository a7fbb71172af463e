"""One sequence's constraint: its llguidance matcher, fed the tokens the sequence samples.

Before `after` has appeared in the output (a reasoning block's end), the sequence is free and
its tokens are only watched for it; from then on every step's mask comes from the matcher and
every sampled token advances it. A matcher that has stopped (the grammar is complete) ends the
sequence.

Under speculative decoding (g906/engine/spec) `speculate` writes the masks of a verify step's
positions: position j's is the matcher's state after the drafts before j, reached by consuming
them and rolled back afterwards (llguidance keeps the history), so the matcher only ever advances
over the tokens the sequence emits."""

from __future__ import annotations

from typing import Any


class Guide:
    def __init__(self, matcher: Any, after_ids: list[int] | None = None, eos_ids: list[int] | None = None):
        self.matcher = matcher
        self.eos_ids = list(eos_ids or [])
        self.after_ids = list(after_ids or [])
        self.active = not self.after_ids
        self._recent: list[int] = []

    @property
    def constrains(self) -> bool:
        """Whether the next token is constrained."""
        return self.active and not self.matcher.is_stopped()

    def fill(self, bitmask, row: int, *, allow_eos: bool = True) -> None:
        """Write the allowed next tokens into row `row` of an int32 CPU bitmask (contiguous).
        allow_eos=False (ignore_eos, or min_tokens not reached): the end of the output is not
        offered where the grammar could go on, so that it does not end the sequence early."""
        v = bitmask[row]
        self.matcher.unsafe_compute_mask_ptr(v.data_ptr(), v.numel() * v.element_size())
        if not allow_eos and self.eos_ids:
            saved = v.clone()
            for t in self.eos_ids:
                v[t // 32] &= (~(1 << (t % 32)) + 2**31) % 2**32 - 2**31     # as a signed int32
            if not v.any():           # the grammar is complete: the end is all that is left
                v.copy_(saved)

    def speculate(self, drafts: list[int], bitmask, row: int, allow_eos: list[bool],
                  known: list | None = None) -> tuple[int, list[bool]]:
        """The masks of a verify step over `drafts`: for each position j (0..n, n the drafts kept)
        that is constrained, the next free row of `bitmask` from `row` on holds the mask after
        drafts[:j] (allow_eos[j] as in fill). The drafts end before the first one its position's
        mask forbids (the target never accepts it) and after one that completes the grammar (the
        sequence ends there). known[j], where given: position j's mask already computed for these
        drafts (a masked drafter's, with the same allow_eos), copied instead of computed. Returns
        (n, whether each of the n + 1 positions is constrained); the guide's state is unchanged."""
        active, recent, watch = self.active, list(self._recent), len(self.after_ids)
        consumed, flags, r, n = 0, [], row, len(drafts)
        try:
            for j in range(len(drafts) + 1):
                on = active and not self.matcher.is_stopped()
                flags.append(on)
                if on:
                    if known is not None and j < len(known) and known[j] is not None:
                        bitmask[r].copy_(known[j])
                    else:
                        self.fill(bitmask, r, allow_eos=allow_eos[j])
                    r += 1
                if j == len(drafts):
                    break
                d = int(drafts[j])
                if on:
                    word = int(bitmask[r - 1, d // 32])
                    if not (word >> (d % 32)) & 1 or not self.matcher.consume_token(d):
                        n = j
                        break
                    consumed += 1
                    if self.matcher.is_stopped():
                        n = j + 1
                        flags.append(False)        # the sequence ends at d: position n is never emitted
                        break
                elif active:                       # stopped already: nothing follows
                    n = j
                    break
                else:
                    recent.append(d)
                    if recent[-watch:] == self.after_ids:
                        active = True
                    del recent[:-watch]
        finally:
            if consumed:
                self.matcher.rollback(consumed)
        return n, flags[: n + 1]

    def mask_after(self, drafts: list[int], bitmask, row: int, *, allow_eos: bool = True) -> bool:
        """Write the mask after `drafts` (tokens the grammar allows, each in turn) into row `row`,
        as fill would after accepting them; False (row untouched) where that position is
        unconstrained. The guide's state is unchanged: a drafter's masks."""
        active, recent, watch = self.active, list(self._recent), len(self.after_ids)
        consumed = 0
        try:
            for d in drafts:
                if not active:
                    recent.append(int(d))
                    if recent[-watch:] == self.after_ids:
                        active = True
                    del recent[:-watch]
                elif self.matcher.is_stopped() or not self.matcher.try_consume_tokens([int(d)]):
                    return False
                else:
                    consumed += 1
            if not active or self.matcher.is_stopped():
                return False
            self.fill(bitmask, row, allow_eos=allow_eos)
            return True
        finally:
            if consumed:
                self.matcher.rollback(consumed)

    def accept(self, token: int) -> None:
        if not self.active:
            self._recent.append(int(token))
            n = len(self.after_ids)
            if self._recent[-n:] == self.after_ids:
                self.active = True
            del self._recent[:-n]
            return
        self.matcher.consume_token(int(token))

    @property
    def finished(self) -> bool:
        """The grammar is complete: nothing but the end of the output may follow."""
        return self.active and self.matcher.is_stopped()

    @property
    def error(self) -> str | None:
        return self.matcher.get_error() or None if self.matcher.is_error() else None
