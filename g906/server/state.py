"""What the app knows between requests: the served name, the settings it was started with, and the
engine once it is ready (until then /health and /v1/* answer 503)."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

from starlette.requests import Request

from g906.server.metrics import Metrics
from g906.server.responses_store import DEFAULT_MAX_STORED_RESPONSES, ResponsesStore

DEFAULT_MAX_BODY_BYTES = 32 * 1024 * 1024
DEFAULT_BODY_TIMEOUT_S = 60.0


@dataclass
class ServerState:
    served_model_name: str
    reasoning_parser: str = "none"       # a name in g906/server/parsers ("none", "auto" or registered)
    tool_parser: str = "auto"            # the same, for tool calls (used when a request offers tools)
    api_key: str | None = None
    max_body_bytes: int = DEFAULT_MAX_BODY_BYTES
    body_timeout_s: float = DEFAULT_BODY_TIMEOUT_S
    architecture: str | None = None      # the model's (g906/arch name): picks the parsers named "auto"
    default_max_tokens: int | None = None  # a chat request's max_tokens when it sets none (None: the context)
    force_include_usage: bool = False    # every stream chunk carries usage (vLLM's flag)
    per_request_metrics: bool = False    # answers carry a `metrics` object (vllm_metrics_fields.py)
    root_path: str | None = None         # a reverse proxy's path prefix (root_path.py)
    engine: Any = None                   # AsyncEngine, once ready
    prompts: Any = None                  # PromptBuilder
    status: str = "loading"              # loading | ok | failed
    detail: str | None = None
    engine_info: dict = field(default_factory=dict)
    _logged_ignored: set = field(default_factory=set)
    metrics: Metrics | None = None
    max_token_bytes: int | None = None   # the longest vocabulary entry (cpu_work.check_prompt_bytes)
    max_stored_responses: int = DEFAULT_MAX_STORED_RESPONSES   # the Responses API's store (LRU beyond it)
    responses: ResponsesStore | None = None

    def __post_init__(self) -> None:
        if self.metrics is None:
            self.metrics = Metrics(self)
        if self.responses is None:
            self.responses = ResponsesStore(self.max_stored_responses)

    def set_ready(self, engine, prompts, info: dict | None = None) -> None:
        engine.observer = self.metrics
        self.engine = engine
        self.prompts = prompts
        self.engine_info = info or {}
        self.max_token_bytes = longest_token_bytes(getattr(prompts, "tokenizer", None))
        self.status = "ok"

    def set_failed(self, detail: str) -> None:
        self.status = "failed"
        self.detail = detail

    @property
    def max_model_len(self) -> int | None:
        return self.engine.engine.max_model_len if self.engine is not None else None


def longest_token_bytes(tokenizer) -> int | None:
    """The UTF-8 length of the longest vocabulary entry (byte-level entries are counted as their
    mapped characters, which only overestimates it); None when the vocabulary cannot be read.
    A text of B bytes is at least B / (this x normalisation shrink) tokens long."""
    backend = getattr(tokenizer, "backend", tokenizer)
    get_vocab = getattr(backend, "get_vocab", None)
    if not callable(get_vocab):
        return None
    try:
        vocab = get_vocab()
    except Exception:  # noqa: BLE001 - a tokenizer without a readable vocabulary: no byte check
        return None
    return max((len(t.encode("utf-8", "surrogatepass")) for t in vocab), default=None) or None


def state_of(request: Request) -> ServerState:
    return request.app.state.g906
