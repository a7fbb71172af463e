"""Speculative (rejection) sampling over a verify step's logits.

Every proposer here drafts deterministically (MTP argmax, n-gram lookup): the draft
distribution q is one-hot at the draft d. With p_j the target's distribution at draft position
j (logit bias; the thinking budget's forced token and penalties over the output so far plus the
drafts before j; the grammar's mask after those drafts; then temperature, top-k, top-p, min-p;
inside a constrained thinking the stop ids' mass moved onto the end tag (g906/engine/
constrained_thinking.py): the sampler's own processing), the standard rule accepts d_j with
probability min(1, p_j(d_j) / q(d_j)) = p_j(d_j); at the first rejection the token is drawn from
norm(max(p_j - q, 0)) = p_j without d_j, renormalised; when all k drafts are accepted a bonus
token is drawn from p_k. The emitted tokens then follow the target's distribution exactly
(Leviathan et al. 2023, Chen et al. 2023). Greedy rows accept while the draft equals the
argmax and end with the argmax.

Random numbers per sampled row and step: one uniform per draft, then one Exp(1) vector of the
vocabulary size for the final draw (the sampler's exponential race), from the row's own
generator when seeded, so a seeded request is reproducible."""

from __future__ import annotations

from dataclasses import dataclass

import torch

from g906.engine.sampler import Sampler, SamplerRow


@dataclass
class VerifyRow:
    """One sequence of a verify step: its logits rows [offset, offset + len(drafts)]."""
    row: SamplerRow                  # the sequence's sampler row (output_token_ids before the step)
    offset: int
    drafts: list[int]
    # per position (len(drafts) + 1), whether a grammar masks it (structured outputs): the masked
    # positions of all rows take the bitmask's rows in order; None: none is
    masked: list[bool] | None = None


def _position_rows(v: VerifyRow) -> list[SamplerRow]:
    """The sampler rows of each position: penalties see the drafts before it as output."""
    r = v.row
    out = []
    for j in range(len(v.drafts) + 1):
        hist = None
        if r.output_token_ids is not None:
            hist = list(r.output_token_ids) + v.drafts[:j]
        out.append(SamplerRow(key=r.key, params=r.params, prompt_token_ids=r.prompt_token_ids,
                              output_token_ids=hist))
    return out


def verify(sampler: Sampler, logits: torch.Tensor, rows: list[VerifyRow],
           bitmask: torch.Tensor | None = None) -> list[list[int]]:
    """The tokens each sequence emits this step: its accepted drafts, then one more token.
    logits: [T, V] of the step (T covers every row's positions); bitmask: the grammar masks of
    the masked positions (VerifyRow.masked), one int32 row each, in order. A masked position's
    distribution is the target's restricted to its mask, as the plain sampler's is, so a draft
    outside it is never accepted."""
    if not rows:
        return []
    dev = logits.device
    index, prow, masked = [], [], []
    for v in rows:
        index.extend(range(v.offset, v.offset + len(v.drafts) + 1))
        if v.masked is not None:
            masked.extend(len(prow) + j for j, on in enumerate(v.masked) if on)
        prow.extend(_position_rows(v))
    sel = logits.index_select(0, torch.tensor(index, dtype=torch.long, device=dev))
    x, probs = sampler.distribution(sel, prow, (masked, bitmask) if masked else None)
    argmax = x.argmax(dim=-1).tolist()
    starts, at = [], 0
    for v in rows:
        starts.append(at)
        at += len(v.drafts) + 1
    out: list[list[int] | None] = [None] * len(rows)
    sampled = [i for i, v in enumerate(rows) if not v.row.params.greedy]
    for i, v in enumerate(rows):
        if v.row.params.greedy:
            s, toks = starts[i], []
            for j, d in enumerate(v.drafts):
                if argmax[s + j] != d:
                    break
                toks.append(d)
            toks.append(argmax[s + len(toks)])
            out[i] = toks
    if sampled:
        # p_j(d_j) of every draft of the sampled rows, one copy to the host
        pos = [starts[i] + j for i in sampled for j in range(len(rows[i].drafts))]
        tok = [d for i in sampled for d in rows[i].drafts]
        pd = probs[torch.tensor(pos, dtype=torch.long, device=dev),
                   torch.tensor(tok, dtype=torch.long, device=dev)].tolist() if pos else []
        finals, masks, exps = [], [], []
        at = 0
        for i in sampled:
            v = rows[i]
            g = sampler.generator_for(v.row)
            k = len(v.drafts)
            u = torch.rand(k, generator=g, device=g.device).tolist() if k else []
            m = 0
            while m < k and u[m] < pd[at + m]:
                m += 1
            at += k
            finals.append(starts[i] + m)
            masks.append(v.drafts[m] if m < k else -1)
            exps.append(torch.empty(probs.shape[1], device=g.device).exponential_(generator=g))
            out[i] = v.drafts[:m]
        p = probs.index_select(0, torch.tensor(finals, dtype=torch.long, device=dev))
        mask = torch.tensor(masks, dtype=torch.long, device=dev)
        rej = mask >= 0
        if bool(rej.any()):
            # the rejected draft's mass removed: sampling from p without it is sampling from the
            # renormalised residual (the race's argmax does not need the renormalisation)
            p[rej, mask[rej]] = 0.0
        q = torch.stack(exps).to(dev)
        last = (p / q.clamp_min(1e-20)).argmax(dim=-1).tolist()
        for n, i in enumerate(sampled):
            out[i].append(int(last[n]))
    return out  # type: ignore[return-value]
