"""logit_bias: per-request additive biases of chosen tokens' logits, applied on the logits'
device before the penalties and the sampling filters (so that -100 bans a token and +100 all but
forces it, as OpenAI documents). The logprobs a request asked for stay those of the model's raw
distribution, as with the penalties."""

from __future__ import annotations

import torch


def has_bias(rows) -> bool:
    return any(r.params.logit_bias for r in rows)


def apply_logit_bias(logits: torch.Tensor, rows) -> torch.Tensor:
    """logits (rows x vocab) with each row's biases added (a new tensor; the input untouched).
    One scatter for the whole batch: the (row, token, bias) triples go to the device at once."""
    if not has_bias(rows):
        return logits
    v = logits.shape[1]
    r_idx, t_idx, vals = [], [], []
    for i, r in enumerate(rows):
        for t, b in (r.params.logit_bias or {}).items():
            if 0 <= t < v:          # the server refuses ids outside the vocabulary; padding rows may be smaller
                r_idx.append(i)
                t_idx.append(t)
                vals.append(float(b))
    out = logits.clone()
    if not vals:
        return out
    dev = logits.device
    flat = torch.tensor(r_idx, dtype=torch.long) * v + torch.tensor(t_idx, dtype=torch.long)
    out.view(-1).index_add_(0, flat.to(dev), torch.tensor(vals, dtype=logits.dtype).to(dev))
    return out
