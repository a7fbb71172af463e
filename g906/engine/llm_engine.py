"""The engine: requests in, per-step deltas out. Single-threaded; the async front-end
(async_engine.py) and the offline API (llm.py) drive it.

    engine = LLMEngine(loaded_model, EngineConfig(...))
    engine.add_request("r1", prompt_token_ids, SamplingParams(max_tokens=32))
    while engine.has_unfinished_requests():
        for delta in engine.step(): ...
"""

from __future__ import annotations

import logging
import time
from dataclasses import dataclass, field
from typing import Any

from g906.engine.beam import BeamSearch
from g906.engine.block_manager import CacheManager
from g906.engine.constrained_thinking import with_end_tag
from g906.engine.detokenizer import IncrementalDecoder, make_detokenizer
from g906.engine.model_runner import DEFAULT_PREFILL_GRAPH_TOKENS, ModelRunner, PendingStep
from g906.engine.sampler import TokenLogprobs
from g906.engine.sampling_params import SamplingParams
from g906.engine.scheduler import ScheduledBatch, Scheduler, SchedulerConfig
from g906.engine.sequence import Sequence
from g906.engine.stop import StopStrings, token_stop
from g906.engine.kernel_errors import reported_as_g906_errors
from g906.engine.spec.config import merge_outputs, parse_speculative
from g906.errors import G906Error

log = logging.getLogger("g906.engine")

DEFAULT_MAX_NUM_BATCHED_TOKENS = 2048


class PromptTooLong(ValueError):
    """The prompt (or prompt + max_tokens) does not fit in max_model_len."""


@dataclass
class EngineConfig:
    max_num_seqs: int = 16
    max_num_batched_tokens: int | None = None
    max_model_len: int | None = None
    block_size: int = 16
    gpu_memory_utilization: float = 0.9
    cpu_kv_cache_gib: float = 1.0
    num_kv_blocks: int | None = None       # override the budget (tests, benchmarks)
    max_waiting_requests: int = 1024
    seed: int | None = None                # the shared generator of unseeded requests
    enforce_eager: bool = False            # no CUDA/HIP graphs (decode or prefill)
    # prefill steps of at most this many tokens replay CUDA/HIP graphs (0: all prefill eager;
    # off under enforce_eager; g906/engine/prefill_graphs.py; docs/bench.md has the gain)
    prefill_graph_tokens: int = DEFAULT_PREFILL_GRAPH_TOKENS
    # prefix caching (g906/engine/prefix_cache.py, docs/engine.md): cached KV blocks and
    # linear-attention state snapshots reused by requests that share a prefix
    enable_prefix_caching: bool = True
    prefix_state_stride: int = 512         # a snapshot every this many prefill tokens (0: none)
    prefix_snapshot_share: float = 0.1     # the part of the cache budget the snapshot pool takes
    num_prefix_snapshots: int | None = None   # the pool's size, instead of the share
    # speculative decoding (g906/engine/spec): a SpeculativeConfig or vLLM's dict
    # ({"method": "mtp" | "ngram", "num_speculative_tokens": k, ...}); None: off
    speculative: Any = None


@dataclass
class StepOutput:
    """What one step added to one request."""
    request_id: str
    new_token_ids: list[int]
    new_text: str
    new_logprobs: list[TokenLogprobs] = field(default_factory=list)
    new_token_texts: list[str] = field(default_factory=list)   # per token, for logprobs
    finished: bool = False
    finish_reason: str | None = None        # "stop" | "length" | "abort"
    stop_reason: str | int | None = None    # the stop string or stop token id
    num_prompt_tokens: int = 0
    num_output_tokens: int = 0
    num_cached_tokens: int = 0              # prompt tokens the prefix cache supplied
    # with the first token of a request that asked: None (the first prompt token), then the
    # TokenLogprobs of each later prompt token
    prompt_logprobs: list | None = None
    cumulative_logprob: float | None = None  # a beam search output's (g906/engine/beam.py)
    # the request's timeline (time.monotonic() seconds; None where unknown): added, first scheduled,
    # first token sampled, this output's token sampled (per-request metrics, g906/server)
    arrival_at: float | None = None
    scheduled_at: float | None = None
    first_token_at: float | None = None
    token_at: float | None = None


