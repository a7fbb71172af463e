"""A constrained answer always arrives: a stop token sampled inside the thinking of a request
whose constraint waits for the thinking's end closes the thinking instead of ending the request.

A reasoning model's constraint (a JSON schema, a tool-call grammar, ...) applies after the end
tag (`StructuredOutputsParams.after`, `</think>`): until then the output is free, and a model
that samples its end token there would end the request with reasoning only, no answer, although
one was required. So, while such a request is thinking (the end tag's ids,
SamplingParams.think_end_ids, not yet in its output), a token that would end it (an end-of-sequence
id unless ignore_eos, a stop_token_id, once min_tokens is reached) is replaced by the end tag's
first id exactly where it would have been sampled, and the tag's further ids (a tag of several
tokens) are forced one per step after it, as the thinking budget forces them; the grammar then
takes over. Replacing rather than masking: the model said it was done, and a random model may
never sample the end tag itself. Requests without a pending constraint are unchanged.

Greedy rows: a row whose best token is a stop id is reduced to the end tag's first id (in the
processed logits, which plain sampling and speculative verification share). Sampled rows: the
sampler replaces a drawn stop id (the draws before it are those the request would make without
the rule); speculative verification, which works on distributions (g906/engine/spec/rejection.py),
moves the stop ids' probability mass onto the end tag's first id after temperature and the
filters, the distribution of drawing then replacing. With a tag of several tokens
the rule cannot tell the model's own first tag token from a replaced one, so any first tag token
inside such a thinking is followed by the rest of the tag (the server's `</think>` is one token
in the Qwen3.5 tokenizers)."""

from __future__ import annotations

from dataclasses import replace

import torch

from g906.engine.thinking_budget import find, force


def with_end_tag(params, encode):
    """params whose constraint starts after a text (the end of the thinking) with that text's ids
    (encode: text -> ids) as think_end_ids, so that the rule knows the tag; ValueError (naming
    think_end_ids) when the caller gave other ids."""
    after = params.structured_outputs.after if params.structured_outputs is not None else None
    if not after:
        return params
    end = tuple(int(t) for t in encode(after))
    if not params.think_end_ids:
        return replace(params, think_end_ids=end)
    if tuple(params.think_end_ids) != end:
        err = ValueError(f"think_end_ids {list(params.think_end_ids)} are not the ids of structured_outputs.after "
                         f"({after!r}: {list(end)})")
        err.param = "think_end_ids"  # type: ignore[attr-defined]
        raise err
    return params


def thinking(params, output_ids: list[int]) -> bool:
    """Whether the rule holds this request: its constraint waits for the end tag, not yet sampled."""
    return params.answer_after_thinking and find(output_ids, params.think_end_ids) < 0


def continuation(params, output_ids: list[int]) -> int | None:
    """The next id of an end tag of several tokens whose start ends the output of a request under
    the rule, or None."""
    end = params.think_end_ids
    if len(end) < 2 or not thinking(params, output_ids):
        return None
    for m in range(len(end) - 1, 0, -1):
        if len(output_ids) >= m and tuple(output_ids[-m:]) == end[:m]:
            return end[m]
    return None


def apply_continuation(logits: torch.Tensor, rows) -> torch.Tensor:
    """logits with each row in the middle of its end tag reduced to the tag's next id."""
    return force(logits, [(i, t) for i, r in enumerate(rows)
                          if r.params.answer_after_thinking
                          and (t := continuation(r.params, r.output_token_ids or [])) is not None])


def stop_ids(params, num_output_tokens: int, eos_token_ids) -> list[int]:
    """The ids that would end the request as its next token (g906/engine/stop.py's token_stop)."""
    if num_output_tokens + 1 < params.min_tokens:
        return []
    ids = set(params.stop_token_ids)
    if not params.ignore_eos:
        ids |= set(eos_token_ids)
    ids.discard(params.think_end_ids[0])
    return sorted(ids)


class Closing:
    """The rows of one sampling call under the rule: their stop ids and end tags' first ids."""

    def __init__(self, rows, eos_token_ids, vocab_size: int, device, *, argmax: bool = False):
        """argmax: every row takes its best token whatever its sampling (the MTP drafter's rows)."""
        self.greedy: list[int] = []
        self.sampled: list[int] = []
        self._stops: dict[int, list[int]] = {}
        self._end: dict[int, int] = {}
        for i, r in enumerate(rows):
            p = r.params
            out = r.output_token_ids or []
            if not thinking(p, out):
                continue
            stops = [t for t in stop_ids(p, len(out), eos_token_ids) if 0 <= t < vocab_size]
            if not stops:
                continue
            self._stops[i], self._end[i] = stops, p.think_end_ids[0]
            (self.greedy if p.greedy or argmax else self.sampled).append(i)
        self.vocab_size = vocab_size
        self.device = device

    def _tensors(self, idx: list[int]) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
        """(row indices, each row's end-tag id, bool [rows, vocab] of each row's stop ids)."""
        dev = self.device
        # built on the device from the (few) stop ids: no vocabulary-wide host copy per step
        mask = torch.zeros(len(idx), self.vocab_size, dtype=torch.bool, device=dev)
        at = [(j, t) for j, i in enumerate(idx) for t in self._stops[i]]
        mask[torch.tensor([j for j, _ in at], device=dev), torch.tensor([t for _, t in at], device=dev)] = True
        return (torch.tensor(idx, dtype=torch.long, device=dev),
                torch.tensor([self._end[i] for i in idx], dtype=torch.long, device=dev), mask)

    def greedy_logits(self, x: torch.Tensor) -> torch.Tensor:
        """x with each greedy row whose best token is a stop id reduced to its end-tag id (every
        other logit -inf); x itself when no greedy row is under the rule."""
        if not self.greedy:
            return x
        idx, end, stop = self._tensors(self.greedy)
        sub = x.index_select(0, idx)
        hit = stop.gather(1, sub.argmax(dim=-1, keepdim=True))
        forced = torch.full_like(sub, float("-inf")).scatter_(1, end[:, None], 0.0)
        out = x.clone()
        out[idx] = torch.where(hit, forced, sub)
        return out

    def replace_drawn(self, ids: torch.Tensor) -> torch.Tensor:
        """ids with each sampled row's drawn stop id replaced by its end-tag id (exactly where the
        stop would have been sampled: the draws before it are the unconstrained request's)."""
        if not self.sampled:
            return ids
        idx, end, stop = self._tensors(self.sampled)
        sub = ids.index_select(0, idx)
        ids = ids.clone()
        ids[idx] = torch.where(stop.gather(1, sub[:, None])[:, 0], end, sub)
        return ids

    def sampled_probs(self, probs: torch.Tensor) -> torch.Tensor:
        """probs with each sampled row's stop-id mass moved onto its end-tag id (in place)."""
        if not self.sampled:
            return probs
        idx, end, stop = self._tensors(self.sampled)
        sub = probs.index_select(0, idx)
        moved = (sub * stop).sum(dim=-1, keepdim=True)
        sub = sub.masked_fill(stop, 0.0)
        sub.scatter_add_(1, end[:, None], moved)
        probs[idx] = sub
        return probs
