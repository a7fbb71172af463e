"""Beam search (vLLM's use_beam_search) over the engine's own sequences.

A request with use_beam_search runs as a BeamGroup of at most n (the width) sequences, scheduled
and batched like any others. After each step, every live beam offers its 2n most likely next
tokens (the sampler's top logprobs of the raw distribution); a token that ends the sequence (an
EOS id unless ignore_eos, a stop_token_id) makes a finished hypothesis at once, and of the rest
the n best by cumulative logprob carry on. A beam chosen more than once is forked: the child
shares the parent's full KV blocks (reference counts), gets its own copy of the partly filled
last block and of the parent's linear-attention (Gated DeltaNet) state slot, since each beam's
recurrent state is its own. A beam chosen by nobody is freed. When the beams reach max_tokens
(or the context), when none is left, or with early_stopping once n hypotheses have finished,
the n best hypotheses by score = cum_logprob / length ** length_penalty (length: prompt and
output tokens, a final stop token not counted, as vLLM) are the request's n outputs, each one
whole, finished StepOutput (its fields: the engine builds it).

Resources: the group's first beam is admitted only with n places and n state slots free (the
n - 1 others are set aside for its later beams), so a group never waits for another's. A fork
that finds no free KV block (or a parent that was preempted) goes to the waiting queue instead
and is prefilled again, like a preempted sequence. Nothing here is pipelined: the next step's
beams depend on this step's logprobs."""

from __future__ import annotations

import math
from dataclasses import dataclass, field, replace

from g906.engine.block_manager import OutOfBlocks
from g906.engine.sampler import TokenLogprobs
from g906.engine.sampling_params import SamplingParams
from g906.engine.sequence import Sequence, SequenceStatus


@dataclass
class Hypothesis:
    """A finished beam: its output tokens, the logprobs of each, and how it ended."""
    token_ids: list[int]
    cum_logprob: float
    logprobs: list[TokenLogprobs]
    finish_reason: str
    stop_reason: str | int | None = None
    text: str | None = None             # set where a stop string cut it; else decoded at the end

    def score(self, prompt_len: int, length_penalty: float) -> float:
        n = prompt_len + len(self.token_ids) - (1 if isinstance(self.stop_reason, int) else 0)
        try:
            norm = float(max(n, 1)) ** length_penalty
        except OverflowError:                 # a huge length_penalty: the score tends to 0
            norm = math.inf
        if norm == 0.0:                       # a hugely negative one: to -inf
            return -math.inf if self.cum_logprob < 0 else 0.0
        return self.cum_logprob / norm


@dataclass
class BeamGroup:
    request_id: str
    output_ids: list[str]               # the request id of each of the n outputs
    params: SamplingParams              # as the request gave them (n = width)
    root: Sequence
    beams: list[Sequence] = field(default_factory=list)     # the live beams
    cum: dict[int, float] = field(default_factory=dict)     # seq_id -> cumulative logprob
    history: dict[int, list[TokenLogprobs]] = field(default_factory=dict)
    pending: dict[int, TokenLogprobs] = field(default_factory=dict)   # this round's logprobs
    done: list[Hypothesis] = field(default_factory=list)
    spare_slots: list[int] = field(default_factory=list)   # state slots set aside for later beams
    started: bool = False               # the first beam was admitted (the slots are reserved)
    closed: bool = False

    @property
    def width(self) -> int:
        return self.params.n


def beam_params(params: SamplingParams) -> SamplingParams:
    """What each beam's sequence samples with: deterministic, one token, and logprobs enough for
    its 2n candidates and for the answer's own top logprobs."""
    k = params.logprobs
    want = -1 if k == -1 else max(2 * params.n, k or 0)
    return replace(params, n=1, use_beam_search=False, temperature=0.0, logprobs=want, max_tokens=None,
                   stop=[], stop_token_ids=[], ignore_eos=True, include_stop_str_in_output=False,
                   early_stopping=False)