class _Request:
    __slots__ = ("seq", "decoder", "stops", "arrival", "first_token_at", "eos_ids")

    def __init__(self, seq: Sequence, decoder: IncrementalDecoder, stops: StopStrings):
        self.seq = seq
        self.decoder = decoder
        self.stops = stops
        self.arrival = time.monotonic()
        self.first_token_at: float | None = None


_PENDING = -1      # a sampled token the host has not read yet (see LLMEngine.step)


@dataclass
class _Launched:
    """A step queued on the device. token_at: for a pipelined decode step, where each sequence's
    sampled token goes in its token_ids (its _PENDING place); None for a step run in sync."""
    batch: ScheduledBatch
    pending: PendingStep
    token_at: dict[int, int] | None


class LLMEngine:
    @reported_as_g906_errors
    def __init__(self, loaded, config: EngineConfig | None = None, *, vision=None):
        self.warm_up_decode_seconds: float | None = None    # set by warm_up(): one decode step's time
        self.loaded = loaded
        self.vision = vision  # VisionRuntime (g906/engine/vision) when the model takes images
        self.config = config = config or EngineConfig()
        self.model_config = loaded.config
        self.tokenizer = loaded.tokenizer
        self.speculative = spec = parse_speculative(config.speculative, self.model_config)
        use_prefix = config.enable_prefix_caching
        model_max = int(self.model_config.max_position_embeddings or 4096)
        explicit_len = config.max_model_len is not None
        self.max_model_len = int(config.max_model_len or model_max)
        if explicit_len and self.max_model_len > model_max:
            # the model's position tables end at model_max: a longer sequence would fail mid-step
            raise G906Error(f"max_model_len {self.max_model_len} exceeds the {model_max} positions the model was "
                            "loaded for", hint=f"load it with max_model_len={self.max_model_len} (the loader sizes "
                                               "its position tables to it)")
        if config.max_num_batched_tokens is not None and config.max_num_batched_tokens < config.max_num_seqs:
            # a decode step of every running sequence takes one token each
            raise G906Error(f"max_num_batched_tokens ({config.max_num_batched_tokens}) is below max_num_seqs "
                            f"({config.max_num_seqs}): a decode step of every running sequence needs one token each",
                            hint=f"set max_num_batched_tokens to at least {config.max_num_seqs}, or max_num_seqs "
                                 f"to at most {config.max_num_batched_tokens}")
        mbt = config.max_num_batched_tokens or max(DEFAULT_MAX_NUM_BATCHED_TOKENS, config.max_num_seqs)
        if not explicit_len:
            # default context: what the cache budget can hold for one sequence, at most the model's
            self.max_model_len = self._fit_len(mbt)
        self.max_num_batched_tokens = mbt
        self.eos_token_ids = frozenset(int(t) for t in (*(self.model_config.eos_token_ids or ()),
                                                        *(getattr(self.tokenizer, "eos_token_ids", None) or ())))
        self.runner = ModelRunner(
            loaded, block_size=config.block_size, max_num_seqs=config.max_num_seqs,
            max_num_batched_tokens=mbt, max_model_len=self.max_model_len,
            gpu_memory_utilization=config.gpu_memory_utilization, cpu_kv_cache_gib=config.cpu_kv_cache_gib,
            num_kv_blocks=config.num_kv_blocks, seed=config.seed, fit_len=not explicit_len,
            enforce_eager=config.enforce_eager, prefill_graph_tokens=config.prefill_graph_tokens,
            prefix_snapshot_share=config.prefix_snapshot_share if use_prefix else 0.0,
            num_prefix_snapshots=config.num_prefix_snapshots if use_prefix else 0,
            extra_kv_bytes_per_block=self._mtp_kv_bytes(spec),
            reserve_bytes=self._verify_graph_bytes(spec, mbt), eos_token_ids=self.eos_token_ids,
        )
        self.max_model_len = self.runner.max_model_len   # lowered to the cache when not explicit
        s = self.runner.sizing
        self.cache = CacheManager(s.num_blocks, config.block_size, config.max_num_seqs)
        self.prefix = None
        if use_prefix:
            from g906.engine.prefix_cache import PrefixCache

            self.prefix = PrefixCache(self.cache.blocks, self.runner.snapshot_slots,
                                      stride=_stride(config.prefix_state_stride, config.block_size),
                                      salt=_cache_salt(loaded))
        self.scheduler = Scheduler(
            SchedulerConfig(config.max_num_seqs, mbt, self.max_model_len), self.cache, self.prefix
        )
        self.spec = None
        if spec is not None:
            from g906.engine.spec.decoder import SpecDecoder

            self.spec = SpecDecoder(self.runner, self.cache.blocks, spec, max_model_len=self.max_model_len,
                                    max_num_batched_tokens=mbt, prefix=self.prefix)
        self._requests: dict[str, _Request] = {}
        self.beams = BeamSearch(self)                 # use_beam_search requests (g906/engine/beam.py)
        self.num_prompt_tokens = 0
        self.num_generation_tokens = 0
        self.num_steps = 0
        self._grammars = None                         # GrammarCompiler, on the first constrained request
        self._inflight: _Launched | None = None      # a pipelined decode step not yet read
        self.num_lookahead_steps = 0                  # decode steps queued before the last was read

    def _mtp_kv_bytes(self, spec) -> int:
        """KV bytes per block of the MTP drafter's cache (0 without one)."""
        if spec is None or spec.method != "mtp":
            return 0
        from g906.engine.model_runner import _dtype_of
        from g906.engine.spec.mtp import mtp_kv_bytes_per_block

        cfg = getattr(self.loaded.model, "global_config", None) or self.model_config
        itemsize = torch_itemsize(_dtype_of(self.loaded.model))
        return mtp_kv_bytes_per_block(cfg, self.config.block_size, itemsize)

    def _verify_graph_bytes(self, spec, mbt: int) -> int:
        """Device bytes the speculative verify graphs' pool keeps (0 without speculation or graphs)."""
        cfg = self.config
        dev = str(self.loaded.info.get("device", "cpu"))
        if spec is None or cfg.enforce_eager or not dev.startswith("cuda") \
                or not getattr(self.loaded.model, "supports_cuda_graphs", True):
            return 0
        from g906.engine.cache import state_bytes_per_slot
        from g906.engine.model_runner import _dtype_of
        from g906.engine.spec.verify_graphs import pool_bytes_estimate

        per_slot = state_bytes_per_slot(self.model_config, _dtype_of(self.loaded.model))
        return pool_bytes_estimate(self.model_config, k=spec.num_speculative_tokens, max_num_seqs=cfg.max_num_seqs,
                                   max_tokens=mbt, state_bytes_per_slot=per_slot)

    def _fit_len(self, mbt: int) -> int:
        """The model's context length, lowered to what a CPU KV budget can hold for one sequence."""
        from g906.engine.cache import kv_bytes_per_block, state_bytes_per_slot
        from g906.engine.model_runner import GiB, _dtype_of

        model_max = int(self.model_config.max_position_embeddings or 4096)
        cfg = self.config
        if cfg.num_kv_blocks is not None:
            return min(model_max, cfg.num_kv_blocks * cfg.block_size)
        dev = str(self.loaded.info.get("device", "cpu"))
        if not dev.startswith("cpu"):
            return model_max          # the runner lowers it to what the profiled budget holds
        dtype = _dtype_of(self.loaded.model)
        per_block = max(1, kv_bytes_per_block(self.model_config, cfg.block_size, dtype)
                        + self._mtp_kv_bytes(self.speculative))
        budget = cfg.cpu_kv_cache_gib * GiB - state_bytes_per_slot(self.model_config, dtype) * cfg.max_num_seqs
        blocks = int(budget // per_block)
        return max(min(model_max, blocks * cfg.block_size), 1)

    # -- requests --------------------------------------------------------------------------------
    def check_prompt(self, prompt_token_ids: list[int]) -> None:
        """Raise ValueError (PromptTooLong) if the prompt cannot run; no side effects."""
        n = len(prompt_token_ids)
        if n == 0:
            raise ValueError("the prompt is empty")
        if n >= self.max_model_len:
            raise PromptTooLong(
                f"the prompt has {n} tokens; this model's context (max_model_len) is {self.max_model_len} "
                "tokens, which must also leave room for at least one generated token"
            )
        vocab = self.model_config.vocab_size
        bad = next((t for t in prompt_token_ids if isinstance(t, bool) or not 0 <= int(t) < vocab), None)
        if bad is not None:
            raise ValueError(f"prompt token id {bad} is outside the vocabulary (0..{vocab - 1})")

    @property
    def grammars(self):
        """The structured-outputs compiler for this model's tokenizer (g906/engine/structured)."""
        if self._grammars is None:
            from g906.engine.structured.grammar import GrammarCompiler

            self._grammars = GrammarCompiler(self.tokenizer, self.model_config.vocab_size, self.eos_token_ids)
        return self._grammars

    def check_params(self, params: SamplingParams) -> None:
        """Raise StructuredOutputsError (a ValueError naming the problem) for a constraint this
        model cannot follow; no side effects beyond caching the compiled grammar."""
        if params.structured_outputs is not None:
            self.grammars.compile(params.structured_outputs)
        if params.use_beam_search:
            self.beams.check(params)

    def _guide(self, params: SamplingParams):
        from g906.engine.structured.guide import Guide

        spec = params.structured_outputs
        after = self.grammars.encode(spec.after) if spec.after else None
        return Guide(self.grammars.matcher(spec), after, sorted(self.eos_token_ids))

    def add_request(self, request_id: str, prompt_token_ids: list[int], params: SamplingParams, mm=None,
                    *, output_ids: list[str] | None = None) -> None:
        """mm: the prompt's images (MultimodalInputs from VisionRuntime.expand), encoded here once.
        With use_beam_search, the n outputs come back under output_ids (by default the request
        id when n is 1, else "<request id>:<index>")."""
        if request_id in self._requests or self.beams.owns(request_id):
            raise ValueError(f"request id {request_id!r} is already running")
        if params.use_beam_search:
            self.check_prompt(prompt_token_ids)
            self._encode_images(prompt_token_ids, mm)
            ids = output_ids or ([request_id] if params.n == 1 else [f"{request_id}:{i}" for i in range(params.n)])
            self.beams.add(request_id, prompt_token_ids, params, mm, ids)
            return
        if params.n != 1:
            raise ValueError("the engine runs n=1 requests; split n>1 into children with for_child()")
        self.check_prompt(prompt_token_ids)
        self._encode_images(prompt_token_ids, mm)
        if params.structured_outputs is not None:
            params = with_end_tag(params, self.grammars.encode)
        seq = Sequence(request_id, [int(t) for t in prompt_token_ids], params)
        seq.mm = mm
        if params.structured_outputs is not None:
            seq.guide = self._guide(params)
        req = _Request(seq, make_detokenizer(self.tokenizer, params.skip_special_tokens),
                       StopStrings(params.stop, params.include_stop_str_in_output))
        self._requests[request_id] = req
        self.scheduler.add(seq)

    def _encode_images(self, prompt_token_ids: list[int], mm) -> None:
        if mm is not None:
            if self.vision is None:
                raise ValueError("this model does not take images")
            if mm.prompt_len != len(prompt_token_ids):
                raise ValueError("the images' placeholders do not match the prompt (expand it with the vision runtime)")
            self.vision.encode(mm)

    def abort_request(self, request_id: str) -> bool:
        """Abort a request (or a beam search, by its id or any of its outputs' ids)."""
        if self.beams.abort(request_id):
            return True
        req = self._requests.pop(request_id, None)
        if req is None:
            return False
        self.scheduler.abort(req.seq)
        self.runner.sampler.forget(req.seq.seq_id)
        if self.spec is not None:
            self.spec.forget(req.seq.seq_id)
        return True

    def has_unfinished_requests(self) -> bool:
        return bool(self._requests or self.beams.groups)

    @property
    def num_requests(self) -> int:
        return len(self._requests) + len(self.beams.groups)

    # -- one step ----------------------------------------------------------------------------------
    @reported_as_g906_errors
    def step(self) -> list[StepOutput]:
        """Run one step and return its outputs.

        Decode steps on the graph path are pipelined: before the host waits for step N's tokens,
        step N+1 is already queued on the device, its input tokens read on the device from step
        N's sampler (the host holds a _PENDING token in their place until step N's result
        arrives). The host's work (reading tokens, stops, detokenizing, scheduling, preparing
        inputs) then overlaps the device's. A sequence that stops at step N has also run step
        N+1; that result is dropped (its cache is freed after it, in device order)."""
        cur = self._inflight
        if cur is not None and all(s.is_finished for s in cur.batch.seqs):
            cur.pending.result()                 # nothing left to read: the lookahead of a
            self._settle(cur.batch)              # step whose sequences all stopped
            cur = self._inflight = None
        if cur is None:
            batch = self.scheduler.schedule()
            if batch is None:
                return []
            self.num_steps += 1
            if self.spec is not None:
                done = self.spec.run(batch)
                if done is not None:
                    return self._finish_spec(batch, done)
            if not self._pipelinable(batch):
                return self._finish_step(_Launched(batch, self.runner.launch(batch), None))
            cur = self._launch(batch)
        self._inflight = self._lookahead(cur)
        return self._finish_step(cur)

    def _pipelinable(self, batch) -> bool:
        """A graph-path decode step whose sequences sample without their output history (no
        penalties, no thinking budget) and will not reach a length limit with this step's token. Not
        with speculative decoding: drafts are made on the host from the tokens of the step before."""
        if self.spec is not None or not self.runner.can_feed(batch):
            return False
        for s in batch.seqs:
            p = s.params
            if p.needs_history or s.guide is not None or s.beam is not None or s.num_tokens + 1 >= self.max_model_len:
                return False      # (a constrained step's mask needs the token before it)
            if p.max_tokens is not None and s.num_output_tokens + 1 >= p.max_tokens:
                return False
        return True

    def _launch(self, batch, feed=None) -> "_Launched":
        """Queue a decode step; each of its sequences holds a _PENDING token for the sampled one."""
        pending = self.runner.launch(batch, feed)
        token_at = {}
        for seq in batch.seqs:
            seq.num_cached_tokens += 1
            token_at[seq.seq_id] = seq.num_tokens
            seq.append_token(_PENDING)
        return _Launched(batch, pending, token_at)

    def _lookahead(self, cur: "_Launched") -> "_Launched | None":
        """Queue the next decode step before `cur`'s tokens are read, when no waiting request
        can be admitted now and every running sequence ran in `cur` (so the next step is their
        decode). A request that finishes in `cur` frees its place one step later."""
        if self.scheduler.can_admit() or not self._pipelinable(cur.batch):
            return None
        row = {s.seq_id: i for i, s in enumerate(cur.batch.seqs)}
        if any(s.seq_id not in row or not s.is_decode for s in self.scheduler.running):
            return None
        nxt = self.scheduler.schedule()
        if nxt is None:
            return None
        self.num_steps += 1
        self.num_lookahead_steps += 1
        return self._launch(nxt, (cur.pending, [row[s.seq_id] for s in nxt.seqs]))

    def _finish_step(self, launched: "_Launched") -> list[StepOutput]:
        """Wait for a launched step's tokens and turn them into outputs."""
        batch = launched.batch
        sampled = launched.pending.result()
        if batch.is_prefill:
            self.num_prompt_tokens += batch.num_tokens
        outputs: list[StepOutput] = []
        now = time.monotonic()
        for seq, n in zip(batch.seqs, batch.num_new_tokens):
            if launched.token_at is None:
                seq.num_cached_tokens += n
            got = sampled.get(seq.seq_id)
            if seq.beam is not None:          # its next token is the group's choice (g906/engine/beam.py)
                if got is not None and not seq.is_finished:
                    self.num_generation_tokens += 1
                    self.beams.record(seq, got[1])
                continue
            req = self._requests.get(seq.request_id)
            if got is None or seq.is_finished or req is None or req.seq is not seq:
                continue
            token, lp = got
            if launched.token_at is None:
                seq.append_token(token)
                upto = seq.num_tokens
            else:
                at = launched.token_at[seq.seq_id]
                seq.token_ids[at] = int(token)
                upto = at + 1
            if self.prefix is not None:
                self.prefix.register(seq)          # before _process may free its blocks
            if req.first_token_at is None:
                req.first_token_at = now
            self.num_generation_tokens += 1
            outputs.append(self._process(req, token, lp, upto))
        if self.beams.groups:
            outputs += [StepOutput(**o) for o in self.beams.advance_ready()]
        self._settle(batch)
        return outputs

    def _settle(self, batch: ScheduledBatch) -> None:
        """Register the step's computed blocks and commit its state snapshots (their tokens are
        known now)."""
        if self.prefix is None:
            return
        for seq in batch.seqs:
            if not seq.is_finished:
                self.prefix.register(seq)
        for save in batch.saves:
            self.prefix.commit(save)

    def _finish_spec(self, batch, done) -> list[StepOutput]:
        """The outputs of a speculative step (g906/engine/spec): several tokens per sequence."""
        if batch.is_prefill:
            self.num_prompt_tokens += batch.num_tokens
        outputs: list[StepOutput] = []
        now = time.monotonic()
        for seq in batch.seqs:
            seq.num_cached_tokens += done.advance[seq.seq_id]
            got = done.tokens.get(seq.seq_id)
            req = self._requests.get(seq.request_id)
            if not got or seq.is_finished or req is None or req.seq is not seq:
                continue
            if req.first_token_at is None:
                req.first_token_at = now
            merged = None
            for token, lp in got:
                seq.append_token(token)
                if self.prefix is not None:
                    self.prefix.register(seq)      # before _process may free its blocks
                self.num_generation_tokens += 1
                out = self._process(req, token, lp, seq.num_tokens)
                merged = out if merged is None else merge_outputs(merged, out)
                if out.finished:
                    break
            outputs.append(merged)
        self._settle(batch)
        self.spec.after_step()
        return outputs

    def _process(self, req: _Request, token: int, lp: TokenLogprobs | None, upto: int) -> StepOutput:
        """`token` is the sequence's token number `upto` (counting the prompt)."""
        seq, params = req.seq, req.seq.params
        num_out = upto - seq.num_prompt_tokens
        reason, stop_tok = token_stop(params, token, num_out, upto, self.eos_token_ids, self.max_model_len)
        guide = seq.guide
        if guide is not None:
            guide.accept(token)
            if reason is None and (guide.finished or guide.error):
                if guide.error:
                    log.warning("request %s: its output left the grammar (%s); stopped", seq.request_id, guide.error)
                reason = "stop"       # the grammar is complete: nothing may follow
        token_text = ""
        if reason == "stop" and stop_tok is not None and not params.include_stop_str_in_output:
            text = ""  # eos / stop token: its text is not part of the output
        else:
            token_text = req.decoder.add(token)
            text = req.stops.feed(token_text)
            if req.stops.matched is not None:
                reason, stop_tok = "stop", req.stops.matched
        if reason is not None:
            if req.stops.matched is None:
                text += req.stops.feed(req.decoder.finish())
                if req.stops.matched is not None:
                    reason, stop_tok = "stop", req.stops.matched
            text += req.stops.flush()
        out = StepOutput(
            request_id=seq.request_id, new_token_ids=[token], new_text=text,
            new_logprobs=[lp] if lp is not None else [],
            finished=reason is not None, finish_reason=reason, stop_reason=stop_tok,
            num_prompt_tokens=seq.num_prompt_tokens, num_output_tokens=num_out,
            num_cached_tokens=seq.num_hit_tokens,
            prompt_logprobs=[None, *seq.prompt_logprobs] if params.prompt_logprobs is not None and num_out == 1
            else None,
            arrival_at=req.arrival, scheduled_at=seq.scheduled_at, first_token_at=req.first_token_at,
            token_at=time.monotonic(),
        )
        if reason is not None:
            self.scheduler.finish(seq, reason)
            self.runner.sampler.forget(seq.seq_id)
            if self.spec is not None:
                self.spec.forget(seq.seq_id)
            self._requests.pop(seq.request_id, None)
        return out

    # -- introspection ---------------------------------------------------------------------------
    def stats(self) -> dict:
        blocks, slots = self.cache.blocks, self.cache.slots
        return {
            "num_requests_running": self.scheduler.num_running,
            "num_requests_waiting": self.scheduler.num_waiting,
            "kv_blocks_total": blocks.num_blocks,
            "kv_blocks_used": blocks.num_used_blocks,
            "kv_blocks_free": blocks.num_free_blocks,
            "state_slots_total": slots.num_slots,
            "state_slots_used": slots.num_used,
            "num_preemptions": self.scheduler.num_preemptions,
            "prompt_tokens": self.num_prompt_tokens,
            "generation_tokens": self.num_generation_tokens,
            "steps": self.num_steps,
            **(self.prefix.stats() if self.prefix is not None else {}),
            **(self.spec.metrics.to_json() if self.spec is not None else {}),
        }

    def describe(self) -> dict:
        return {
            "max_model_len": self.max_model_len,
            "max_num_seqs": self.config.max_num_seqs,
            "max_num_batched_tokens": self.max_num_batched_tokens,
            "block_size": self.config.block_size,
            "prefix_caching": self.prefix is not None,
            "cache": self.runner.sizing.to_json(),
            "speculative": self.speculative.to_vllm() if self.speculative is not None else None,
        }

    def token_bytes(self, token_id: int) -> bytes:
        """The bytes one token contributes to the text (for logprobs)."""
        tok = self.tokenizer
        if hasattr(tok, "token_bytes") and getattr(tok, "byte_level", False):
            if not tok.is_special(token_id):
                return tok.token_bytes(token_id)
        return tok.decode([int(token_id)], skip_special_tokens=False).encode("utf-8")

    def token_text(self, token_id: int) -> str:
        """One token's own text (for logprobs); bytes of a partial character show as U+FFFD."""
        return self.token_bytes(token_id).decode("utf-8", errors="replace")

    def warm_up(self) -> float:
        """Run the prefill, chunked-prefill and decode paths (and the sampler's) once. Seconds taken."""
        t0 = time.perf_counter()
        vocab = self.model_config.vocab_size
        plen = max(1, min(self.max_model_len - 4, self.max_num_batched_tokens + 3, 64))
        base = [(i * 7919) % vocab for i in range(plen)]
        plans = [
            (base, SamplingParams(temperature=0.0, max_tokens=3, ignore_eos=True)),
            (base[:5], SamplingParams(temperature=0.8, top_p=0.9, top_k=20, min_p=0.01, seed=0,
                                      repetition_penalty=1.1, presence_penalty=0.1, logprobs=2,
                                      max_tokens=3, ignore_eos=True)),
        ]
        from g906.engine.progress import Step

        for i, (ids, p) in enumerate(plans):
            self.add_request(f"__warmup-{i}", ids[: max(1, min(len(ids), self.max_model_len - 4))], p)
        with Step("Warming up (prefill, decode, sampler)", count_noun="engine steps") as step:
            while self.has_unfinished_requests():
                ts = time.perf_counter()
                self.step()
                # the last step decodes one token of each request: what a decode step costs here
                self.warm_up_decode_seconds = time.perf_counter() - ts
                step.advance(count=1)
        if self.cache.blocks.num_used_blocks or self.cache.slots.num_used:
            raise G906Error("internal error: the warm-up left cache blocks in use")
        if self.prefix is not None:
            self.prefix.forget()                 # the warm-up's prompts are nobody's prefix
        return time.perf_counter() - t0


def _stride(stride: int, block_size: int) -> int:
    """prefix_state_stride rounded up to a whole number of blocks (snapshots are block-aligned)."""
    stride = max(0, int(stride))
    return -(-stride // block_size) * block_size


def _cache_salt(loaded) -> str:
    """What the cached KV depends on besides the tokens: the model, its dtype and quantization."""
    info = loaded.info or {}
    keys = ("source", "format", "dtype", "quant", "quant_types", "tensor_parallel_size")
    return repr(sorted((k, str(info.get(k))) for k in keys))


def torch_itemsize(dtype) -> int:
    import torch

    return torch.empty((), dtype=dtype).element_size()
