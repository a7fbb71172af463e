"""SpecDecoder: the engine's speculative steps.

A decode step becomes a verify step: each sequence's last token and its drafts (k_i <= k) run
as one chunk of 1 + k_i positions through the target's prefill path (causal attention over the
cache, the linear-attention recurrence continued from the state slot), with every
linear-attention layer keeping the states from before the step. The logits of all positions
go to the rejection sampler (rejection.py); each sequence emits its accepted drafts plus one
token, and its linear-attention state is rolled back to its last accepted token
(Qwen35ForCausalLM.rollback_linear_state). Attention KV of rejected positions lies past the
sequence's length and is overwritten later; the blocks that held it stay with the sequence.

With method "mtp" every step (prefill chunks too) is followed by the MTP block over the
positions the target computed (so its KV cache keeps up), then k drafts per sequence that will
decode next (mtp.py). With "ngram" drafts come from the sequence's own tokens at verify time and
prefill steps are the runner's.

Per request, speculation is off where it cannot apply: logprobs asked for (rejected positions
have none to return) and prompts with images (M-RoPE positions). Such sequences ride in verify
steps with no drafts, sampled by the plain sampler. Every verify position is sampled as the plain
sampler would sample it there: logit bias at each position, the thinking budget's forced end tag
and a constrained thinking's stop token closing it (g906/engine/constrained_thinking.py) from the
output plus the drafts before it, and for structured outputs the grammar's mask after
the drafts before it (Guide.speculate: the matcher consumes the drafts and rolls back; the
drafts end before the first one the grammar forbids). The matcher then advances over the
emitted tokens only, as the engine takes them.

With the prefix cache (g906/engine/prefix_cache.py): a step's restores are copied before its
forward and a prefill step's saves after it, as the runner does; a verify step's planned
snapshot is moved to the last block boundary its accepted tokens reach and the rollback
replays the state there into the snapshot slot, so no snapshot holds a rejected draft. Only
accepted positions count as cached, so only their KV blocks are registered.

Verify steps replay graphs where the runner has decode graphs (a GPU, a model that supports
them): verify_graphs.py pads them to a static shape (k+1 token slots per sequence, padded batch
sizes) and captures the forward with its LM head, and the linear-attention rollback, for each
batch size; the rejection sampling between them runs on the host (with enforce_eager, the
same padded step without graphs, as decode steps do). Larger batches, sequences with images,
and runners without the padded decode path (the CPU, tensor parallelism) run the step eagerly,
unpadded. Prefill steps and the MTP drafter run eagerly; every step
runs synchronously (no lookahead: drafts are made on the host from the step before's tokens).
docs/engine.md says what that costs."""

from __future__ import annotations

from dataclasses import dataclass, field

import numpy as np
import torch

from g906.arch.speculative import SpeculativeConfig
from g906.engine.block_manager import BlockManager
from g906.engine.constrained_thinking import Closing, apply_continuation
from g906.engine.context import ForwardContext
from g906.engine.model_runner import sampler_row
from g906.engine.prefix_cache import PrefixCache
from g906.engine.sampler import SamplerRow
from g906.engine.scheduler import ScheduledBatch
from g906.engine.sequence import Sequence
from g906.engine.spec.ngram import propose_ngram
from g906.engine.spec.rejection import VerifyRow, verify
from g906.errors import G906Error