class BeamSearch:
    """The engine's beam groups (LLMEngine.beams)."""

    def __init__(self, engine):
        self.engine = engine
        self.groups: dict[str, BeamGroup] = {}
        self._owner: dict[str, str] = {}       # an output's request id -> its group's

    def check(self, params: SamplingParams) -> None:
        eng = self.engine
        if eng.spec is not None:
            err = ValueError("beam search (use_beam_search) is not available with speculative decoding "
                             "(this server runs with engine.speculative)")
            err.param = "use_beam_search"   # type: ignore[attr-defined]
            raise err
        if params.n > eng.config.max_num_seqs:
            err = ValueError(f"n (the beam width, {params.n}) must not exceed max_num_seqs "
                             f"({eng.config.max_num_seqs}): every beam runs as a sequence")
            err.param = "n"   # type: ignore[attr-defined]
            raise err

    def add(self, request_id: str, prompt_token_ids: list[int], params: SamplingParams, mm,
            output_ids: list[str]) -> None:
        self.check(params)
        if len(output_ids) != params.n:
            raise ValueError(f"{len(output_ids)} output ids for a beam width of {params.n}")
        for rid in [request_id, *output_ids]:
            if self.owns(rid) or rid in self.engine._requests:
                raise ValueError(f"request id {rid!r} is already running")
        seq = Sequence(request_id, [int(t) for t in prompt_token_ids], beam_params(params))
        seq.mm = mm
        group = BeamGroup(request_id, list(output_ids), params, seq, beams=[seq])
        seq.beam = group
        group.cum[seq.seq_id] = 0.0
        group.history[seq.seq_id] = []
        self.groups[request_id] = group
        for rid in output_ids:
            self._owner[rid] = request_id
        self.engine.scheduler.add(seq)

    def owns(self, request_id: str) -> bool:
        """Whether request_id names a beam group or one of its outputs."""
        return request_id in self.groups or request_id in self._owner

    def abort(self, request_id: str) -> bool:
        group = self.groups.get(self._owner.get(request_id, request_id))
        if group is None:
            return False
        self._close(group)
        return True

    def record(self, seq: Sequence, lp: TokenLogprobs) -> None:
        """A beam's logprobs of this step."""
        seq.beam.pending[seq.seq_id] = lp

    def advance_ready(self) -> list[dict]:
        """Advance every group whose live beams all have this round's logprobs; the outputs of
        the groups that finished (StepOutput fields)."""
        outs: list = []
        for group in list(self.groups.values()):
            if group.beams and all(b.seq_id in group.pending for b in group.beams):
                outs += self._advance(group)
        return outs

    # -- one round ---------------------------------------------------------------------------------
    def _advance(self, group: BeamGroup) -> list:
        p, width = group.params, group.width
        ends = set(p.stop_token_ids) | (set() if p.ignore_eos else set(self.engine.eos_token_ids))
        cands: list[tuple[float, Sequence, int, TokenLogprobs]] = []
        for seq in group.beams:
            lp = group.pending.pop(seq.seq_id)
            base = group.cum[seq.seq_id]
            top = lp.top if p.logprobs == -1 else lp.top[: p.logprobs or 0]
            for rank, (tok, v) in enumerate(lp.top[: 2 * width], start=1):
                entry = TokenLogprobs(int(tok), float(v), rank, top)
                if tok in ends:
                    group.done.append(self._hypothesis(group, seq, tok, entry, base + v, "stop", int(tok)))
                else:
                    cands.append((base + v, seq, int(tok), entry))
        cands.sort(key=lambda c: -c[0])              # stable: ties keep beam and rank order
        first = group.beams[0]
        at_limit = ((p.max_tokens is not None and first.num_output_tokens + 1 >= p.max_tokens)
                    or first.num_tokens + 1 >= self.engine.max_model_len)
        chosen = []
        for cum, seq, tok, entry in cands:
            if len(chosen) == width:
                break
            cut = self._stop_string(group, seq, tok) if p.stop else None
            if cut is not None:
                h = self._hypothesis(group, seq, tok, entry, cum, "stop", cut[1])
                h.text = cut[0]
                group.done.append(h)
            else:
                chosen.append((cum, seq, tok, entry))
        if at_limit:
            group.done += [self._hypothesis(group, s, t, e, c, "length", None) for c, s, t, e in chosen]
            chosen = []
        # a finished hypothesis's score is final: those below the width best can never be chosen
        plen = group.root.num_prompt_tokens
        group.done = sorted(group.done, key=lambda h: h.score(plen, p.length_penalty), reverse=True)[:width]
        if not chosen or (p.early_stopping and len(group.done) >= width):
            return self._finish(group)
        self._fork_round(group, chosen)
        return []

    def _fork_round(self, group: BeamGroup, chosen: list) -> None:
        eng = self.engine
        kids: dict[int, list] = {}
        for cum, seq, tok, entry in chosen:
            kids.setdefault(seq.seq_id, []).append((cum, tok, entry))
        for seq in list(group.beams):
            if seq.seq_id not in kids:
                self._drop(group, seq)            # first, so that forks can have its blocks and slot
            elif seq.status is SequenceStatus.RUNNING and seq.num_uncached_tokens:
                # preempted after its logprobs came, and part-way through its new prefill: it
                # starts again from the queue, with its children (its cache is not at its end)
                eng.scheduler.preempt(seq)
        states: list[tuple[int, int]] = []
        blocks: list[tuple[int, int]] = []
        beams: list[Sequence] = []
        for seq in [b for b in group.beams if b.seq_id in kids]:
            mine = kids[seq.seq_id]
            for cum, tok, entry in mine[1:]:      # forks copy the parent before it grows
                beams.append(self._fork(group, seq, tok, cum, entry, states, blocks))
            cum, tok, entry = mine[0]
            seq.append_token(tok)
            group.cum[seq.seq_id] = cum
            group.history[seq.seq_id].append(entry)
            beams.append(seq)
        # in device order before the next step's forward overwrites the parents' state
        if blocks:
            eng.runner.copy_blocks(blocks)
        if states:
            eng.runner.copy_states(states)
        group.beams = beams

    def _fork(self, group: BeamGroup, parent: Sequence, tok: int, cum: float, entry: TokenLogprobs,
              states: list, blocks: list) -> Sequence:
        eng = self.engine
        child = Sequence(group.request_id, parent.token_ids, parent.params, arrival=parent.arrival)
        child.num_prompt_tokens = parent.num_prompt_tokens
        child.beam, child.mm, child.num_hit_tokens = group, parent.mm, parent.num_hit_tokens
        child.append_token(tok)
        group.cum[child.seq_id] = cum
        group.history[child.seq_id] = group.history[parent.seq_id] + [entry]
        sched = eng.scheduler
        if parent.status is SequenceStatus.RUNNING and parent.state_slot is not None and group.spare_slots:
            try:
                pair = eng.cache.blocks.fork(parent, child)
            except OutOfBlocks:
                pair = False
            if pair is not False:
                eng.cache.acquire_slot(child)
                states.append((parent.state_slot, child.state_slot))
                if pair is not None:
                    blocks.append(pair)
                full = parent.num_cached_tokens // eng.cache.blocks.block_size
                child.num_cached_tokens = parent.num_cached_tokens
                child.block_keys = list(parent.block_keys[:full])
                child.num_registered_blocks = min(parent.num_registered_blocks, full)
                child.status = SequenceStatus.RUNNING
                sched.running.append(child)
                return child
        sched.waiting.appendleft(child)           # prefilled again, as after a preemption
        return child

    def _drop(self, group: BeamGroup, seq: Sequence) -> None:
        self.engine.scheduler.finish(seq, "abort")
        self.engine.runner.sampler.forget(seq.seq_id)
        group.beams.remove(seq)
        group.pending.pop(seq.seq_id, None)
        group.cum.pop(seq.seq_id, None)
        group.history.pop(seq.seq_id, None)

    def _close(self, group: BeamGroup) -> None:
        """Free everything the group holds (its beams, their slots, the slots set aside)."""
        for seq in list(group.beams):
            self._drop(group, seq)
        group.closed = True
        self.engine.cache.slots.unreserve(group.spare_slots)
        group.spare_slots = []
        self.groups.pop(group.request_id, None)
        for rid in group.output_ids:
            self._owner.pop(rid, None)

    # -- hypotheses and outputs ------------------------------------------------------------------------
    def _hypothesis(self, group, seq, tok, entry, cum, reason, stop) -> Hypothesis:
        return Hypothesis(seq.output_token_ids + [int(tok)], float(cum), group.history[seq.seq_id] + [entry],
                          reason, stop)

    def _stop_string(self, group: BeamGroup, seq: Sequence, tok: int) -> tuple[str, str] | None:
        """(the text up to the stop string, the stop string) when appending tok completes one.
        Only the output's tail is decoded first: no stop string was in the text before tok."""
        p = group.params
        ids = seq.output_token_ids + [tok]
        decode = self.engine.tokenizer.decode
        longest = max(len(s) for s in p.stop)
        window = longest + 8
        tail = decode(ids[-window:], skip_special_tokens=p.skip_special_tokens)
        if len(ids) <= window or len(tail) > longest:
            if not any(s in tail for s in p.stop):
                return None
        text = decode(ids, skip_special_tokens=p.skip_special_tokens)
        hits = [(text.find(s), s) for s in p.stop if s in text]
        if not hits:
            return None
        at, s = min(hits)
        return text[: at + len(s)] if p.include_stop_str_in_output else text[:at], s

    def _text(self, group: BeamGroup, h: Hypothesis) -> str:
        if h.text is not None:
            return h.text
        p = group.params
        ids = h.token_ids
        if isinstance(h.stop_reason, int) and not p.include_stop_str_in_output:
            ids = ids[:-1]                    # a stop token's text is not part of the output
        return self.engine.tokenizer.decode(ids, skip_special_tokens=p.skip_special_tokens)

    def _finish(self, group: BeamGroup) -> list[dict]:
        """The n outputs, as the fields of the engine's StepOutputs."""
        self._close(group)
        p = group.params
        plen = group.root.num_prompt_tokens
        best = sorted(group.done, key=lambda h: h.score(plen, p.length_penalty), reverse=True)[: group.width]
        outs = []
        for i, rid in enumerate(group.output_ids):
            h = best[i] if i < len(best) else Hypothesis([], 0.0, [], "length")
            outs.append(dict(
                request_id=rid, new_token_ids=list(h.token_ids), new_text=self._text(group, h),
                new_logprobs=list(h.logprobs) if p.logprobs is not None else [],
                finished=True, finish_reason=h.finish_reason, stop_reason=h.stop_reason,
                num_prompt_tokens=plen, num_output_tokens=len(h.token_ids),
                num_cached_tokens=group.root.num_hit_tokens, cumulative_logprob=h.cum_logprob,
            ))
        return outs
