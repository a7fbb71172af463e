"""Prefill graphs: short prefill steps replayed from CUDA/HIP graphs, one per padded shape.

    graphs = PrefillGraphs(model, cache, block_size=16, max_tokens=512, max_num_seqs=16,
                           max_model_len=4096, scratch_block=..., scratch_slot=...)
    graphs.capture()                            # GPU only; eager (use_graphs=False) elsewhere
    if graphs.can_run(batch):
        logits, greedy = graphs.run_step(batch.seqs, batch.num_new_tokens, sampling)

Why: an eager prefill step of a few hundred tokens is bound by the host, not the GPU: a 9B
step of 512 tokens launches about 430 kernels, whose Python and launch costs outlast the GPU's
work (docs/perf-log/ has the profile). A replayed graph launches them all at once.

A step of n sequences and `total` new tokens runs in the graph of the smallest captured
(tokens, rows) with rows > n and tokens >= total: token counts 16, 32, ..., max_tokens (powers
of two, and max_tokens), rows 2, 4, 8. Every step has padding rows after its n real ones; one
of them holds the tokens up to the graph's count, the others none, so a graph's kernels always
see the same batch shape. Padding tokens are token 0 at positions 0, 1, ...; their KV slots
are -1 (the KV stores skip them), their block tables name the scratch block (the attention
reads it, and it is never written by them), their state slot is the scratch slot with no
initial state. Every op of a
prefill step computes each sequence from its own rows and state, so padding changes nothing
in the real rows, and nothing the step leaves behind (KV blocks, states) belongs to them.

The inputs live in static device buffers, filled from pinned host buffers by one copy each;
the LM head runs on the last token of each sampling sequence (up to `rows` of them, index
buffer) and the argmax of its logits is taken in the graph too, as in the decode graphs.

Steps that do not fit (more tokens or sequences, or images: their M-RoPE positions and
embeddings are computed per step) take the model runner's own eager path. With use_graphs
False, run_step runs the same padded step without a graph (how the CPU tests drive this file;
the runner drops prefill graphs whose capture failed and runs its own eager prefill).

capture() checks its work: after capturing a shape it replays it on a second padding layout
and compares the logits with an eager run of that layout; a mismatch (a value the capture froze
that should follow the inputs) turns prefill graphs off with a warning, and eager prefill
carries on."""

from __future__ import annotations

import logging

import numpy as np
import torch

from g906.engine.context import ForwardContext, write_step_rows
from g906.engine.cuda_graphs import _multimodal, bucket, capture_begin, capture_end, capture_join, checked_scratch

log = logging.getLogger("g906.engine")

ROW_SIZES = (2, 4, 8)
MIN_TOKENS = 16


def graph_token_sizes(max_tokens: int) -> list[int]:
    """16, 32, 64, ... up to max_tokens, and max_tokens itself (empty when it is below 16)."""
    sizes = []
    t = MIN_TOKENS
    while t <= max_tokens:
        sizes.append(t)
        t *= 2
    if sizes and sizes[-1] != max_tokens:
        sizes.append(max_tokens)
    return sizes


def graph_row_sizes(max_num_seqs: int) -> list[int]:
    """Rows per graph (real sequences and padding): 2, 4, 8, at most max_num_seqs + 1."""
    top = min(ROW_SIZES[-1], max_num_seqs + 1)
    return [r for r in ROW_SIZES if r < top] + [top]