@dataclass
class SpecMetrics:
    """vLLM's counters: drafts (verify rows with at least one draft), draft tokens, accepted
    tokens, and accepted tokens by draft position."""
    k: int
    num_drafts: int = 0
    num_draft_tokens: int = 0
    num_accepted_tokens: int = 0
    accepted_per_pos: list[int] = field(default_factory=list)

    def __post_init__(self) -> None:
        self.accepted_per_pos = [0] * self.k

    def add(self, drafted: int, accepted: int) -> None:
        self.num_drafts += 1
        self.num_draft_tokens += drafted
        self.num_accepted_tokens += accepted
        for j in range(accepted):
            self.accepted_per_pos[j] += 1

    @property
    def mean_acceptance_length(self) -> float:
        """Tokens emitted per verify row (accepted drafts + the target's own): vLLM's figure."""
        return 1.0 + self.num_accepted_tokens / self.num_drafts if self.num_drafts else 0.0

    def to_json(self) -> dict:
        return {"spec_num_drafts": self.num_drafts, "spec_num_draft_tokens": self.num_draft_tokens,
                "spec_num_accepted_tokens": self.num_accepted_tokens,
                "spec_accepted_per_pos": list(self.accepted_per_pos),
                "spec_mean_acceptance_length": round(self.mean_acceptance_length, 4)}


@dataclass
class SpecResult:
    """What a speculative step did: per sequence, how many of its tokens are now cached and the
    tokens (with logprobs) it emits, in order."""
    advance: dict[int, int]
    tokens: dict[int, list[tuple[int, object]]]


@dataclass
class _Done:
    """A step's target hidden states and where each sequence's valid rows are (for the MTP)."""
    hidden: torch.Tensor
    seqs: list[Sequence]
    offsets: list[int]
    starts: list[int]        # the sequence's first position in the step
    advance: list[int]       # rows now valid (positions starts[i] .. starts[i] + advance[i] - 1)


def mtp_missing_error(source: str = "the model") -> G906Error:
    return G906Error(f"speculative decoding with method \"mtp\" needs an MTP block, and {source} has none",
                     hint="use a checkpoint that ships one (GGUF nextn_predict_layers > 0, HF "
                          "mtp_num_hidden_layers > 0) or method \"ngram\"")


