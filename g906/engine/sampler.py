"""The sampler: next tokens for a batch of rows of logits, all on the logits' device.

Per row: repetition / presence / frequency penalties, then greedy (temperature 0) or
temperature + top-k + top-p + min-p sampling. Random draws use the exponential-race form
(argmax of p / q with q ~ Exp(1)), one draw of V numbers per row and step, from a per-request
generator when the request has a seed (so a seeded request gives the same tokens however it is
batched) or from the engine's generator otherwise. Logprobs are those of the model's raw
distribution (log-softmax of the logits before penalties and temperature), like OpenAI's.

The only device-to-host copy per step is the sampled token ids (plus the logprobs when a row
asked for them)."""

from __future__ import annotations

from dataclasses import dataclass

import torch

from g906.engine.constrained_thinking import Closing, apply_continuation
from g906.engine.logit_bias import apply_logit_bias
from g906.engine.logprob_ids import gather_named, named_top
from g906.engine.sampling_params import SamplingParams
from g906.engine.thinking_budget import apply_thinking_budget


@dataclass
class TokenLogprobs:
    token_id: int
    logprob: float
    rank: int                                  # 1 = most likely
    top: list[tuple[int, float]]               # the top-k (token id, logprob), best first


@dataclass
class SamplerRow:
    """What the sampler needs to know about one row."""
    key: int                                   # identifies the request (for its generator)
    params: SamplingParams
    prompt_token_ids: list[int] | None = None  # only needed with a repetition penalty
    output_token_ids: list[int] | None = None  # only needed with penalties


