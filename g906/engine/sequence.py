"""Sequence: one generation stream (a request with n=1) as the scheduler sees it.

Invariant: tokens [0, num_cached_tokens) are in the cache (KV blocks for the full-attention
layers, the state slot for the linear-attention layers). A step computes the next chunk
[num_cached_tokens, num_cached_tokens + chunk); when that reaches num_tokens, the model's
logits at the last position give the next token, which is appended (and is uncached until
the next step). Preemption by recompute simply resets num_cached_tokens to 0: the prompt and
the tokens generated so far are prefilled again."""

from __future__ import annotations

import itertools
from enum import Enum, auto

from g906.engine.sampling_params import SamplingParams


class SequenceStatus(Enum):
    WAITING = auto()
    RUNNING = auto()
    FINISHED = auto()


_ids = itertools.count()


class Sequence:
    __slots__ = (
        "seq_id", "request_id", "token_ids", "num_prompt_tokens", "params", "status",
        "num_cached_tokens", "block_table", "state_slot", "finish_reason", "arrival",
        "num_preemptions", "stop_reason", "mm", "guide", "prompt_logprobs",
        # prefix caching (g906/engine/prefix_cache.py): the content keys of the full blocks
        # known so far, how many of the table's blocks are registered, the key of the latest
        # decode-time state snapshot, the prompt tokens the cache supplied at admission, and
        # the position where its prompt leaves the cached blocks of an earlier one
        "block_keys", "num_registered_blocks", "tail_key", "num_hit_tokens", "prefix_branch",
        # the BeamGroup (g906/engine/beam.py) this sequence is a beam of, or None
        "beam",
        # when the scheduler first ran it (time.monotonic(); None while it waits): its queue time ends
        "scheduled_at",
    )

    def __init__(self, request_id: str, prompt_token_ids: list[int], params: SamplingParams, arrival: float = 0.0):
        if not prompt_token_ids:
            raise ValueError("the prompt is empty")
        self.seq_id = next(_ids)
        self.request_id = request_id
        self.token_ids: list[int] = list(prompt_token_ids)
        self.num_prompt_tokens = len(prompt_token_ids)
        self.params = params
        self.status = SequenceStatus.WAITING
        self.num_cached_tokens = 0
        self.block_table: list[int] = []
        self.state_slot: int | None = None
        self.finish_reason: str | None = None  # "stop" | "length" | "abort"
        self.stop_reason: str | int | None = None
        self.arrival = arrival
        self.num_preemptions = 0
        self.mm = None  # MultimodalInputs (g906/engine/vision) when the prompt has images
        self.guide = None  # its structured-outputs Guide (g906/engine/structured/guide.py), if constrained
        self.block_keys: list[bytes] = []
        self.num_registered_blocks = 0
        self.tail_key: bytes | None = None
        self.num_hit_tokens = 0
        self.prefix_branch = 0      # where its prompt leaves the cached blocks of another (0: none)
        self.beam = None
        self.scheduled_at: float | None = None
        self.prompt_logprobs: list = []  # TokenLogprobs of prompt tokens 1.. (g906/engine/prompt_logprobs.py)

    def __len__(self) -> int:
        return len(self.token_ids)

    def __repr__(self) -> str:
        return (
            f"Sequence({self.request_id!r}, tokens={len(self.token_ids)}, cached={self.num_cached_tokens}, "
            f"{self.status.name})"
        )

    @property
    def num_tokens(self) -> int:
        return len(self.token_ids)

    @property
    def num_output_tokens(self) -> int:
        return len(self.token_ids) - self.num_prompt_tokens

    @property
    def prompt_token_ids(self) -> list[int]:
        return self.token_ids[: self.num_prompt_tokens]

    @property
    def output_token_ids(self) -> list[int]:
        return self.token_ids[self.num_prompt_tokens:]

    @property
    def num_uncached_tokens(self) -> int:
        return len(self.token_ids) - self.num_cached_tokens

    @property
    def is_decode(self) -> bool:
        """One uncached token on top of a cached state: a decode step."""
        return self.num_cached_tokens > 0 and self.num_uncached_tokens == 1

    @property
    def is_finished(self) -> bool:
        return self.status is SequenceStatus.FINISHED

    def append_token(self, token_id: int) -> None:
        self.token_ids.append(int(token_id))