class SpecDecoder:
    def __init__(self, runner, blocks: BlockManager, config: SpeculativeConfig, *, max_model_len: int,
                 max_num_batched_tokens: int, prefix: PrefixCache | None = None):
        self.runner = runner
        self.prefix = prefix
        self.model = runner.model
        self.blocks = blocks
        self.config = config
        self.k = config.num_speculative_tokens
        self.max_model_len = max_model_len
        self.max_num_batched_tokens = max_num_batched_tokens
        self.metrics = SpecMetrics(self.k)
        self.drafts: dict[int, list[int]] = {}
        # a constrained sequence's MTP drafting masks (position j: the mask after drafts[:j], or
        # None where unconstrained), which the verify step reuses instead of computing them again
        self.draft_masks: dict[int, list[torch.Tensor | None]] = {}
        self._done: _Done | None = None
        self.graphs = None           # VerifyGraphs (verify_graphs.py) on the runner's padded path
        rg = runner.graphs
        if rg is not None and self.k + 1 <= max_num_batched_tokens:
            from g906.engine.spec.verify_graphs import VerifyGraphs

            self.graphs = VerifyGraphs(self.model, runner.cache, k=self.k, block_size=runner.block_size,
                                       max_num_seqs=rg.max_num_seqs, max_model_len=max_model_len,
                                       max_tokens=max_num_batched_tokens, scratch_block=rg.scratch_block,
                                       scratch_slot=rg.scratch_slot, use_graphs=rg.use_graphs)
            self.graphs.capture()
        self.mtp = None
        if config.method == "mtp":
            self.mtp = build_mtp(self.model, runner.dtype, runner.device)
            self.mtp.bind_cache(runner.cache.num_blocks, runner.block_size)

    # -- requests ----------------------------------------------------------------------------------
    @staticmethod
    def enabled(seq: Sequence) -> bool:
        return seq.params.logprobs is None and seq.mm is None

    def forget(self, seq_id: int) -> None:
        self.drafts.pop(seq_id, None)
        self.draft_masks.pop(seq_id, None)

    def _budget(self, seq: Sequence, want: int) -> int:
        """How many drafts seq may verify: within k, the context and max_tokens (the step emits
        one token past its accepted drafts)."""
        n = min(want, self.k, self.max_model_len - seq.num_tokens)
        if seq.params.max_tokens is not None:
            n = min(n, seq.params.max_tokens - seq.num_output_tokens - 1)
        return max(0, n)

    def _cover(self, seq: Sequence, n: int, extra: int) -> int:
        """The largest m <= n for which seq's blocks can cover num_tokens + m + extra tokens (taken)."""
        while n > 0 and not self.blocks.can_cover(seq, seq.num_tokens + n + extra):
            n -= 1
        if n > 0:
            self.blocks.cover(seq, seq.num_tokens + n + extra)
        return n

    # -- one step ----------------------------------------------------------------------------------
    def run(self, batch: ScheduledBatch) -> SpecResult | None:
        """Run `batch` speculatively; None when it is an ordinary step for the runner."""
        on = [s for s in batch.seqs if self.enabled(s)]
        if not on:
            return None
        if batch.is_prefill:
            return self._prefill(batch) if self.mtp is not None else None
        drafts: dict[int, list[int]] = {}
        masked: dict[int, list[bool]] = {}
        rows = 0                                 # grammar mask rows written so far
        budget = self.max_num_batched_tokens - len(batch.seqs)
        for s in on:
            known = None
            if self.mtp is not None:
                d = self.drafts.pop(s.seq_id, [])
                known = self.draft_masks.pop(s.seq_id, None)
            else:
                c = self.config
                d = propose_ngram(s.token_ids, self._budget(s, self.k), c.prompt_lookup_min, c.prompt_lookup_max)
            n = self._cover(s, min(self._budget(s, len(d)), budget), 0)
            d = d[:n]
            if n and s.guide is not None:
                p = s.params
                allow = [not p.ignore_eos and s.num_output_tokens + j + 1 >= p.min_tokens for j in range(n + 1)]
                n, flags = s.guide.speculate(d, self._bitmask(rows + n + 1), rows, allow, known)
                if n:
                    masked[s.seq_id] = flags
                    rows += sum(flags)
            if n:
                drafts[s.seq_id] = d[:n]
                budget -= n
        if not drafts and self.mtp is None:
            return None
        return self._verify(batch, drafts, masked, rows)

    def _bitmask(self, rows: int) -> torch.Tensor:
        """The verify step's grammar-mask buffer, at least `rows` rows (grown, never shrunk: its
        rows are filled in order while a step's drafts are planned)."""
        from g906.engine.structured.mask import allocate

        buf = getattr(self, "_mask_buf", None)
        if buf is None or buf.shape[0] < rows:
            new = allocate(max(rows, (self.k + 1) * self.runner.max_num_seqs), int(self.runner.config.vocab_size))
            if buf is not None:
                new[: buf.shape[0]].copy_(buf)
            buf = self._mask_buf = new
        return buf

    def _forward(self, batch: ScheduledBatch, keep: bool):
        if batch.restores:                  # prefix-cache hits of the sequences it admits
            self.runner.copy_states(batch.restores)
        ids, pos, ctx = self.runner._context(batch)
        ctx.keep_linear_inputs = keep
        return self.model.forward(ids, pos, ctx)

    def _prefill(self, batch: ScheduledBatch) -> SpecResult:
        hidden = self._forward(batch, False)
        if batch.saves:                     # every position of a prefill step is committed
            self.runner.copy_states([(sv.seq.state_slot, sv.slot) for sv in batch.saves])
        sampling = [i for i in range(len(batch.seqs)) if batch.samples(i)]
        cu = np.cumsum([0] + batch.num_new_tokens)
        tokens: dict[int, list] = {}
        if sampling:
            last = torch.as_tensor([int(cu[i + 1]) - 1 for i in sampling], dtype=torch.long, device=hidden.device)
            logits = self.model.compute_logits(hidden.index_select(0, last))
            got, lps = self.runner.sampler.launch(logits, [sampler_row(batch.seqs[i]) for i in sampling],
                                                  mask=self.runner._masks(batch, sampling)).result()
            for i, t, lp in zip(sampling, got, lps):
                tokens[batch.seqs[i].seq_id] = [(t, lp)]
        self._done = _Done(hidden, list(batch.seqs), [int(c) for c in cu[:-1]],
                           [s.num_cached_tokens for s in batch.seqs], list(batch.num_new_tokens))
        return SpecResult({s.seq_id: n for s, n in zip(batch.seqs, batch.num_new_tokens)}, tokens)

    def _verify(self, batch: ScheduledBatch, drafts: dict[int, list[int]], masked: dict[int, list[bool]],
                mask_rows: int) -> SpecResult:
        seqs = batch.seqs
        graphs = self.graphs if self.graphs is not None and self.graphs.can_run(seqs) else None
        if graphs is not None:
            # padded static inputs, graph replay (verify_graphs.py)
            if batch.restores:
                self.runner.copy_states(batch.restores)
            logits, hidden, offsets = graphs.run(seqs, [drafts.get(s.seq_id, []) for s in seqs])
        else:
            chunks = [1 + len(drafts.get(s.seq_id, ())) for s in seqs]
            for s in seqs:                   # the drafts stand as the sequence's next tokens while
                s.token_ids.extend(drafts.get(s.seq_id, ()))     # the step's inputs are written
            try:
                hidden = self._forward(ScheduledBatch(True, seqs, chunks, restores=batch.restores), True)
            finally:
                for s, n in zip(seqs, chunks):
                    if n > 1:
                        del s.token_ids[1 - n:]
            logits = self.model.compute_logits(hidden)
            offsets = [int(c) for c in np.cumsum([0] + chunks)[:-1]]
        vrows, plain = [], []
        for i, s in enumerate(seqs):
            if s.seq_id in drafts:
                vrows.append((i, VerifyRow(sampler_row(s), offsets[i], drafts[s.seq_id], masked.get(s.seq_id))))
            else:
                plain.append(i)
        tokens: dict[int, list] = {}
        if vrows:
            bitmask = self._mask_buf[:mask_rows] if mask_rows else None
            for (i, v), toks in zip(vrows, verify(self.runner.sampler, logits, [v for _, v in vrows], bitmask)):
                tokens[seqs[i].seq_id] = [(t, None) for t in toks]
                self.metrics.add(len(v.drafts), len(toks) - 1)
        if plain:
            idx = torch.tensor([offsets[i] for i in plain], dtype=torch.long, device=logits.device)
            got, lps = self.runner.sampler.launch(logits.index_select(0, idx), [sampler_row(seqs[i]) for i in plain],
                                                  mask=self.runner._masks(batch, plain)).result()
            for i, t, lp in zip(plain, got, lps):
                tokens[seqs[i].seq_id] = [(t, lp)]
        advance = [len(tokens[s.seq_id]) for s in seqs]
        snaps, copies = self._snapshots(batch, advance)
        if graphs is not None:
            graphs.rollback(advance, snaps)
        else:
            self.model.rollback_linear_state(torch.tensor(advance, dtype=torch.int32, device=hidden.device),
                                             torch.tensor(snaps, dtype=torch.int32, device=hidden.device)
                                             if snaps else None)
        if copies:
            self.runner.copy_states(copies)
        self._done = _Done(hidden, list(seqs), offsets, [s.num_cached_tokens for s in seqs], advance)
        return SpecResult({s.seq_id: n for s, n in zip(seqs, advance)}, tokens)

    def _snapshots(self, batch: ScheduledBatch, advance: list[int]):
        """Where a verify step's state snapshots go (the scheduler planned them for a one-token
        step): at the last block boundary inside each sequence's accepted tokens. Returns the
        rollback's replays (i, n, slot) for boundaries before the last accepted token, and the
        copies (state slot, snapshot slot) for those at it (the rolled-back state is the one)."""
        if self.prefix is None:
            return [], []
        bs = self.blocks.block_size
        planned = {sv.seq.seq_id: sv for sv in batch.saves}
        saves, snaps, copies = [], [], []
        for i, (s, a) in enumerate(zip(batch.seqs, advance)):
            c = s.num_cached_tokens
            b = (c + a) // bs * bs
            sv = planned.pop(s.seq_id, None)
            if b <= c:
                if sv is not None:
                    self.prefix.cancel(sv)
                continue
            if sv is None:
                sv = self.prefix.plan_save(s, b, decode=True)
                if sv is None:
                    continue
            sv.position = b
            saves.append(sv)
            if b == c + a:
                copies.append((s.state_slot, sv.slot))
            else:
                snaps.append((i, b - c, sv.slot))
        for sv in planned.values():          # (sequences not in the step: none, but be exact)
            self.prefix.cancel(sv)
        batch.saves[:] = saves
        return snaps, copies

    # -- the MTP drafter ---------------------------------------------------------------------------
    def after_step(self) -> None:
        """After the engine took the step's tokens: the MTP block over the positions the target
        computed, then drafts for the sequences that decode next."""
        done, self._done = self._done, None
        if done is None or self.mtp is None:
            return
        live = [i for i, s in enumerate(done.seqs) if self.enabled(s) and not s.is_finished and s.block_table
                and s.num_cached_tokens == done.starts[i] + done.advance[i]]
        if not live:
            return
        dev = done.hidden.device
        rows, ids, pos, cu, seqs = [], [], [], [0], []
        for i in live:
            s, c, a = done.seqs[i], done.starts[i], done.advance[i]
            rows.extend(range(done.offsets[i], done.offsets[i] + a))
            ids.extend(s.token_ids[c + 1: c + a + 1])
            pos.extend(range(c, c + a))
            cu.append(cu[-1] + a)
            seqs.append(s)
        ctx = self._ctx(seqs, pos, cu, [done.starts[i] for i in live], prefill=True)
        pos_t = torch.tensor(pos, dtype=torch.long, device=dev)
        out = self.mtp(self.model.embed(torch.tensor(ids, dtype=torch.long, device=dev)),
                       done.hidden.index_select(0, torch.tensor(rows, dtype=torch.long, device=dev)), pos_t, ctx)
        # sequences that decode next draft from their last MTP row
        want = []
        for j, s in enumerate(seqs):
            if s.num_uncached_tokens == 1:
                n = self._budget(s, self.k)
                n = 1 + self._cover(s, n - 1, -1) if n > 1 else n
                if n > 0:
                    want.append((j, n))
        if not want:
            return
        for j, _ in want:
            self.draft_masks.pop(seqs[j].seq_id, None)
        last = torch.tensor([cu[j + 1] - 1 for j, _ in want], dtype=torch.long, device=dev)
        h = out.index_select(0, last)
        toks = self._draft_tokens(self.model.compute_logits(h), [seqs[j] for j, _ in want], {})
        drafts = {seqs[j].seq_id: [t] for (j, _), t in zip(want, toks.tolist())}
        for step in range(1, max(n for _, n in want)):
            sub = [r for r, (_, n) in enumerate(want) if n > step]
            if not sub:
                break
            ss = [seqs[want[r][0]] for r in sub]
            p = [s.num_tokens - 1 + step - 1 for s in ss]
            sel = torch.tensor(sub, dtype=torch.long, device=dev)
            ctx = self._ctx(ss, p, list(range(len(ss) + 1)), p, prefill=False)
            h = self.mtp(self.model.embed(toks.index_select(0, sel)), h.index_select(0, sel),
                         torch.tensor(p, dtype=torch.long, device=dev), ctx, step)
            toks = self._draft_tokens(self.model.compute_logits(h), ss, drafts)
            for s, t in zip(ss, toks.tolist()):
                drafts[s.seq_id].append(t)
            want = [want[r] for r in sub]
        self.drafts.update(drafts)

    def _draft_tokens(self, logits: torch.Tensor, seqs: list[Sequence], drafts: dict[int, list[int]]) -> torch.Tensor:
        """The drafter's argmax per row; a constrained sequence's within its grammar's mask after
        its drafts so far, and with a stop token inside its thinking closing the thinking instead
        (g906/engine/constrained_thinking.py), so that its drafts are ones the target may accept."""
        from g906.engine.structured.mask import apply

        if any(s.params.answer_after_thinking for s in seqs):
            rows = [SamplerRow(key=s.seq_id, params=s.params, output_token_ids=s.output_token_ids
                               + drafts.get(s.seq_id, []) if s.params.answer_after_thinking else None)
                    for s in seqs]
            closing = Closing(rows, self.runner.sampler.eos_token_ids, logits.shape[1], logits.device, argmax=True)
            logits = closing.greedy_logits(apply_continuation(logits, rows))

        guided, r = [], 0
        for i, s in enumerate(seqs):
            if s.guide is None:
                continue
            d = drafts.get(s.seq_id, [])
            p = s.params
            allow = not p.ignore_eos and s.num_output_tokens + len(d) + 1 >= p.min_tokens
            if s.guide.mask_after(d, self._bitmask(r + 1), r, allow_eos=allow):
                guided.append(i)
                self.draft_masks.setdefault(s.seq_id, []).append(self._mask_buf[r].clone())
                r += 1
            else:
                self.draft_masks.setdefault(s.seq_id, []).append(None)
        if guided:
            logits = apply(logits, guided, self._mask_buf[:r])
        return logits.argmax(dim=-1)

    def _ctx(self, seqs: list[Sequence], pos: list[int], cu: list[int], starts: list[int], *,
             prefill: bool) -> ForwardContext:
        """The MTP block's step: positions `pos` (flat), sequence i's from starts[i]."""
        dev = self.runner.device
        bs = self.blocks.block_size
        width = max(len(s.block_table) for s in seqs)
        tables = np.full((len(seqs), width), -1, dtype=np.int32)
        slots = []
        for i, s in enumerate(seqs):
            tables[i, : len(s.block_table)] = s.block_table
            slots.extend(s.block_table[p // bs] * bs + p % bs for p in pos[cu[i]:cu[i + 1]])
        lens = [starts[i] + cu[i + 1] - cu[i] for i in range(len(seqs))]
        i32 = dict(dtype=torch.int32, device=dev)
        return ForwardContext(
            is_prefill=prefill, cu_seqlens_q=torch.tensor(cu, **i32), seq_lens=torch.tensor(lens, **i32),
            context_lens=torch.tensor(starts, **i32), slot_mapping=torch.tensor(slots, dtype=torch.long, device=dev),
            block_tables=torch.from_numpy(tables).to(dev), state_slots=torch.zeros(len(seqs), **i32),
            has_initial_state=torch.ones(len(seqs), dtype=torch.bool, device=dev),
            max_seqlen_q=max(cu[i + 1] - cu[i] for i in range(len(seqs))), max_seqlen_k=max(lens),
        )


def build_mtp(model, dtype, device):
    """The MTP block of `model` (a Qwen35ForCausalLM or a TPModel) from its kept weights."""
    from g906.engine.spec.mtp import MTPBlock

    inner = getattr(model, "inner", model)        # tensor parallel: rank 0 keeps the block whole
    config = getattr(model, "global_config", None) or model.config
    if config.num_mtp_layers < 1:
        raise mtp_missing_error()
    weights = getattr(inner, "mtp_weights", None)
    if not weights:
        raise G906Error("speculative decoding with method \"mtp\": the model was loaded without its MTP "
                        "weights", hint="load it with keep_mtp=True (LLM does when speculative_config asks for mtp)")
    mtp = MTPBlock(config, dtype=dtype, device=device, max_positions=int(getattr(inner, "max_positions", 0)
                                                                          or config.max_position_embeddings))
    mtp.load(weights)
    return mtp
