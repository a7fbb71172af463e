"""The model runner: turns a scheduled batch into model inputs, runs the model, samples.

It owns the cache tensors (sized here from the memory budget), binds them to the model,
keeps preallocated host buffers for the per-step inputs, and returns the sampled token of
every sequence that reached its last token in the step."""

from __future__ import annotations

import logging
import math
from dataclasses import dataclass

import numpy as np
import torch

from g906.engine.context import ForwardContext, write_step_rows
from g906.engine.prefill_graphs import MIN_TOKENS as MIN_PREFILL_GRAPH_TOKENS
from g906.engine.prompt_logprobs import collect as collect_prompt_logprobs
from g906.engine.prompt_logprobs import wants_prompt_logprobs
from g906.engine.sampler import Sampler, SamplerRow, TokenLogprobs
from g906.engine.scheduler import ScheduledBatch
from g906.engine.sequence import Sequence
from g906.engine.vision.inputs import step_inputs
from g906.errors import G906Error

log = logging.getLogger("g906.engine")
GiB = 1024**3
# EngineConfig.prefill_graph_tokens' default (why: there); the recipe's is g906/recipe/schema.py's
DEFAULT_PREFILL_GRAPH_TOKENS = 512


@dataclass
class CacheSizing:
    num_blocks: int
    block_size: int
    num_state_slots: int
    kv_bytes_per_block: int
    state_bytes_per_slot: int
    budget_bytes: int
    source: str                     # how the budget was found ("cpu budget", "gpu profile", "override")
    weights_bytes: int = 0
    activation_peak_bytes: int = 0
    num_snapshots: int = 0          # prefix-cache state snapshots (g906/engine/prefix_cache.py)

    @property
    def max_tokens(self) -> int:
        return self.num_blocks * self.block_size

    def to_json(self) -> dict:
        return dict(self.__dict__, max_tokens=self.max_tokens)


def _dtype_of(model) -> torch.dtype:
    for p in model.parameters():
        if p.is_floating_point():
            return p.dtype
    return torch.float32


def prefill_graph_size(asked: int, *, graphs: bool, max_num_batched_tokens: int) -> int:
    """The largest prefill step the runner replays from graphs (0: none). graphs: the runner
    captures graphs at all (a GPU, a model that supports them, not enforce_eager)."""
    asked = int(asked)
    if asked != 0 and asked < MIN_PREFILL_GRAPH_TOKENS:
        # a value no graph can have (the smallest holds 16 tokens) is a mistake; off elsewhere
        # (the CPU, enforce_eager, smaller steps) is expected of an on-by-default setting
        log.warning("prefill graphs off: prefill_graph_tokens must be 0 (off) or at least %d, not %d",
                    MIN_PREFILL_GRAPH_TOKENS, asked)
        return 0
    tokens = min(asked, max_num_batched_tokens) if graphs else 0
    return tokens if tokens >= MIN_PREFILL_GRAPH_TOKENS else 0


