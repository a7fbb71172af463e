"""Verify graphs: speculative verify steps replayed from CUDA/HIP graphs, one per padded batch size.

    graphs = VerifyGraphs(model, cache, k=3, block_size=16, max_num_seqs=64, max_model_len=4096,
                          max_tokens=2048, scratch_block=..., scratch_slot=...)
    graphs.capture()                                  # GPU only; eager (use_graphs=False) elsewhere
    if graphs.can_run(seqs):
        logits, hidden, offsets = graphs.run(seqs, drafts)   # the verify forward, all positions
        ...rejection sampling on the host...
        graphs.rollback(advance, snaps)               # linear-attention states to the last accepted token

Why: a verify step is a short step (k+1 positions per sequence) whose cost on a GPU is the host's:
the 9B model's forward launches several hundred kernels, and the linear-attention rollback after it
a few more per layer. Replayed from a graph they cost one launch each, as a plain decode step does
(g906/engine/cuda_graphs.py), and speculation keeps what its extra positions buy.

Layout. A step of n sequences runs in the graph of the smallest captured batch size bs >= n (the
decode graphs' sizes, up to the largest whose bs * (k+1) tokens fit max_num_batched_tokens). Every
graph has bs * (k+1) tokens in 2 * bs rows: sequence i's k+1 token slots start at i * (k+1); row 2i
holds its last token and its k_i <= k drafts, row 2i+1 (a filler row) the k - k_i slots left. Rows
of the bs - n padding sequences hold no token and k+1 filler tokens. So the kernels see the same
shape every step (no row is longer than k+1, whatever the drafts) while each real row is exactly
the eager verify step's chunk. Filler tokens are token 0 at positions 0, 1, ...: their KV slots
are -1 (the KV stores skip them), their block tables name the scratch block (read, never written
by them), their state slot is the scratch slot with no initial state, and the step keeps the
states before it of the sequences' rows only (ForwardContext.kept_rows): a kept state is large
(the 9B's 24 recurrent layers: 48 MiB a sequence) and lives in the graphs' pool for good. Each op computes a row from
its own tokens and state, so the real rows' logits, KV writes and states are the eager step's.

The forward, the LM head over all bs * (k+1) positions and its argmax are one graph. The rejection
sampling stays on the host, outside: how many tokens a row accepts decides what it emits, and the
sampled rows draw their randoms from per-request generators. The rollback is a second graph per
batch size, with static shapes too: every row gets its state from before the step back and replays
its tokens again up to its last accepted one (GatedDeltaNet.rollback_padded), the row boundaries
(cu_seqlens) moved on the host to where each row's accepted tokens end, the rest going to the
filler row after it. This replays whole rows the eager rollback leaves alone (those that accept
everything): the same kernels on the same inputs, so the same state, and at k+1 tokens per row
the recurrence is a small part of the step. Prefix-cache snapshots inside the accepted tokens
(rare: a block boundary crossed with the prefix cache on) are replayed eagerly before it: their
count varies.

With use_graphs False (the CPU, enforce_eager, a failed capture) run and rollback compute the same
padded step without a graph: how the CPU tests drive this file. capture() checks its work as the
prefill graphs do: each verify graph replayed on a second row layout must give the logits of an
eager run of it, else verify graphs are turned off with a warning."""

from __future__ import annotations

import logging
from typing import Sequence as Seq

import torch

from g906.engine.context import ForwardContext
from g906.engine.cuda_graphs import (_multimodal, bucket, capture_begin, capture_end, capture_join, checked_scratch,
                                     graph_batch_sizes)

log = logging.getLogger("g906.engine")


# the largest verify batch replayed from a graph: beyond it a verify step is bound by the device's
# work more than by its launches, and the graphs' pool would keep its sequences' kept states
# (GatedDeltaNet._keep) and logits of every position for good
MAX_GRAPH_BATCH = 16


def verify_batch_sizes(k: int, max_num_seqs: int, max_tokens: int, max_batch: int = MAX_GRAPH_BATCH) -> list[int]:
    """The decode graphs' batch sizes up to max_batch whose bs * (k+1) positions fit one step of
    max_tokens."""
    return [b for b in graph_batch_sizes(min(max_num_seqs, max_batch)) if b * (k + 1) <= max_tokens]


def pool_bytes_estimate(config, *, k: int, max_num_seqs: int, max_tokens: int, state_bytes_per_slot: int) -> int:
    """What the verify graphs' pool keeps, roughly, for the cache budget: the largest batch's kept
    states and its logits (float32, every position, and their processed copy in the sampler)."""
    sizes = verify_batch_sizes(k, max_num_seqs, max_tokens)
    if not sizes:
        return 0
    bs = sizes[-1]
    return bs * state_bytes_per_slot + 2 * bs * (k + 1) * int(config.vocab_size) * 4


