"""N-gram prompt lookup: draft the tokens that followed the last occurrence of the sequence's
own suffix. Costs no model work; pays off where the output repeats its input (code being
edited, quoted documents, structured text)."""

from __future__ import annotations

import numpy as np


def propose_ngram(token_ids: list[int], k: int, n_min: int, n_max: int) -> list[int]:
    """Up to k draft tokens: for n from n_max down to n_min, find the most recent earlier
    occurrence of the last n tokens that has a continuation and return that continuation.
    [] when no suffix of n_min tokens or more occurs earlier."""
    total = len(token_ids)
    if k < 1 or total < n_min + 1:
        return []
    arr = np.asarray(token_ids, dtype=np.int64)
    for n in range(min(n_max, total - 1), n_min - 1, -1):
        suffix = arr[total - n:]
        # windows starting at 0..total-n-1 (the suffix itself excluded): each has a next token
        wins = np.lib.stride_tricks.sliding_window_view(arr[: total - 1], n)
        hits = np.flatnonzero((wins == suffix).all(axis=1))
        if hits.size:
            start = int(hits[-1]) + n
            return arr[start: start + k].tolist()
    return []