class ModelRunner:
    def __init__(self, loaded, *, block_size: int, max_num_seqs: int, max_num_batched_tokens: int,
                 max_model_len: int, gpu_memory_utilization: float = 0.9, cpu_kv_cache_gib: float = 1.0,
                 num_kv_blocks: int | None = None, seed: int | None = None, fit_len: bool = False,
                 enforce_eager: bool = False, prefill_graph_tokens: int = DEFAULT_PREFILL_GRAPH_TOKENS,
                 prefix_snapshot_share: float = 0.0, num_prefix_snapshots: int | None = None,
                 extra_kv_bytes_per_block: int = 0, reserve_bytes: int = 0, eos_token_ids=()):
        """prefix_snapshot_share: the part of the cache budget given to prefix-cache state
        snapshots (0 and num_prefix_snapshots None: no snapshot pool); num_prefix_snapshots
        sets their count instead. extra_kv_bytes_per_block: KV bytes a block also holds for the
        MTP block (speculative decoding). reserve_bytes: device memory kept out of the cache
        budget on a GPU for graphs captured beside the runner's (speculative verify graphs).
        eos_token_ids: the model's end ids, for the sampler."""
        self.loaded = loaded
        self.model = loaded.model
        self.config = loaded.config
        self.device = torch.device(loaded.info.get("device", "cpu"))
        self.dtype = _dtype_of(self.model)
        self.block_size = block_size
        self.max_num_seqs = max_num_seqs
        self.max_num_batched_tokens = max_num_batched_tokens
        self.max_model_len = max_model_len
        self.fit_len = fit_len          # lower max_model_len to the cache instead of failing
        # KV bytes per block of caches beside the model's own (the MTP drafter's), in the budget
        self.extra_kv_bytes_per_block = int(extra_kv_bytes_per_block)
        self.reserve_bytes = int(reserve_bytes)
        # GPU decode runs through g906/engine/cuda_graphs.py (graphs unless enforce_eager): one
        # more KV block and state slot than the block manager hands out, as the padding rows' scratch
        padded = self.device.type == "cuda" and getattr(self.model, "supports_cuda_graphs", True)
        # short prefill steps replayed from graphs (g906/engine/prefill_graphs.py); 0: none
        self.prefill_graph_tokens = prefill_graph_size(prefill_graph_tokens, graphs=padded and not enforce_eager,
                                                       max_num_batched_tokens=max_num_batched_tokens)
        self.sampler = Sampler(self.device, seed=seed, eos_token_ids=eos_token_ids)
        pin = self.device.type == "cuda"
        m = max_num_batched_tokens
        self._ids = torch.zeros(m, dtype=torch.long, pin_memory=pin)
        self._pos = torch.zeros(m, dtype=torch.long, pin_memory=pin)
        self._slots = torch.zeros(m, dtype=torch.long, pin_memory=pin)
        self.snapshot_share = float(prefix_snapshot_share)
        self.num_prefix_snapshots = num_prefix_snapshots
        self.sizing = self._size_cache(gpu_memory_utilization, cpu_kv_cache_gib, num_kv_blocks)
        from g906.engine.cache import ModelCache

        extra = 1 if padded else 0
        # state slots: one per running sequence, the graphs' scratch slot (kept free on the CPU
        # too, where tests bind a padded cache), then the prefix cache's snapshots
        first = max_num_seqs + 1
        self.snapshot_slots = list(range(first, first + self.sizing.num_snapshots))
        self.cache = ModelCache.allocate(
            self.config, num_blocks=self.sizing.num_blocks + extra, block_size=block_size,
            num_state_slots=first + self.sizing.num_snapshots if self.sizing.num_snapshots else max_num_seqs + extra,
            dtype=self.dtype, device=self.device,
        )
        self.model.bind_cache(self.cache)
        self.graphs = None
        self.prefill_graphs = None
        if padded:
            from g906.engine.cuda_graphs import DecodeGraphs

            self.graphs = DecodeGraphs(
                self.model, self.cache, block_size=block_size, max_num_seqs=max_num_seqs,
                max_model_len=self.max_model_len, scratch_block=self.sizing.num_blocks,
                scratch_slot=max_num_seqs, use_graphs=not enforce_eager,
            )
            self.graphs.capture()
            if self.prefill_graph_tokens:
                from g906.engine.prefill_graphs import PrefillGraphs

                self.prefill_graphs = PrefillGraphs(
                    self.model, self.cache, block_size=block_size, max_tokens=self.prefill_graph_tokens,
                    max_num_seqs=max_num_seqs, max_model_len=self.max_model_len,
                    scratch_block=self.sizing.num_blocks, scratch_slot=max_num_seqs,
                )
                self.prefill_graphs.capture()
                if not self.prefill_graphs.use_graphs:      # capture failed (it logged why)
                    self.prefill_graphs = None

    # -- cache sizing ----------------------------------------------------------------------------
    def _size_cache(self, util: float, cpu_gib: float, override: int | None) -> CacheSizing:
        from g906.engine.cache import kv_bytes_per_block, state_bytes_per_slot

        per_block = max(1, kv_bytes_per_block(self.config, self.block_size, self.dtype) + self.extra_kv_bytes_per_block)
        per_slot = state_bytes_per_slot(self.config, self.dtype)
        states = per_slot * self.max_num_seqs
        blocks_per_seq = math.ceil(self.max_model_len / self.block_size)
        useful = self.max_num_seqs * blocks_per_seq + 1   # more blocks than this can never be used
        if override is not None:
            snaps = self._snapshots(0, per_slot)
            return CacheSizing(override, self.block_size, self.max_num_seqs, per_block, per_slot,
                               override * per_block + states + snaps * per_slot, "override", num_snapshots=snaps)
        if self.device.type == "cuda":
            weights, act = self._profile()
            if self.prefill_graph_tokens:
                # the prefill graphs' pool keeps about one forward's activations of their
                # largest step for good (a quarter more for its logits and rounding)
                act += int(1.25 * act * min(1.0, self.prefill_graph_tokens / self.max_num_batched_tokens))
            free, total = torch.cuda.mem_get_info(self.device)
            others = max(0, (total - free) - torch.cuda.memory_reserved(self.device))
            budget = int(util * total) - weights - act - others - states - self.reserve_bytes
            source = "gpu profile"
        else:
            weights, act = 0, 0
            budget = int(cpu_gib * GiB) - states
            source = "cpu budget"
        snaps = self._snapshots(budget, per_slot)
        if self.num_prefix_snapshots is None and (budget - snaps * per_slot) // per_block < blocks_per_seq:
            # the share would leave less than one full-length sequence of KV: that comes first,
            # the snapshots get what is left beyond it (none at all: no prefix hits)
            spare = (budget - blocks_per_seq * per_block) // max(per_slot, 1)
            snaps = max(0, min(snaps, int(spare)))
            log.warning("the cache budget leaves room for %d prefix-cache state snapshots", snaps)
        budget -= snaps * per_slot
        num_blocks = min(budget // per_block, useful) if budget > 0 else 0
        if num_blocks < blocks_per_seq and self.fit_len and num_blocks * self.block_size >= 256:
            log.warning("the KV cache holds %d tokens: max_model_len lowered from %d to that",
                        num_blocks * self.block_size, self.max_model_len)
            self.max_model_len = int(num_blocks * self.block_size)
            blocks_per_seq = num_blocks
        if num_blocks < blocks_per_seq:
            need = (blocks_per_seq * per_block + states) / GiB
            where = "gpu_memory_utilization" if self.device.type == "cuda" else "engine.embedded.cpu_kv_cache_gib"
            raise G906Error(
                f"the KV cache budget ({max(budget, 0) / GiB:.3f} GiB after weights, activations and "
                f"{self.max_num_seqs} state slots) holds {num_blocks * self.block_size} tokens, fewer than "
                f"max_model_len = {self.max_model_len}",
                hint=f"lower limits.max_model_len or limits.max_num_seqs, or raise {where} "
                f"(one full-length sequence needs about {need:.3f} GiB)",
            )
        return CacheSizing(int(num_blocks), self.block_size, self.max_num_seqs, per_block, per_slot,
                           int(budget), source, weights, act, snaps)

    def _snapshots(self, budget: int, per_slot: int) -> int:
        """How many prefix-cache state snapshots the pool holds: num_prefix_snapshots, else the
        snapshot share of the budget (at least two per running sequence: a prompt end and a
        tail each)."""
        from g906.engine.cache import kv_bytes_per_block

        if self.num_prefix_snapshots is not None:
            return max(0, int(self.num_prefix_snapshots))
        if self.snapshot_share <= 0:
            return 0
        # the share of what the cache will hold: a budget larger than the KV cache can use (the
        # CPU's default) is not all given out
        share = self.snapshot_share
        useful = (self.max_num_seqs * math.ceil(self.max_model_len / self.block_size) + 1) * max(
            1, kv_bytes_per_block(self.config, self.block_size, self.dtype))
        budget = min(max(budget, 0), int(useful / (1 - share)))
        return max(2 * self.max_num_seqs, int(share * budget // max(per_slot, 1)))

    def _profile(self) -> tuple[int, int]:
        """(weights bytes, activation peak bytes) from one forward of max_num_batched_tokens."""
        from g906.engine.cache import ModelCache

        dev = self.device
        torch.cuda.synchronize(dev)
        torch.cuda.empty_cache()
        weights = torch.cuda.memory_allocated(dev)
        n = self.max_num_batched_tokens
        nb = math.ceil(n / self.block_size)
        tmp = ModelCache.allocate(self.config, num_blocks=nb, block_size=self.block_size, num_state_slots=1,
                                  dtype=self.dtype, device=dev)
        self.model.bind_cache(tmp)
        torch.cuda.reset_peak_memory_stats(dev)
        base = torch.cuda.memory_allocated(dev)
        ids = torch.zeros(n, dtype=torch.long, device=dev)
        pos = torch.arange(n, dtype=torch.long, device=dev)
        i32 = dict(dtype=torch.int32, device=dev)
        ctx = ForwardContext(
            is_prefill=True,
            cu_seqlens_q=torch.tensor([0, n], **i32), seq_lens=torch.tensor([n], **i32),
            context_lens=torch.tensor([0], **i32), slot_mapping=torch.arange(n, dtype=torch.long, device=dev),
            block_tables=torch.arange(nb, **i32)[None], state_slots=torch.tensor([0], **i32),
            has_initial_state=torch.tensor([False], device=dev), max_seqlen_q=n, max_seqlen_k=n,
        )
        hidden = self.model.forward(ids, pos, ctx)
        rows = min(self.max_num_seqs, n)
        self.model.compute_logits(hidden[-rows:])
        torch.cuda.synchronize(dev)
        act = torch.cuda.max_memory_allocated(dev) - base
        del hidden, tmp, ctx
        torch.cuda.empty_cache()
        return weights, int(act)

    # -- one step --------------------------------------------------------------------------------
    def _context(self, batch: ScheduledBatch) -> tuple[torch.Tensor, torch.Tensor, ForwardContext]:
        seqs, chunks = batch.seqs, batch.num_new_tokens
        bs = self.block_size
        total = sum(chunks)
        ids = self._ids.numpy()
        pos = self._pos.numpy()
        slots = self._slots.numpy()
        cu = np.zeros(len(seqs) + 1, dtype=np.int32)
        seq_lens = np.zeros(len(seqs), dtype=np.int32)
        ctx_lens = np.zeros(len(seqs), dtype=np.int32)
        width = max(len(s.block_table) for s in seqs)
        tables = np.full((len(seqs), width), -1, dtype=np.int32)
        state_slots = np.zeros(len(seqs), dtype=np.int32)
        has_init = np.zeros(len(seqs), dtype=np.bool_)
        write_step_rows(seqs, chunks, bs, ids, pos, slots, cu, seq_lens, ctx_lens, tables, state_slots, has_init)
        dev = self.device
        nb = dev.type == "cuda"
        # sequences with images: M-RoPE positions (pos rewritten in place) and the image tokens'
        # embeddings for this step (all None when the step holds no image token)
        mrope, mm_index, mm_embeds = step_inputs(seqs, chunks, pos, dev, self.dtype)

        def put(a, dtype):
            return torch.from_numpy(a).to(device=dev, dtype=dtype, non_blocking=nb)

        input_ids = self._ids[:total].to(dev, non_blocking=nb)
        positions = self._pos[:total].to(dev, non_blocking=nb)
        if dev.type == "cpu":  # the host buffers are reused next step: give the model its own
            input_ids, positions = input_ids.clone(), positions.clone()
        ctx = ForwardContext(
            is_prefill=batch.is_prefill,
            cu_seqlens_q=put(cu, torch.int32),
            seq_lens=put(seq_lens, torch.int32),
            context_lens=put(ctx_lens, torch.int32),
            slot_mapping=self._slots[:total].to(dev, non_blocking=nb).clone() if dev.type == "cpu"
            else self._slots[:total].to(dev, non_blocking=nb),
            block_tables=put(tables, torch.int32),
            state_slots=put(state_slots, torch.int32),
            has_initial_state=put(has_init, torch.bool),
            max_seqlen_q=int(max(chunks)),
            max_seqlen_k=int(seq_lens.max()),
            mrope_positions=mrope, mm_embed_index=mm_index, mm_embeds=mm_embeds,
        )
        return input_ids, positions, ctx

    def run(self, batch: ScheduledBatch) -> dict[int, tuple[int, TokenLogprobs | None]]:
        """Run one step; {seq_id: (next token, logprobs)} for the sequences that sample."""
        return self.launch(batch).result()

    def can_feed(self, batch: ScheduledBatch) -> bool:
        """Whether this step may take input tokens from an earlier step still on the device
        (launch(feed=...)): a decode step on the padded graph path."""
        return (not batch.is_prefill and bool(batch.seqs) and self.graphs is not None
                and self.graphs.can_run(batch.seqs))

    def launch(self, batch: ScheduledBatch, feed: "tuple[PendingStep, list[int]] | None" = None) -> "PendingStep":
        """Queue one step on the device (forward + sampling) and return without waiting for it.

        feed=(earlier, rows): the step's input token of sequence i is the token `earlier`
        sampled in its row rows[i], read on the device (the host does not know it yet)."""
        if batch.restores:
            self.copy_states(batch.restores)
        if not batch.seqs:
            return PendingStep([], None)
        step = self._launch(batch, feed)
        if batch.saves:       # the states this step ends with, copied in device order after it
            self.copy_states([(sv.seq.state_slot, sv.slot) for sv in batch.saves])
        return step

    def copy_states(self, pairs: list[tuple[int, int]]) -> None:
        """Copy linear-attention state slots (src, dst), on every tensor-parallel rank."""
        src, dst = [p[0] for p in pairs], [p[1] for p in pairs]
        mirror = getattr(self.model, "copy_states", None)
        if callable(mirror):
            mirror(src, dst)
        else:
            self.cache.copy_states(src, dst)

    def copy_blocks(self, pairs: list[tuple[int, int]]) -> None:
        """Copy KV blocks (src, dst), on every tensor-parallel rank (forked beams)."""
        src, dst = [p[0] for p in pairs], [p[1] for p in pairs]
        mirror = getattr(self.model, "copy_blocks", None)
        if callable(mirror):
            mirror(src, dst)
        else:
            self.cache.copy_blocks(src, dst)

    def _launch(self, batch: ScheduledBatch, feed) -> "PendingStep":
        greedy = None
        if self.can_feed(batch):
            # decode: padded static inputs, graph replay (g906/engine/cuda_graphs.py)
            ids = None
            if feed is not None:
                earlier, src_rows = feed
                ids = earlier.sample.ids
                if src_rows == list(range(len(src_rows))):
                    ids = ids[: len(src_rows)]
                else:
                    idx = torch.tensor(src_rows, dtype=torch.long)
                    if ids.device.type == "cuda":    # no pageable copy: it would wait for the device
                        idx = idx.pin_memory()
                    ids = ids.index_select(0, idx.to(ids.device, non_blocking=True))
            logits, greedy = self.graphs.run_step(batch.seqs, input_ids=ids)
            sampling = list(range(len(batch.seqs)))
        elif (feed is None and self.prefill_graphs is not None and self.prefill_graphs.can_run(batch)
              and not wants_prompt_logprobs(batch)):
            # a short prefill step: padded static inputs, graph replay (g906/engine/prefill_graphs.py)
            sampling = [i for i in range(len(batch.seqs)) if batch.samples(i)]
            logits, greedy = self.prefill_graphs.run_step(batch.seqs, batch.num_new_tokens, sampling)
            if not sampling:
                return PendingStep([], None)
        else:
            if feed is not None:
                raise ValueError("only graph-path decode steps take their input tokens from the device")
            input_ids, positions, ctx = self._context(batch)
            hidden = self.model.forward(input_ids, positions, ctx)
            if wants_prompt_logprobs(batch):
                collect_prompt_logprobs(batch, hidden, self.model.compute_logits)
            sampling = [i for i in range(len(batch.seqs)) if batch.samples(i)]
            if not sampling:
                return PendingStep([], None)
            cu = np.cumsum(batch.num_new_tokens)
            last = torch.as_tensor([int(cu[i]) - 1 for i in sampling], dtype=torch.long, device=hidden.device)
            logits = self.model.compute_logits(hidden.index_select(0, last))
        rows = [sampler_row(batch.seqs[i]) for i in sampling]
        return PendingStep([batch.seqs[i].seq_id for i in sampling],
                           self.sampler.launch(logits, rows, argmax=greedy, mask=self._masks(batch, sampling)))

    def _masks(self, batch: ScheduledBatch, sampling: list[int]):
        """The token masks of the constrained rows (structured outputs), computed on the CPU
        while the device runs the step's forward: (rows, bitmask), or None."""
        guided = [j for j, i in enumerate(sampling)
                  if batch.seqs[i].guide is not None and batch.seqs[i].guide.constrains]
        if not guided:
            return None
        from g906.engine.structured.mask import allocate

        buf = getattr(self, "_mask_buf", None)
        if buf is None or buf.shape[0] < len(guided):
            # pinned once and reused: the previous step's copy from it has finished, since a
            # constrained step waits for the tokens of the one before
            buf = self._mask_buf = allocate(max(len(guided), self.max_num_seqs), int(self.config.vocab_size))
        bitmask = buf[: len(guided)]
        for r, j in enumerate(guided):
            s = batch.seqs[sampling[j]]
            p = s.params
            s.guide.fill(bitmask, r, allow_eos=not p.ignore_eos and s.num_output_tokens + 1 >= p.min_tokens)
        return guided, bitmask


def sampler_row(s: Sequence) -> SamplerRow:
    """What the sampler needs of a sequence (its history only where penalties, the thinking
    budget or a constrained thinking's close read it)."""
    p = s.params
    return SamplerRow(
        key=s.seq_id, params=p,
        prompt_token_ids=s.prompt_token_ids if p.repetition_penalty != 1.0 else None,
        output_token_ids=s.output_token_ids if p.needs_history else None,
    )


class PendingStep:
    """A step queued on the device: result() waits for its sampled tokens."""

    def __init__(self, seq_ids: list[int], sample):
        self.seq_ids = seq_ids
        self.sample = sample

    def result(self) -> dict[int, tuple[int, TokenLogprobs | None]]:
        if self.sample is None:
            return {}
        token_ids, lps = self.sample.result()
        return {sid: (t, lp) for sid, t, lp in zip(self.seq_ids, token_ids, lps)}