class VerifyGraphs:
    def __init__(self, model, cache, *, k: int, block_size: int, max_num_seqs: int, max_model_len: int,
                 max_tokens: int, scratch_block: int, scratch_slot: int, use_graphs: bool = True,
                 batch_sizes: Seq[int] | None = None):
        self.model = model
        self.cache = cache
        self.device = torch.device(cache.device)
        self.k = int(k)
        self.width = self.k + 1                      # token slots per sequence
        self.block_size = block_size
        self.max_model_len = max_model_len
        self.scratch_block, self.scratch_slot = checked_scratch(cache, scratch_block, scratch_slot)
        self.batch_sizes = list(batch_sizes) if batch_sizes else verify_batch_sizes(self.k, max_num_seqs, max_tokens)
        if not self.batch_sizes:
            raise ValueError(f"no verify batch fits: {self.width} positions per sequence, {max_tokens} per step")
        self.max_batch = self.batch_sizes[-1]
        self.use_graphs = bool(use_graphs) and self.device.type == "cuda"
        # bs -> (verify graph, its outputs (logits, argmax, hidden), the layers' kept inputs, rollback graph)
        self.graphs: dict[int, tuple] = {}
        self.capture_seconds = 0.0
        self.pool_bytes = 0
        self.num_replays = 0
        self.num_eager = 0
        B = self.max_batch
        T, R = B * self.width, 2 * B
        self.cols = max(1, -(-max(max_model_len, self.width) // block_size))      # block-table columns
        dev = self.device
        pin = dev.type == "cuda"
        # host staging (pinned on GPUs) and the static device inputs
        self._h_tok = torch.zeros(3, T, dtype=torch.long, pin_memory=pin)     # ids, positions, kv slots
        self._h_row = torch.zeros(4, R, dtype=torch.int32, pin_memory=pin)    # lens, cached, state slot, init
        self._h_cu = torch.zeros(2, R + 1, dtype=torch.int32, pin_memory=pin)  # step rows, rollback rows
        self._h_tables = torch.full((R, self.cols), -1, dtype=torch.int32, pin_memory=pin)
        self.d_tok = torch.zeros(3, T, dtype=torch.long, device=dev)
        self.d_row = torch.zeros(4, R, dtype=torch.int32, device=dev)
        self.d_cu = torch.zeros(2, R + 1, dtype=torch.int32, device=dev)
        self.d_tables = torch.full((R, self.cols), -1, dtype=torch.int32, device=dev)
        self.d_init = torch.zeros(R, dtype=torch.bool, device=dev)
        self.d_kept_rows = torch.arange(0, R, 2, dtype=torch.long, device=dev)   # the sequences' rows
        self._h_tab_c = torch.empty(R * self.cols, dtype=torch.int32, pin_memory=pin)  # contiguous upload window
        self._copied = torch.cuda.Event() if pin else None
        self._bs = 0                          # the padded batch size of the step just run
        self._dirty = (R, self.cols)          # the host tables' window that may hold entries >= 0

    # -- inputs ----------------------------------------------------------------------------------
    def can_run(self, seqs) -> bool:
        """Whether this verify step runs here: at most the largest batch, decode rows (one
        uncached token each), block tables within max_model_len, no images (M-RoPE positions)."""
        return (0 < len(seqs) <= self.max_batch
                and all(s.num_tokens - s.num_cached_tokens == 1 and len(s.block_table) <= self.cols for s in seqs)
                and not any(_multimodal(s) for s in seqs))

    def _filler(self, r: int, off: int, n: int) -> None:
        """Row r: n filler tokens from token slot off (scratch block and slot, no KV writes)."""
        ids, pos, slots = self._h_tok.numpy()
        lens, cached, sslots, init = self._h_row.numpy()
        ids[off:off + n] = 0
        pos[off:off + n] = range(n)
        slots[off:off + n] = -1
        self._h_tables.numpy()[r, : max(1, -(-n // self.block_size))] = self.scratch_block
        lens[r], cached[r], sslots[r], init[r] = n, 0, self.scratch_slot, 0

    def prepare(self, seqs, drafts: list[list[int]]) -> int:
        """Fill the host buffers for a verify step (sequence i: its last token, then drafts[i])
        and start their copies to the device; returns the padded batch size."""
        n = len(seqs)
        bs = bucket(n, self.batch_sizes)
        if bs is None:
            raise ValueError(f"a verify batch of {n} exceeds the largest verify graph batch {self.max_batch}")
        if self._copied is not None:
            self._copied.synchronize()         # the last step's copies have left the host buffers
        W, bsz = self.width, self.block_size
        ids, pos, slots = self._h_tok.numpy()
        lens, cached, sslots, init = self._h_row.numpy()
        cu = self._h_cu.numpy()[0]
        tables = self._h_tables.numpy()
        tables[: self._dirty[0], : self._dirty[1]] = -1
        cu[0] = 0
        cols = 1
        for i in range(bs):
            off = i * W
            if i < n:
                s, d = seqs[i], drafts[i]
                if len(d) > self.k:
                    raise ValueError(f"{len(d)} drafts for sequence {s.request_id}, more than k = {self.k}")
                start, m = s.num_cached_tokens, 1 + len(d)
                table = s.block_table
                ids[off] = s.token_ids[start]
                ids[off + 1:off + m] = d
                for j in range(m):
                    p = start + j
                    pos[off + j] = p
                    slots[off + j] = table[p // bsz] * bsz + p % bsz
                tables[2 * i, : len(table)] = table
                cols = max(cols, len(table))
                lens[2 * i], cached[2 * i], sslots[2 * i], init[2 * i] = start + m, start, s.state_slot, start > 0
            else:
                m = 0
                self._filler(2 * i, off, 0)
            cu[2 * i + 1] = off + m
            self._filler(2 * i + 1, off + m, W - m)
            cu[2 * i + 2] = off + W
        cols = max(cols, -(-W // bsz))
        self._dirty = (2 * bs, cols)
        self._upload(0, 2 * bs, cols)
        return bs

    def _upload(self, which: int, rows: int, cols: int) -> None:
        """which 0: the step's inputs (tokens, rows, tables window [rows, cols], step offsets);
        1: the rollback's row offsets only."""
        nb = self.device.type == "cuda"
        if which == 0:
            self.d_tok.copy_(self._h_tok, non_blocking=nb)
            self.d_row.copy_(self._h_row, non_blocking=nb)
            self.d_cu[0].copy_(self._h_cu[0], non_blocking=nb)
            win = self._h_tab_c[: rows * cols].view(rows, cols)
            win.copy_(self._h_tables[:rows, :cols])
            self.d_tables[:rows, :cols].copy_(win, non_blocking=nb)
            self.d_init.copy_(self.d_row[3] != 0)
        else:
            self.d_cu[1].copy_(self._h_cu[1], non_blocking=nb)
        if self._copied is not None:
            self._copied.record()

    def context(self, bs: int) -> ForwardContext:
        R = 2 * bs
        return ForwardContext(
            is_prefill=True,
            cu_seqlens_q=self.d_cu[0, : R + 1],
            seq_lens=self.d_row[0, :R],
            context_lens=self.d_row[1, :R],
            slot_mapping=self.d_tok[2, : bs * self.width],
            block_tables=self.d_tables[:R],
            state_slots=self.d_row[2, :R],
            has_initial_state=self.d_init[:R],
            max_seqlen_q=self.width,
            max_seqlen_k=self.max_model_len,
            keep_linear_inputs=True,
            kept_rows=self.d_kept_rows[:bs],
        )

    @torch.inference_mode()
    def _forward(self, bs: int) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
        from g906.kernels import ops

        T = bs * self.width
        hidden = self.model.forward(self.d_tok[0, :T], self.d_tok[1, :T], self.context(bs))
        logits = self.model.compute_logits(hidden)
        return logits, ops.argmax(logits), hidden

    def _kept(self) -> list:
        return [(la, la._kept) for la in self.model.linear_attention_layers()]

    @torch.inference_mode()
    def _rollback(self, bs: int) -> None:
        R = 2 * bs
        self.model.rollback_linear_state_padded(self.d_cu[1, : R + 1], self.d_init[:R])

    # -- one step --------------------------------------------------------------------------------
    def run(self, seqs, drafts: list[list[int]]) -> tuple[torch.Tensor, torch.Tensor, list[int]]:
        """The verify forward: logits [bs * (k+1), vocab] (float32) of every token slot and the
        final hidden states, views of the graph's outputs valid until the next step; and each
        sequence's first row in them. Writes the KV of the real positions and the states after
        all of them (rollback() ends them at the accepted tokens)."""
        bs = self.prepare(seqs, drafts)
        entry = self.graphs.get(bs) if self.use_graphs else None
        if entry is not None:
            graph, (logits, _, hidden), kept, _ = entry
            graph.replay()
            for la, t in kept:               # the graph wrote the kept inputs where it captured them
                la._kept = t
            self.num_replays += 1
        else:
            logits, _, hidden = self._forward(bs)
            self.num_eager += 1
        self._bs = bs
        return logits, hidden, [i * self.width for i in range(len(seqs))]

    def rollback(self, advance: list[int], snaps: list[tuple[int, int, int]] | None = None) -> None:
        """After run(): sequence i keeps its first advance[i] tokens of the step. snaps (i, n, slot):
        the state after n tokens of sequence i written into slot first (prefix-cache snapshots)."""
        bs, W = self._bs, self.width
        if snaps:
            self.model.snapshot_linear_state([(2 * i, m, slot) for i, m, slot in snaps], [i for i, _, _ in snaps])
        if self._copied is not None:
            self._copied.synchronize()
        cu = self._h_cu.numpy()[1]
        cu[0] = 0
        for i in range(bs):
            keep = advance[i] if i < len(advance) else 0
            cu[2 * i + 1] = i * W + keep
            cu[2 * i + 2] = (i + 1) * W
        self._upload(1, 2 * bs, 1)
        entry = self.graphs.get(bs) if self.use_graphs else None
        if entry is not None:
            entry[3].replay()
            for la in self.model.linear_attention_layers():
                la._kept = None
        else:
            self._rollback(bs)

    # -- graphs ----------------------------------------------------------------------------------
    def capture(self) -> float:
        """Capture the verify and rollback graphs of every batch size (largest first, one memory
        pool); seconds. A failure (memory, an op that cannot be captured) leaves verify steps
        eager, with a warning."""
        if not self.use_graphs:
            return 0.0
        dev = self.device
        t0, reserved, stream = capture_begin(dev)
        problem = None
        from g906.engine.progress import Step

        # no programmatic dependent launch (g906/kernels/pdl.py), as in the prefill graphs: the
        # rollback writes a layer's states right before the kernels that read them
        try:
            with torch.cuda.stream(stream), \
                    Step("Capturing verify graphs", total=len(self.batch_sizes), unit="graphs") as step:
                pool = None
                for bs in reversed(self.batch_sizes):
                    self._prepare_padding(bs)
                    self._forward(bs)             # compile / warm the kernels of this shape
                    self._rollback(bs)
                    stream.synchronize()
                    g = torch.cuda.CUDAGraph()
                    with torch.cuda.graph(g, pool=pool, stream=stream):
                        out = self._forward(bs)
                    pool = g.pool()
                    kept = self._kept()
                    gr = torch.cuda.CUDAGraph()
                    with torch.cuda.graph(gr, pool=pool, stream=stream):
                        self._rollback(bs)
                    self.graphs[bs] = (g, out, kept, gr)
                    step.advance(1)
                    problem = self._check(bs, g, out)
                    if problem:
                        break
        except Exception as exc:            # out of memory, an op that syncs with the host...
            problem = f"{type(exc).__name__}: {exc}"
        capture_join(dev, stream)
        for la in self.model.linear_attention_layers():
            la._kept = None
        capture_end(self, problem, "verify graphs off (eager verify steps instead): %s", t0, reserved, log)
        if self.use_graphs:
            log.info("captured %d verify graphs (k = %d, batch sizes %s, %.0f MiB) in %.2f s", len(self.graphs),
                     self.k, self.batch_sizes, self.pool_bytes / 2**20, self.capture_seconds)
        return self.capture_seconds

    def _prepare_padding(self, bs: int, varied: bool = False) -> None:
        """A step of bs padding sequences only (what capture runs: nothing real is touched);
        varied: sequence i's first row holds i % (k+2) of its filler tokens, not none."""
        self._bs = bs
        if self._copied is not None:
            self._copied.synchronize()
        cu = self._h_cu.numpy()
        self._h_tables.numpy()[: self._dirty[0], : self._dirty[1]] = -1
        self._dirty = (2 * bs, max(1, -(-self.width // self.block_size)))
        cu[:, 0] = 0
        for i in range(bs):
            off = i * self.width
            m = i % (self.width + 1) if varied else 0
            self._filler(2 * i, off, m)
            self._filler(2 * i + 1, off + m, self.width - m)
            cu[:, 2 * i + 1] = off + m
            cu[:, 2 * i + 2] = off + self.width
        self._upload(0, 2 * bs, self.cols)
        self._upload(1, 2 * bs, 1)

    def _check(self, bs: int, graph, out) -> str | None:
        """A replay on another row layout against an eager run of it (a value the capture froze
        that should follow the inputs shows here); what differs, or None."""
        self._prepare_padding(bs, varied=True)
        logits, greedy, _ = self._forward(bs)
        graph.replay()
        for la in self.model.linear_attention_layers():
            la._kept = None
        same = torch.equal(torch.nan_to_num(logits), torch.nan_to_num(out[0])) and torch.equal(greedy, out[1])
        return None if same else f"the {bs}-sequence verify graph's logits differ from eager ones"

    def describe(self) -> dict:
        return {"graphs": self.use_graphs, "k": self.k, "batch_sizes": self.batch_sizes if self.use_graphs else [],
                "captured": sorted(self.graphs), "capture_seconds": round(self.capture_seconds, 3),
                "pool_bytes": self.pool_bytes, "replays": self.num_replays, "eager_steps": self.num_eager}


__all__ = ["MAX_GRAPH_BATCH", "VerifyGraphs", "pool_bytes_estimate", "verify_batch_sizes"]