class PrefillGraphs:
    def __init__(self, model, cache, *, block_size: int, max_tokens: int, max_num_seqs: int,
                 max_model_len: int, scratch_block: int, scratch_slot: int, use_graphs: bool = True):
        self.model = model
        self.cache = cache
        self.device = torch.device(cache.device)
        self.block_size = block_size
        self.max_model_len = max_model_len
        self.scratch_block, self.scratch_slot = checked_scratch(cache, scratch_block, scratch_slot)
        self.token_sizes = graph_token_sizes(max_tokens)
        if not self.token_sizes:
            raise ValueError(f"prefill graphs need at least {MIN_TOKENS} tokens, not {max_tokens}")
        self.row_sizes = graph_row_sizes(max_num_seqs)
        self.use_graphs = bool(use_graphs) and self.device.type == "cuda"
        self.graphs: dict[tuple[int, int], tuple[torch.cuda.CUDAGraph, tuple[torch.Tensor, torch.Tensor]]] = {}
        self.capture_seconds = 0.0
        self.pool_bytes = 0
        self.num_replays = 0
        self.num_eager = 0
        T, R = self.token_sizes[-1], self.row_sizes[-1]
        W = max(1, -(-max(max_model_len, T) // block_size))              # block-table columns
        dev = self.device
        pin = dev.type == "cuda"
        # host staging (pinned on GPUs) and the static device inputs
        self._h_tok = torch.zeros(3, T, dtype=torch.long, pin_memory=pin)     # ids, positions, kv slots
        self._h_row = torch.zeros(5, R, dtype=torch.int32, pin_memory=pin)    # lens, cached, state slot, last, init
        self._h_cu = torch.zeros(R + 1, dtype=torch.int32, pin_memory=pin)
        self._h_tables = torch.full((R, W), -1, dtype=torch.int32, pin_memory=pin)
        self._h_tab_c = torch.empty(R * W, dtype=torch.int32, pin_memory=pin)  # contiguous upload window
        self.d_tok = torch.zeros(3, T, dtype=torch.long, device=dev)
        self.d_row = torch.zeros(5, R, dtype=torch.int32, device=dev)
        self.d_cu = torch.zeros(R + 1, dtype=torch.int32, device=dev)
        self.d_tables = torch.full((R, W), -1, dtype=torch.int32, device=dev)
        self.d_init = torch.zeros(R, dtype=torch.bool, device=dev)
        self._copied = torch.cuda.Event() if pin else None
        self._cols = W                        # host table columns that may hold entries >= 0

    # -- shapes ----------------------------------------------------------------------------------
    def shape_for(self, num_seqs: int, num_tokens: int) -> tuple[int, int] | None:
        """(tokens, rows) of the graph a step of this size runs in; None when none fits."""
        rows = bucket(num_seqs + 1, self.row_sizes)
        if rows is None:
            return None
        tokens = bucket(max(num_tokens, 1), self.token_sizes)
        return None if tokens is None else (tokens, rows)

    def can_run(self, batch) -> bool:
        """Whether this prefill step runs here: it fits a graph shape and holds no images."""
        return (batch.is_prefill and bool(batch.seqs)
                and self.shape_for(len(batch.seqs), batch.num_tokens) is not None
                and not any(_multimodal(s) for s in batch.seqs))

    # -- inputs ----------------------------------------------------------------------------------
    def prepare(self, seqs, chunks, sampling, *, shape: tuple[int, int] | None = None,
                spare_first: bool = False) -> tuple[int, int]:
        """Fill the host buffers for a prefill step and start their copies to the device.
        Sequence i adds chunks[i] tokens; `sampling`: the rows whose last token's logits are
        wanted, in order (rows past the sequences are padding). Returns the graph shape (tokens,
        rows), the smallest that fits unless `shape` is given. spare_first: the first padding row
        holds the spare tokens, not the last (capture's check uses both layouts)."""
        n, total = len(seqs), int(sum(chunks))
        if shape is None:
            shape = self.shape_for(n, total)
            if shape is None:
                raise ValueError(f"a prefill step of {n} sequences and {total} tokens fits no graph")
        T, R = shape
        if total > T or n >= R or len(sampling) > R:
            raise ValueError(f"a prefill step of {n} sequences and {total} tokens does not fit the "
                             f"{T}-token, {R}-row graph")
        if self._copied is not None:
            self._copied.synchronize()         # the last step's copies have left the host buffers
        ids, pos, slots = self._h_tok.numpy()
        lens, cached, sslots, last, init = self._h_row.numpy()
        cu = self._h_cu.numpy()
        tables = self._h_tables.numpy()
        tables[:, : self._cols] = -1
        cu[0] = 0
        off = write_step_rows(seqs, chunks, self.block_size, ids, pos, slots, cu, lens, cached, tables,
                              sslots, init)
        cols = max((len(s.block_table) for s in seqs), default=1)
        # padding rows n .. R-1: one of them holds the spare tokens, the others none
        lengths = [0] * (R - n)
        lengths[0 if spare_first else -1] = T - off
        for r, L in enumerate(lengths, start=n):
            ids[off:off + L] = 0
            pos[off:off + L] = np.arange(L)
            slots[off:off + L] = -1
            nb = max(1, -(-L // self.block_size))
            tables[r, :nb] = self.scratch_block
            cols = max(cols, nb)
            off += L
            cu[r + 1] = off
            lens[r], cached[r], sslots[r], init[r] = L, 0, self.scratch_slot, 0
        last[:] = 0
        for j, i in enumerate(sampling):
            last[j] = max(cu[i + 1] - 1, 0)       # (an empty padding row: any valid index)
        self._cols = cols
        self._upload(R, cols)
        return shape

    def _upload(self, rows: int, cols: int) -> None:
        """The token and row buffers whole (a few KB), the block tables as the [rows, cols]
        window that holds every used entry (the kernels stop at each sequence's length)."""
        nb = self.device.type == "cuda"
        self.d_tok.copy_(self._h_tok, non_blocking=nb)
        self.d_row.copy_(self._h_row, non_blocking=nb)
        self.d_cu.copy_(self._h_cu, non_blocking=nb)
        win = self._h_tab_c[: rows * cols].view(rows, cols)
        win.copy_(self._h_tables[:rows, :cols])
        self.d_tables[:rows, :cols].copy_(win, non_blocking=nb)
        self.d_init.copy_(self.d_row[4] != 0)
        if self._copied is not None:
            self._copied.record()

    def context(self, tokens: int, rows: int) -> ForwardContext:
        return ForwardContext(
            is_prefill=True,
            cu_seqlens_q=self.d_cu[: rows + 1],
            seq_lens=self.d_row[0, :rows],
            context_lens=self.d_row[1, :rows],
            slot_mapping=self.d_tok[2, :tokens],
            block_tables=self.d_tables[:rows],
            state_slots=self.d_row[2, :rows],
            has_initial_state=self.d_init[:rows],
            max_seqlen_q=tokens,
            max_seqlen_k=self.max_model_len,
        )

    @torch.inference_mode()
    def _forward(self, tokens: int, rows: int) -> tuple[torch.Tensor, torch.Tensor]:
        from g906.kernels import ops

        ctx = self.context(tokens, rows)
        hidden = self.model.forward(self.d_tok[0, :tokens], self.d_tok[1, :tokens], ctx)
        logits = self.model.compute_logits(hidden.index_select(0, self.d_row[3, :rows]))
        return logits, ops.argmax(logits)

    def run_step(self, seqs, chunks, sampling) -> tuple[torch.Tensor, torch.Tensor]:
        """Logits [len(sampling), vocab] (float32) of the sampling rows' last tokens, and their
        argmax (int64); views of the graph's outputs, valid until the next step is queued.
        Writes the step's KV rows and linear-attention states like an eager prefill."""
        shape = self.prepare(seqs, chunks, sampling)
        entry = self.graphs.get(shape) if self.use_graphs else None
        if entry is not None:
            graph, (logits, greedy) = entry
            graph.replay()
            self.num_replays += 1
        else:
            logits, greedy = self._forward(*shape)
            self.num_eager += 1
        k = len(sampling)
        return logits[:k], greedy[:k]

    # -- graphs ----------------------------------------------------------------------------------
    def capture(self) -> float:
        """Capture one graph per shape (largest first, sharing one memory pool), each checked
        on a second layout; seconds. Any failure leaves prefill eager (with a warning)."""
        if not self.use_graphs:
            return 0.0
        dev = self.device
        t0, reserved, stream = capture_begin(dev)
        problem = None
        from g906.engine.progress import Step

        shapes = sorted(((t, r) for t in self.token_sizes for r in self.row_sizes), reverse=True)
        try:
            with torch.cuda.stream(stream), Step("Capturing prefill graphs", total=len(shapes), unit="graphs") as step:
                pool = None
                for shape in shapes:
                    step.advance(1)
                    rows = range(shape[1])
                    self.prepare([], [], rows, shape=shape)
                    self._forward(*shape)               # compile / warm the kernels of this shape
                    stream.synchronize()
                    g = torch.cuda.CUDAGraph()
                    with torch.cuda.graph(g, pool=pool, stream=stream):
                        out = self._forward(*shape)
                    pool = g.pool()
                    self.graphs[shape] = (g, out)
                    problem = self._check(shape, g, out)
                    if problem:
                        break
        except Exception as exc:            # e.g. an op that syncs with the host inside capture
            problem = f"{type(exc).__name__}: {exc}"
        capture_join(dev, stream)
        capture_end(self, problem, "prefill graphs off (eager prefill instead): %s", t0, reserved, log)
        if self.use_graphs:
            log.info("captured %d prefill graphs (tokens %s x rows %s, %.0f MiB) in %.2f s", len(self.graphs),
                     self.token_sizes, self.row_sizes, self.pool_bytes / 2**20, self.capture_seconds)
        return self.capture_seconds

    def _check(self, shape, graph, out) -> str | None:
        """A replay on another padding layout against an eager run of it; what differs, or None."""
        self.prepare([], [], range(shape[1]), shape=shape, spare_first=True)
        logits, greedy = self._forward(*shape)
        graph.replay()
        same = torch.equal(torch.nan_to_num(logits), torch.nan_to_num(out[0])) and torch.equal(greedy, out[1])
        return None if same else f"the {shape[0]}-token, {shape[1]}-row graph's logits differ from eager ones"

    def describe(self) -> dict:
        return {"graphs": self.use_graphs, "token_sizes": self.token_sizes if self.use_graphs else [],
                "row_sizes": self.row_sizes if self.use_graphs else [], "captured": sorted(self.graphs),
                "capture_seconds": round(self.capture_seconds, 3), "pool_bytes": self.pool_bytes,
                "replays": self.num_replays, "eager_steps": self.num_eager}


__all__ = ["PrefillGraphs", "graph_row_sizes", "graph_token_sizes"]
