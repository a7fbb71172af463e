"""logprob_token_ids (vLLM's): a request names the token ids whose logprobs it wants at every
step, instead of the top k. One gather on the device for the whole batch; rows that did not ask
get none."""

from __future__ import annotations

import torch


def gather_named(raw_lp: torch.Tensor, params) -> tuple[torch.Tensor, torch.Tensor] | None:
    """(ids, logprobs), rows x the longest list (padded with id 0, dropped on the host), or None
    when no row asked."""
    lists = [list(p.logprob_token_ids or ()) for p in params]
    width = max((len(x) for x in lists), default=0)
    if width == 0:
        return None
    ids = torch.zeros(len(lists), width, dtype=torch.long)
    for i, x in enumerate(lists):
        if x:
            ids[i, : len(x)] = torch.tensor(x, dtype=torch.long)
    ids = ids.to(raw_lp.device)
    return ids, raw_lp.gather(1, ids)


def named_top(params, row: int, ids: list[list[int]], vals: list[list[float]]) -> list[tuple[int, float]]:
    n = len(params.logprob_token_ids or ())
    return list(zip(ids[row][:n], vals[row][:n]))