class Sampler:
    def __init__(self, device: torch.device | str = "cpu", seed: int | None = None, eos_token_ids=()):
        """eos_token_ids: the model's end ids (a request under g906/engine/constrained_thinking.py's
        rule closes its thinking where one would end it)."""
        self.device = torch.device(device)
        self.eos_token_ids = frozenset(int(t) for t in eos_token_ids)
        self._generators: dict[int, torch.Generator] = {}
        self._shared = torch.Generator(device=self.device)
        if seed is None:
            self._shared.seed()
        else:
            self._shared.manual_seed(seed)

    def forget(self, key: int) -> None:
        """Drop a finished request's generator."""
        self._generators.pop(key, None)

    def _generator(self, row: SamplerRow) -> torch.Generator:
        g = self._generators.get(row.key)
        if g is None:
            g = torch.Generator(device=self.device)
            g.manual_seed(int(row.params.seed) % 2**64)
            self._generators[row.key] = g
        return g

    # -- steps ---------------------------------------------------------------------------------
    def _penalize(self, logits: torch.Tensor, rows: list[SamplerRow]) -> torch.Tensor:
        n, v = logits.shape
        dev = logits.device
        idx = [i for i, r in enumerate(rows) if r.params.has_penalties]
        if not idx:
            return logits
        logits = logits.clone()
        sub = logits[idx]
        m = len(idx)
        outs = [rows[i].output_token_ids or [] for i in idx]
        width = max(1, max(len(o) for o in outs))
        pad = torch.full((m, width), v, dtype=torch.long)
        for j, o in enumerate(outs):
            if o:
                pad[j, : len(o)] = torch.tensor(o, dtype=torch.long)
        pad = pad.to(dev)
        counts = torch.zeros(m, v + 1, device=dev, dtype=logits.dtype)
        counts.scatter_add_(1, pad, torch.ones_like(pad, dtype=logits.dtype))
        counts = counts[:, :v]
        pres = torch.tensor([rows[i].params.presence_penalty for i in idx], device=dev, dtype=logits.dtype)
        freq = torch.tensor([rows[i].params.frequency_penalty for i in idx], device=dev, dtype=logits.dtype)
        rep = torch.tensor([rows[i].params.repetition_penalty for i in idx], device=dev, dtype=logits.dtype)
        seen = counts > 0
        if any(rows[i].params.repetition_penalty != 1.0 for i in idx):
            prompts = [rows[i].prompt_token_ids or [] for i in idx]
            pw = max(1, max(len(p) for p in prompts))
            ppad = torch.full((m, pw), v, dtype=torch.long)
            for j, p in enumerate(prompts):
                if p:
                    ppad[j, : len(p)] = torch.tensor(p, dtype=torch.long)
            in_prompt = torch.zeros(m, v + 1, device=dev, dtype=torch.bool)
            in_prompt.scatter_(1, ppad.to(dev), True)
            rep_mask = seen | in_prompt[:, :v]
            r = rep[:, None]
            sub = torch.where(rep_mask, torch.where(sub > 0, sub / r, sub * r), sub)
        sub = sub - freq[:, None] * counts - pres[:, None] * seen.to(sub.dtype)
        logits[idx] = sub
        return logits

    def _filter(self, logits: torch.Tensor, params: list[SamplingParams]) -> torch.Tensor:
        """Temperature, then top-k / top-p / min-p (masked logits set to -inf)."""
        n, v = logits.shape
        dev = logits.device
        temps = torch.tensor([p.temperature if not p.greedy else 1.0 for p in params], device=dev)
        logits = logits / temps[:, None].to(logits.dtype)
        need_k = any(0 < p.top_k < v for p in params)
        need_p = any(p.top_p < 1.0 for p in params)
        need_min = any(p.min_p > 0.0 for p in params)
        if not (need_k or need_p or need_min):
            return logits
        vals, order = logits.sort(dim=-1, descending=True)
        mask = torch.zeros_like(vals, dtype=torch.bool)
        if need_k:
            k = torch.tensor([p.top_k if 0 < p.top_k < v else v for p in params], device=dev)
            mask |= torch.arange(v, device=dev)[None, :] >= k[:, None]
        if need_p or need_min:
            probs = torch.softmax(vals.masked_fill(mask, float("-inf")), dim=-1)
            if need_p:
                top_p = torch.tensor([p.top_p for p in params], device=dev, dtype=probs.dtype)
                before = probs.cumsum(dim=-1) - probs        # mass of strictly better tokens
                mask |= before > top_p[:, None]
            if need_min:
                min_p = torch.tensor([p.min_p for p in params], device=dev, dtype=probs.dtype)
                mask |= probs < (min_p[:, None] * probs[:, :1])
        mask[:, 0] = False                                   # always keep the best token
        vals = vals.masked_fill(mask, float("-inf"))
        return torch.full_like(logits, float("-inf")).scatter(1, order, vals)

    def distribution(self, logits: torch.Tensor, rows: list[SamplerRow],
                     mask: "tuple[list[int], torch.Tensor] | None" = None) -> tuple[torch.Tensor, torch.Tensor | None]:
        """(processed logits, sampling probabilities) of each row, exactly as launch() computes
        them before its draw (logit bias, thinking budget, the structured-outputs mask, penalties,
        a constrained thinking's stop closing it): the argmax of the first is a greedy row's
        token; the second (None when every row is greedy) has temperature, top-k, top-p and min-p
        applied. Speculative verification (g906/engine/spec) samples from these."""
        logits = logits.float()
        params = [r.params for r in rows]
        closing = Closing(rows, self.eos_token_ids, logits.shape[1], logits.device)
        x = self._processed(logits, rows, mask, closing)
        if all(p.greedy for p in params):
            return x, None
        return x, closing.sampled_probs(torch.softmax(self._filter(x, params), dim=-1))

    def _processed(self, logits: torch.Tensor, rows: list[SamplerRow], mask, closing: Closing) -> torch.Tensor:
        """Every row's logits before temperature and the filters: bias, forced thinking end,
        grammar mask, penalties, and a greedy row's stop token closing its constrained thinking
        (the input itself when none applies)."""
        x = apply_continuation(apply_thinking_budget(apply_logit_bias(logits, rows), rows), rows)
        if mask is not None and mask[0]:
            from g906.engine.structured.mask import apply

            x = apply(x, mask[0], mask[1])
        return closing.greedy_logits(self._penalize(x, rows))

    def generator_for(self, row: SamplerRow) -> torch.Generator:
        """The generator row's random draws come from: its own when seeded, else the shared one."""
        return self._generator(row) if row.params.seed is not None else self._shared

    def __call__(self, logits: torch.Tensor, rows: list[SamplerRow]) -> tuple[list[int], list[TokenLogprobs | None]]:
        return self.launch(logits, rows).result()

    def launch(self, logits: torch.Tensor, rows: list[SamplerRow],
               argmax: torch.Tensor | None = None,
               mask: "tuple[list[int], torch.Tensor] | None" = None) -> "PendingSample":
        """Queue the sampling work on the device and start the copies of its results to the
        host; PendingSample.result() waits for them. Everything that reads `logits` is queued
        here, so the caller may overwrite them (replay the next decode graph) right after.
        argmax: the rows' argmax of `logits` if already computed (the decode graphs do it).
        mask: (rows, int32 bitmask on the CPU) of the constrained rows (structured outputs): their
        disallowed tokens are never sampled (logprobs stay the model's own)."""
        if logits.shape[0] != len(rows):
            raise ValueError(f"{logits.shape[0]} rows of logits for {len(rows)} requests")
        if not rows:
            return PendingSample(None, [], None)
        logits = logits.float()
        params = [r.params for r in rows]
        want_lp = [p.logprobs is not None for p in params]
        raw_lp = torch.log_softmax(logits, dim=-1) if any(want_lp) else None
        closing = Closing(rows, self.eos_token_ids, logits.shape[1], logits.device)
        x = self._processed(logits, rows, mask, closing)
        if x is not logits:                                # biased, masked or penalised: the given argmax is stale
            argmax = None
        if argmax is None and any(p.greedy for p in params):
            argmax = x.argmax(dim=-1)
        if all(p.greedy for p in params):
            ids = argmax
        else:
            y = self._filter(x, params)
            probs = torch.softmax(y, dim=-1)
            q = torch.empty_like(probs)
            unseeded = [i for i, p in enumerate(params) if p.seed is None and not p.greedy]
            if unseeded:
                q[unseeded] = torch.empty(len(unseeded), probs.shape[1], device=probs.device).exponential_(
                    generator=self._shared
                )
            for i, r in enumerate(rows):
                if r.params.seed is not None and not r.params.greedy:
                    q[i].exponential_(generator=self._generator(r))
            sampled = closing.replace_drawn((probs / q.clamp_min(1e-20)).argmax(dim=-1))
            if argmax is None:                             # no greedy row
                ids = sampled
            else:
                greedy = torch.tensor([p.greedy for p in params], device=x.device)
                ids = torch.where(greedy, argmax, sampled)
        lp = None
        if raw_lp is not None:
            kmax = raw_lp.shape[1] if any(p.logprobs == -1 for p in params) else max(p.logprobs or 0 for p in params)
            chosen = raw_lp.gather(1, ids[:, None])[:, 0]
            ranks = (raw_lp > chosen[:, None]).sum(dim=-1) + 1
            top_v, top_i = raw_lp.topk(kmax, dim=-1) if kmax > 0 else (None, None)
            named = gather_named(raw_lp, params)
            lp = [_to_host(t) for t in (chosen, ranks, top_v, top_i)] + [
                None if named is None else tuple(_to_host(t) for t in named)]
        return PendingSample(ids, params, lp)


