"""One sequence's constraint: its llguidance matcher, fed the tokens the sequence samples.

Before `after` has appeared in the output (a reasoning block's end), the sequence is free and
its tokens are only watched for it; from then on every step's mask comes from the matcher and
every sampled token advances it. A matcher that has stopped (the grammar is complete) ends the
sequence."""

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
