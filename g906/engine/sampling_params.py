"""SamplingParams: how one request is decoded (plain data, checked on construction).

Field names and meanings follow the OpenAI / vLLM vocabulary so that the server can map a
request body onto them one to one. A bad value raises ValueError naming the field."""

from __future__ import annotations

import math
from dataclasses import dataclass, field, replace

from g906.engine.structured.params import StructuredOutputsParams

_GREEDY_EPS = 1e-5
MAX_LOGPROBS = 20
MAX_BEAM_WIDTH = MAX_LOGPROBS // 2      # each beam's 2 * width best continuations are logprobs


@dataclass
class SamplingParams:
    n: int = 1
    temperature: float = 1.0
    top_p: float = 1.0
    top_k: int = 0                     # 0 or -1: disabled
    min_p: float = 0.0
    seed: int | None = None
    presence_penalty: float = 0.0
    frequency_penalty: float = 0.0
    repetition_penalty: float = 1.0
    max_tokens: int | None = 16        # None: up to the context length
    min_tokens: int = 0
    stop: list[str] | str | None = None
    stop_token_ids: list[int] = field(default_factory=list)
    ignore_eos: bool = False
    include_stop_str_in_output: bool = False
    logprobs: int | None = None        # number of top logprobs per step (0: only the sampled token's; -1: all)
    skip_special_tokens: bool = True
    structured_outputs: StructuredOutputsParams | None = None   # constrained decoding (g906/engine/structured)
    prompt_logprobs: int | None = None   # top logprobs per prompt position (as logprobs; g906/engine/prompt_logprobs.py)
    logprob_token_ids: list[int] | None = None   # with logprobs: these ids' logprobs instead of the top k
    logit_bias: dict[int, float] | None = None   # token id -> added to its logit (g906/engine/logit_bias.py)
    # a cap on thinking tokens, then the end tag's ids are forced (g906/engine/thinking_budget.py);
    # the end tag's ids also close the thinking of a constrained request in place of a stop token
    # (g906/engine/constrained_thinking.py)
    thinking_token_budget: int | None = None
    think_start_ids: tuple[int, ...] = ()
    think_end_ids: tuple[int, ...] = ()
    think_open: bool = False             # the prompt left the thinking open
    # beam search (g906/engine/beam.py): n is the beam width and the number of sequences returned
    use_beam_search: bool = False
    length_penalty: float = 1.0          # a finished beam's score: cum_logprob / len ** length_penalty
    early_stopping: bool = False         # True: stop once n beams have finished

    def __post_init__(self) -> None:
        if self.stop is None:
            self.stop = []
        elif isinstance(self.stop, str):
            self.stop = [self.stop]
        else:
            self.stop = list(self.stop)
        self.stop_token_ids = list(self.stop_token_ids or [])
        if self.top_k == -1:
            self.top_k = 0
        self._check()

    def _check(self) -> None:
        def bad(name: str, msg: str) -> ValueError:
            err = ValueError(f"{name} {msg}")
            err.param = name  # type: ignore[attr-defined]
            return err

        if not isinstance(self.n, int) or self.n < 1:
            raise bad("n", f"must be at least 1, got {self.n}")
        if not 0.0 <= self.temperature:
            raise bad("temperature", f"must be non-negative, got {self.temperature}")
        if not 0.0 < self.top_p <= 1.0:
            raise bad("top_p", f"must be in (0, 1], got {self.top_p}")
        if not isinstance(self.top_k, int) or self.top_k < 0:
            raise bad("top_k", f"must be -1 (disabled), 0 (disabled) or positive, got {self.top_k}")
        if not 0.0 <= self.min_p <= 1.0:
            raise bad("min_p", f"must be in [0, 1], got {self.min_p}")
        if not -2.0 <= self.presence_penalty <= 2.0:
            raise bad("presence_penalty", f"must be in [-2, 2], got {self.presence_penalty}")
        if not -2.0 <= self.frequency_penalty <= 2.0:
            raise bad("frequency_penalty", f"must be in [-2, 2], got {self.frequency_penalty}")
        if not 0.0 < self.repetition_penalty <= 2.0:
            raise bad("repetition_penalty", f"must be in (0, 2], got {self.repetition_penalty}")
        if self.max_tokens is not None and self.max_tokens < 1:
            raise bad("max_tokens", f"must be at least 1, got {self.max_tokens}")
        if self.min_tokens < 0:
            raise bad("min_tokens", f"must be non-negative, got {self.min_tokens}")
        if self.max_tokens is not None and self.min_tokens > self.max_tokens:
            raise bad("min_tokens", f"({self.min_tokens}) must not exceed max_tokens ({self.max_tokens})")
        if self.logprobs is not None and not -1 <= self.logprobs <= MAX_LOGPROBS:
            raise bad("logprobs", f"must be -1 (the whole vocabulary) or in [0, {MAX_LOGPROBS}], got {self.logprobs}")
        if self.prompt_logprobs is not None and not -1 <= self.prompt_logprobs <= MAX_LOGPROBS:
            raise bad("prompt_logprobs", f"must be -1 (the whole vocabulary) or in [0, {MAX_LOGPROBS}], "
                                         f"got {self.prompt_logprobs}")
        if self.seed is not None and not -(2**63) <= self.seed < 2**64:
            raise bad("seed", "must fit in 64 bits")
        if self.thinking_token_budget is not None and self.thinking_token_budget < 0:
            raise bad("thinking_token_budget", f"must be non-negative, got {self.thinking_token_budget}")
        for name in ("think_start_ids", "think_end_ids"):
            ids = getattr(self, name)
            if not all(isinstance(t, int) and t >= 0 for t in ids):
                raise bad(name, f"entries must be non-negative token ids, got {list(ids)!r}")
            setattr(self, name, tuple(ids))
        for t in self.logprob_token_ids or ():
            if not isinstance(t, int) or t < 0:
                raise bad("logprob_token_ids", f"entries must be non-negative token ids, got {t!r}")
        for t, b in (self.logit_bias or {}).items():
            if not isinstance(t, int) or t < 0:
                raise bad("logit_bias", f"keys must be non-negative token ids, got {t!r}")
            if not -100.0 <= b <= 100.0:
                raise bad("logit_bias", f"values must be in [-100, 100], got {b} for token {t}")
        for s in self.stop:
            if not isinstance(s, str) or not s:
                raise bad("stop", "entries must be non-empty strings")
        for t in self.stop_token_ids:
            if not isinstance(t, int) or t < 0:
                raise bad("stop_token_ids", "entries must be non-negative token ids")
        if self.structured_outputs is not None and not isinstance(self.structured_outputs, StructuredOutputsParams):
            raise bad("structured_outputs", "must be a StructuredOutputsParams")
        if self.use_beam_search:
            self._check_beam(bad)

    def _check_beam(self, bad) -> None:
        """Beam search ranks continuations by the model's own log-probabilities: options that
        reshape or randomise the distribution have no meaning there and are refused by name
        (vLLM ignores them silently)."""
        if self.n > MAX_BEAM_WIDTH:
            raise bad("n", f"(the beam width) must be at most {MAX_BEAM_WIDTH} with beam search "
                           f"(each beam ranks its {2 * MAX_BEAM_WIDTH} best continuations), got {self.n}")
        if not self.greedy:
            raise bad("temperature", "must be 0 or unset with beam search (g906's beam search is deterministic), "
                                     f"got {self.temperature}")
        if (isinstance(self.length_penalty, bool) or not isinstance(self.length_penalty, (int, float))
                or not math.isfinite(self.length_penalty)):
            raise bad("length_penalty", f"must be a finite number, got {self.length_penalty!r}")
        refused = [
            ("top_p", self.top_p != 1.0), ("top_k", self.top_k != 0), ("min_p", self.min_p != 0.0),
            ("presence_penalty", self.presence_penalty != 0.0), ("frequency_penalty", self.frequency_penalty != 0.0),
            ("repetition_penalty", self.repetition_penalty != 1.0), ("seed", self.seed is not None),
            ("min_tokens", self.min_tokens != 0), ("logit_bias", bool(self.logit_bias)),
            ("structured_outputs", self.structured_outputs is not None),
            ("prompt_logprobs", self.prompt_logprobs is not None),
            ("logprob_token_ids", bool(self.logprob_token_ids)),
            ("thinking_token_budget", self.thinking_token_budget is not None),
        ]
        for name, used in refused:
            if used:
                raise bad(name, "is not available with beam search (use_beam_search)")

    @property
    def greedy(self) -> bool:
        return self.temperature < _GREEDY_EPS

    @property
    def has_penalties(self) -> bool:
        return (
            self.presence_penalty != 0.0 or self.frequency_penalty != 0.0 or self.repetition_penalty != 1.0
        )

    @property
    def answer_after_thinking(self) -> bool:
        """Whether a constraint waits for the end of the thinking (think_end_ids): until that tag,
        a stop token closes the thinking instead of ending the request."""
        so = self.structured_outputs
        return so is not None and so.after is not None and bool(self.think_end_ids)

    @property
    def needs_history(self) -> bool:
        """Whether sampling reads the request's output tokens (so a step waits for the last one)."""
        return self.has_penalties or self.thinking_token_budget is not None or self.answer_after_thinking

    def for_child(self, index: int) -> "SamplingParams":
        """The params of the index-th of n samples: n=1, and a distinct seed when seeded."""
        seed = None if self.seed is None else (self.seed + index) % 2**64
        return replace(self, n=1, seed=seed)
