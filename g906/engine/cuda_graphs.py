"""Decode graphs: one CUDA/HIP graph per decode batch size, replayed with padded batches.

    graphs = DecodeGraphs(model, cache, block_size=16, max_num_seqs=64, max_model_len=4096,
                          scratch_block=cache.num_blocks - 1, scratch_slot=cache.num_state_slots - 1)
    graphs.capture()                       # GPU only; skip it (or use_graphs=False) to run eagerly
    logits = graphs.run(seqs)              # [len(seqs), vocab] float32, for decode steps
    logits, greedy = graphs.run_step(seqs) # and each row's argmax (int64), computed in the graph

A decode step of n sequences runs at the smallest captured batch size bs >= n (1, 2, 4, 8, 16,
32, 64, 96, 128, ... up to max_num_seqs). Its inputs live in static device buffers (ids,
positions, KV slots, block tables of the full max_model_len width, sequence lengths, state
slots) filled from pinned host buffers by one non-blocking copy each; the model's forward, the
LM head (logits) and the logits' argmax (greedy sampling's tokens) are captured together. The
bs - n padding rows never touch real cache memory: their token writes go to a scratch KV block
and their linear-attention state updates to a scratch state slot, both allocated beyond what
the block manager hands out. Each row of every
op depends only on its own inputs, so padding changes nothing in the real rows.

The eager mode (use_graphs=False, or a batch larger than the largest graph) runs the same padded
step without a graph, so graph and eager decode compute bit-identical logits. Prefill always
runs eagerly through the model runner's own path.

Linear-attention state under replay: the state tensors are bound to the layers once and indexed
by the state-slot buffer inside the kernels, so each replay reads and updates the slots named in
that step's buffer (no copies into or out of the graph)."""

from __future__ import annotations

import logging
import time
from typing import Sequence as Seq

import torch

from g906.engine.context import ForwardContext

log = logging.getLogger("g906.engine")


def graph_batch_sizes(max_num_seqs: int) -> list[int]:
    """1, 2, 4, 8, 16, 32, 64, then every 32 up to max_num_seqs (max_num_seqs itself included)."""
    sizes = [b for b in (1, 2, 4, 8, 16, 32, 64) if b <= max_num_seqs]
    b = 96
    while b <= max_num_seqs:
        sizes.append(b)
        b += 32
    if not sizes or sizes[-1] != max_num_seqs:
        sizes.append(max_num_seqs)
    return sizes


def bucket(n: int, sizes: Seq[int]) -> int | None:
    """The smallest size >= n, or None when n is larger than all."""
    for s in sizes:
        if s >= n:
            return s
    return None