def _to_host(t: torch.Tensor | None) -> torch.Tensor | None:
    """Start a device-to-host copy (asynchronous on a GPU: valid after the step's event)."""
    if t is None or t.device.type == "cpu":
        return t
    return t.to("cpu", non_blocking=True)


class PendingSample:
    """The sampled token ids (and logprobs) of one step, on their way to the host. `ids` stays on
    the device: the next decode step can take its input tokens from it without a host round trip."""

    def __init__(self, ids: torch.Tensor | None, params: list[SamplingParams], lp):
        self.ids = ids
        self.params = params
        self._lp = lp
        self._host_ids = _to_host(ids)
        self._event = None
        if ids is not None and ids.device.type == "cuda":
            self._event = torch.cuda.Event()
            self._event.record()
        self._result = None

    def result(self) -> tuple[list[int], list[TokenLogprobs | None]]:
        """Wait for this step's copies (only this step's work, not steps queued after it)."""
        if self._result is not None:
            return self._result
        if self._event is not None:
            self._event.synchronize()
        if self._host_ids is None:
            self._result = ([], [])
            return self._result
        token_ids = self._host_ids.tolist()                    # the one copy per step
        out_lp: list[TokenLogprobs | None] = [None] * len(token_ids)
        if self._lp is not None:
            chosen, ranks, top_v, top_i, named = self._lp
            named_ids, named_v = (named[0].tolist(), named[1].tolist()) if named is not None else (None, None)
            chosen_l, ranks_l = chosen.tolist(), ranks.tolist()
            top_v = top_v.tolist() if top_v is not None else None
            top_i = top_i.tolist() if top_i is not None else None
            for i, p in enumerate(self.params):
                if p.logprobs is None:
                    continue
                k = p.logprobs if p.logprobs >= 0 else len(top_i[i])   # -1: the whole vocabulary
                top = list(zip(top_i[i][:k], top_v[i][:k])) if k > 0 else []
                if p.logprob_token_ids:      # the sampled token, then the named ids, instead of the top k
                    top = [(token_ids[i], chosen_l[i])] + [
                        x for x in named_top(p, i, named_ids, named_v) if x[0] != token_ids[i]]
                out_lp[i] = TokenLogprobs(token_ids[i], chosen_l[i], int(ranks_l[i]), top)
        self._result = (token_ids, out_lp)
        return self._result
