"""What the app knows between requests: the served name, the settings it was started with, and the
engine once it is ready (until then /health and /v1/* answer 503)."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

from starlette.requests import Request

from g906.server.metrics import Metrics

DEFAULT_MAX_BODY_BYTES = 32 * 1024 * 1024


@dataclass
class ServerState:
    served_model_name: str
    reasoning_parser: str = "none"       # a name in g906/server/parsers ("none", "auto" or registered)
    api_key: str | None = None
    max_body_bytes: int = DEFAULT_MAX_BODY_BYTES
    architecture: str | None = None      # the model's (g906/arch name): picks the parsers named "auto"
    default_max_tokens: int | None = None  # a chat request's max_tokens when it sets none (None: the context)
    engine: Any = None                   # AsyncEngine, once ready
    prompts: Any = None                  # PromptBuilder
    status: str = "loading"              # loading | ok | failed
    detail: str | None = None
    engine_info: dict = field(default_factory=dict)
    _logged_ignored: set = field(default_factory=set)
    metrics: Metrics | None = None

    def __post_init__(self) -> None:
        if self.metrics is None:
            self.metrics = Metrics(self)

    def set_ready(self, engine, prompts, info: dict | None = None) -> None:
        engine.observer = self.metrics
        self.engine = engine
        self.prompts = prompts
        self.engine_info = info or {}
        self.status = "ok"

    def set_failed(self, detail: str) -> None:
        self.status = "failed"
        self.detail = detail

    @property
    def max_model_len(self) -> int | None:
        return self.engine.engine.max_model_len if self.engine is not None else None


def state_of(request: Request) -> ServerState:
    return request.app.state.g906