class DecodeGraphs:
    def __init__(self, model, cache, *, block_size: int, max_num_seqs: int, max_model_len: int,
                 scratch_block: int, scratch_slot: int, use_graphs: bool = True,
                 batch_sizes: Seq[int] | None = None):
        self.model = model
        self.cache = cache
        self.device = torch.device(cache.device)
        self.block_size = block_size
        self.max_num_seqs = max_num_seqs
        self.max_model_len = max_model_len
        self.scratch_block, self.scratch_slot = checked_scratch(cache, scratch_block, scratch_slot)
        self.batch_sizes = list(batch_sizes) if batch_sizes else graph_batch_sizes(max_num_seqs)
        self.max_batch = self.batch_sizes[-1]
        self.width = max(1, -(-max_model_len // block_size))      # block-table columns
        self.use_graphs = bool(use_graphs) and self.device.type == "cuda"
        self.graphs: dict[int, tuple[torch.cuda.CUDAGraph, torch.Tensor]] = {}
        self.capture_seconds = 0.0
        self.pdl = False                   # captured with programmatic dependent launch
        self.num_replays = 0
        self.num_eager = 0
        B, W = self.max_batch, self.width
        dev = self.device
        pin = dev.type == "cuda"
        # host staging (pinned on GPUs): one row per sequence
        self._h_long = torch.zeros(3, B, dtype=torch.long, pin_memory=pin)     # ids, positions, kv slots
        self._h_int = torch.zeros(2, B, dtype=torch.int32, pin_memory=pin)     # seq lens, state slots
        self._h_tables = torch.full((B, W), -1, dtype=torch.int32, pin_memory=pin)
        self._h_tab_c = torch.empty(B * W, dtype=torch.int32, pin_memory=pin)  # contiguous upload window
        self._row_cols = [W] * B               # columns of each host table row that may be >= 0
        # static device inputs
        self.d_long = torch.zeros(3, B, dtype=torch.long, device=dev)
        self.d_int = torch.zeros(2, B, dtype=torch.int32, device=dev)
        self.d_tables = torch.full((B, W), -1, dtype=torch.int32, device=dev)
        self.cu_seqlens = torch.arange(B + 1, dtype=torch.int32, device=dev)
        self.has_initial_state = torch.ones(B, dtype=torch.bool, device=dev)
        self._copied = torch.cuda.Event() if pin else None
        self._fill_padding(0)
        self._upload(B, W)

    # -- inputs ----------------------------------------------------------------------------------
    def _fill_padding(self, start: int) -> None:
        """Rows start.. of the host buffers: a one-token sequence in the scratch block and slot."""
        ids, pos, slots = self._h_long.numpy()
        lens, sslots = self._h_int.numpy()
        ids[start:] = 0
        pos[start:] = 0
        slots[start:] = self.scratch_block * self.block_size
        lens[start:] = 1
        sslots[start:] = self.scratch_slot
        tables = self._h_tables.numpy()
        for i in range(start, self.max_batch):
            if self._row_cols[i] > 1:
                tables[i, 1:self._row_cols[i]] = -1
            tables[i, 0] = self.scratch_block
            self._row_cols[i] = 1

    def prepare(self, seqs) -> int:
        """Fill the host buffers for a decode step of `seqs` (each with one uncached token) and
        start their copies to the device; returns the padded batch size (rows beyond len(seqs)
        are padding)."""
        n = len(seqs)
        bs = bucket(n, self.batch_sizes)
        if bs is None:
            raise ValueError(f"decode batch of {n} exceeds the largest graph batch {self.max_batch}")
        if self._copied is not None:
            self._copied.synchronize()         # the last step's copies have left the host buffers
        ids, pos, slots = self._h_long.numpy()
        lens, sslots = self._h_int.numpy()
        tables = self._h_tables.numpy()
        bsz = self.block_size
        cols = 1
        for i, s in enumerate(seqs):
            p = s.num_tokens - 1                       # the uncached token's position
            table = s.block_table
            ids[i] = s.token_ids[p]
            pos[i] = p
            slots[i] = table[p // bsz] * bsz + p % bsz
            lens[i] = p + 1
            sslots[i] = s.state_slot
            nb = len(table)
            if nb > self.width:
                raise ValueError(f"sequence {s.request_id} holds {nb} blocks, more than max_model_len allows")
            tables[i, :nb] = table
            if self._row_cols[i] > nb:
                tables[i, nb:self._row_cols[i]] = -1
            self._row_cols[i] = nb
            cols = max(cols, nb)
        self._fill_padding(n)
        self._upload(bs, cols)
        return bs

    def _upload(self, bs: int, cols: int) -> None:
        """Copy the step's inputs to the static device buffers: the id/position/slot and length
        rows whole (a few hundred bytes), the block tables as the [bs, cols] window that holds
        every used entry (device columns beyond a row's blocks are never read: the kernels stop
        at the sequence length)."""
        nb = self.device.type == "cuda"
        self.d_long.copy_(self._h_long, non_blocking=nb)
        self.d_int.copy_(self._h_int, non_blocking=nb)
        if cols >= self.width:
            self.d_tables[:bs].copy_(self._h_tables[:bs], non_blocking=nb)
        else:
            win = self._h_tab_c[: bs * cols].view(bs, cols)
            win.copy_(self._h_tables[:bs, :cols])
            self.d_tables[:bs, :cols].copy_(win, non_blocking=nb)
        if self._copied is not None:
            self._copied.record()

    def context(self, bs: int) -> ForwardContext:
        lens = self.d_int[0, :bs]
        return ForwardContext(
            is_prefill=False,
            cu_seqlens_q=self.cu_seqlens[: bs + 1],
            seq_lens=lens,
            context_lens=lens,             # not read by the decode layers
            slot_mapping=self.d_long[2, :bs],
            block_tables=self.d_tables[:bs],
            state_slots=self.d_int[1, :bs],
            has_initial_state=self.has_initial_state[:bs],
            max_seqlen_q=1,
            max_seqlen_k=self.max_model_len,
        )

    @torch.inference_mode()
    def _forward(self, bs: int) -> tuple[torch.Tensor, torch.Tensor]:
        from g906.kernels import ops

        ctx = self.context(bs)
        hidden = self.model.forward(self.d_long[0, :bs], self.d_long[1, :bs], ctx)
        logits = self.model.compute_logits(hidden)
        return logits, ops.argmax(logits)

    # -- graphs ----------------------------------------------------------------------------------
    def capture(self) -> float:
        """Capture one graph per batch size (largest first, sharing one memory pool); seconds.
        A failure (an op that cannot be captured, such as one that syncs with the host, or
        memory) leaves decode eager on the same padded path, with a warning, rather than failing
        the engine's start."""
        if not self.use_graphs:
            return 0.0
        self._fill_padding(0)
        self._upload(self.max_batch, self.width)
        t0, reserved, stream = capture_begin(self.device)
        from g906.kernels.pdl import graph_launches, pdl_args

        from g906.engine.progress import Step

        problem = None
        try:
            # graph_launches: the kernels may start while their predecessor ends (g906/kernels/pdl.py)
            with torch.cuda.stream(stream), graph_launches(), \
                    Step("Capturing decode graphs", total=len(self.batch_sizes), unit="graphs") as step:
                self.pdl = bool(pdl_args(self.device))
                pool = None
                for bs in reversed(self.batch_sizes):
                    self._forward(bs)              # compile / warm the kernels of this shape
                    stream.synchronize()
                    g = torch.cuda.CUDAGraph()
                    with torch.cuda.graph(g, pool=pool, stream=stream):
                        out = self._forward(bs)
                    pool = g.pool()
                    self.graphs[bs] = (g, out)
                    step.advance(1)
        except Exception as exc:
            problem = f"{type(exc).__name__}: {exc}"
            self.pdl = False
        capture_join(self.device, stream)
        capture_end(self, problem, "decode graphs off (eager decode instead): %s", t0, reserved, log)
        if self.use_graphs:
            log.info("captured %d decode graphs (batch sizes %s) in %.2f s", len(self.graphs),
                     self.batch_sizes, self.capture_seconds)
        return self.capture_seconds

    def run(self, seqs, input_ids: torch.Tensor | None = None) -> torch.Tensor:
        """Logits [len(seqs), vocab] (float32) of a decode step; updates the caches.
        input_ids (device, [len(seqs)]): the rows' input tokens, replacing the host's (an
        earlier step sampled them and the host has not read them yet)."""
        return self.run_step(seqs, input_ids)[0]

    def run_step(self, seqs, input_ids: torch.Tensor | None = None) -> tuple[torch.Tensor, torch.Tensor]:
        """run's logits and their rows' argmax (int64 [len(seqs)]), both views of the graph's
        outputs: valid until the next step is queued."""
        n = len(seqs)
        bs = self.prepare(seqs)
        if input_ids is not None:
            self.d_long[0, :n].copy_(input_ids)      # queued after the upload: overrides it
        entry = self.graphs.get(bs) if self.use_graphs else None
        if entry is not None:
            graph, (logits, greedy) = entry
            graph.replay()
            self.num_replays += 1
        else:
            logits, greedy = self._forward(bs)
            self.num_eager += 1
        return logits[:n], greedy[:n]

    def can_run(self, seqs) -> bool:
        """Whether this decode batch (a list of sequences, or its size) runs here: at most the
        largest graph batch, and text-only sequences (a sequence carrying multimodal inputs, whose
        M-RoPE positions the model runner computes per step, takes the runner's own path)."""
        if isinstance(seqs, int):
            return 0 < seqs <= self.max_batch
        return 0 < len(seqs) <= self.max_batch and not any(_multimodal(s) for s in seqs)

    def describe(self) -> dict:
        return {"graphs": self.use_graphs, "batch_sizes": self.batch_sizes if self.use_graphs else [],
                "captured": sorted(self.graphs), "capture_seconds": round(self.capture_seconds, 3),
                "replays": self.num_replays, "eager_steps": self.num_eager,
                "programmatic_dependent_launch": self.pdl}


def _multimodal(seq) -> bool:
    """Whether a sequence carries multimodal inputs (any attribute with M-RoPE positions)."""
    for name in getattr(type(seq), "__slots__", ()):
        v = getattr(seq, name, None)
        if v is not None and hasattr(v, "positions_for") and hasattr(v, "delta"):
            return True
    return False


def checked_scratch(cache, block: int, slot: int) -> tuple[int, int]:
    """(block, slot) as ints, after checking that the cache has them."""
    if not 0 <= int(block) < cache.num_blocks:
        raise ValueError(f"scratch block {block} is outside the cache's {cache.num_blocks} blocks")
    if not 0 <= int(slot) < cache.num_state_slots:
        raise ValueError(f"scratch slot {slot} is outside the cache's {cache.num_state_slots} slots")
    return int(block), int(slot)


def padded_cache_sizes(num_blocks: int, num_state_slots: int) -> tuple[int, int, int, int]:
    """(blocks to allocate, slots to allocate, scratch block id, scratch slot id): one more of
    each than the block manager hands out, the extra ones serving as the padding rows' scratch."""
    return num_blocks + 1, num_state_slots + 1, num_blocks, num_state_slots


def capture_begin(dev) -> tuple[float, int, "torch.cuda.Stream"]:
    """The start of a capture() of prefill or verify graphs: (start time, bytes reserved before,
    the side stream to capture on, ordered after the work already queued)."""
    t0 = time.perf_counter()
    torch.cuda.synchronize(dev)
    reserved = torch.cuda.memory_reserved(dev)
    stream = torch.cuda.Stream(dev)
    stream.wait_stream(torch.cuda.current_stream(dev))
    return t0, reserved, stream


def capture_join(dev, stream) -> None:
    """The device's stream waits for the capture stream, and the host for both."""
    torch.cuda.current_stream(dev).wait_stream(stream)
    torch.cuda.synchronize(dev)


def capture_end(graphs, problem: str | None, warning: str, t0: float, reserved: int, log) -> None:
    """After capture_join: the scratch slot the captures wrote is reset; on a problem the graphs
    are dropped (log.warning(warning, problem)) and the steps stay eager. Sets graphs.pool_bytes
    and graphs.capture_seconds."""
    graphs.cache.reset_slots([graphs.scratch_slot])
    if problem:
        log.warning(warning, problem)
        graphs.graphs.clear()
        graphs.use_graphs = False
        torch.cuda.empty_cache()
    graphs.pool_bytes = max(0, torch.cuda.memory_reserved(graphs.device) - reserved)
    graphs.capture_seconds = time.perf_counter() - t0


__all__ = ["DecodeGraphs", "bucket", "capture_begin", "capture_end", "capture_join", "checked_scratch",
           "graph_batch_sizes", "padded_cache_sizes"]
