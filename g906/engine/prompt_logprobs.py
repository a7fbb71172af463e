"""prompt_logprobs: the logprobs of a prompt's own tokens (position i's logits scored against
token i + 1), for the requests that ask. Only those requests pay for it: their prefill chunks
run on the eager path (the prefill graphs compute the last position's logits only), and only
their rows of the step's hidden states go through the LM head. The first prompt token has no
logprob (nothing precedes it); the last prompt position's logits are the first sampled token's.

A preempted sequence recomputes its prompt: its list restarts with its first chunk."""

from __future__ import annotations

import torch

from g906.engine.sampler import TokenLogprobs


def wants_prompt_logprobs(batch) -> bool:
    return batch.is_prefill and any(s.params.prompt_logprobs is not None for s in batch.seqs)


def collect(batch, hidden: torch.Tensor, compute_logits) -> None:
    """Append the logprobs of this step's prompt chunk to each asking sequence's prompt_logprobs.
    hidden: the step's hidden states, one row per scheduled token (in batch order)."""
    start_row = 0
    for s, n in zip(batch.seqs, batch.num_new_tokens):
        rows = range(start_row, start_row + n)
        start_row += n
        k = s.params.prompt_logprobs
        if k is None:
            continue
        first = s.num_cached_tokens                      # the chunk's first position
        if first == 0:
            s.prompt_logprobs = []
        # positions first .. first+n-1 predict tokens first+1 .. ; keep the prompt's own tokens
        last = min(first + n, s.num_prompt_tokens - 1)
        if last <= first:
            continue
        idx = torch.arange(rows.start, rows.start + (last - first), device=hidden.device)
        lp = torch.log_softmax(compute_logits(hidden.index_select(0, idx)).float(), dim=-1)
        targets = torch.tensor(s.token_ids[first + 1:last + 1], dtype=torch.long, device=lp.device)
        chosen = lp.gather(1, targets[:, None])[:, 0]
        ranks = (lp > chosen[:, None]).sum(dim=-1) + 1
        kk = lp.shape[1] if k == -1 else k
        top_v, top_i = lp.topk(kk, dim=-1) if kk > 0 else (None, None)
        chosen_l, ranks_l, tgt = chosen.tolist(), ranks.tolist(), targets.tolist()
        tv = top_v.tolist() if top_v is not None else None
        ti = top_i.tolist() if top_i is not None else None
        for j in range(len(tgt)):
            top = list(zip(ti[j], tv[j])) if ti is not None else []
            s.prompt_logprobs.append(TokenLogprobs(tgt[j], chosen_l[j], int(ranks_l[j]), top))
