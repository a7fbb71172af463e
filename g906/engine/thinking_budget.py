"""thinking_token_budget: a cap on the tokens a request may spend thinking. Once a request has
generated that many tokens inside its reasoning without closing it, the sampler forces the
token ids of the end tag (`</think>`), one per step, so that the answer follows at once: on a
slow card this bounds a reasoning model's time to its first content token.

The thinking starts at the first output token when the prompt left the tag open (the chat
template opened it), else after the start tag's ids in the output; it ends at the end tag's ids."""

from __future__ import annotations

import torch


def find(seq: list[int], sub: tuple[int, ...], start: int = 0) -> int:
    """Index of the first occurrence of sub in seq[start:] (-1: none). A C-speed scan for the
    first id, then a comparison: it runs every step on the whole output of a thinking request."""
    n = len(sub)
    if n == 0:
        return -1
    i = start
    while True:
        try:
            i = seq.index(sub[0], i)
        except ValueError:
            return -1
        if tuple(seq[i:i + n]) == sub:
            return i
        i += 1


def forced_token(params, output_ids: list[int]) -> int | None:
    """The token this request must sample next to close its thinking, or None."""
    budget = params.thinking_token_budget
    if budget is None or not params.think_end_ids:
        return None
    if params.think_open:
        begin = 0
    else:
        at = find(output_ids, params.think_start_ids)
        if at < 0:
            return None
        begin = at + len(params.think_start_ids)
    if find(output_ids, params.think_end_ids, begin) >= 0:
        return None
    over = len(output_ids) - begin - budget      # the end tag's tokens forced so far
    if 0 <= over < len(params.think_end_ids):
        return params.think_end_ids[over]
    return None


def apply_thinking_budget(logits: torch.Tensor, rows) -> torch.Tensor:
    """logits with each row that must close its thinking reduced to the forced token (every
    other logit -inf: greedy and sampling alike pick it); the input untouched."""
    return force(logits, [(i, t) for i, r in enumerate(rows)
                          if r.params.thinking_token_budget is not None
                          and (t := forced_token(r.params, r.output_token_ids or [])) is not None])


def force(logits: torch.Tensor, forced: list[tuple[int, int]]) -> torch.Tensor:
    """logits with each (row, token) of `forced` reduced to that token; the input when none."""
    if not forced:
        return logits
    out = logits.clone()
    for i, t in forced:
        keep = out[i, t].clone()
        out[i].fill_(float("-inf"))
        out[i, t] = keep if torch.isfinite(keep) else 0.0
    return out
