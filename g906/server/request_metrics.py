"""server.per_request_metrics (vLLM's --enable-per-request-metrics): a `metrics` object on each
non-streamed answer and on a stream's final usage chunk, from the engine's own timeline of the
request (StepOutput.arrival_at / scheduled_at / first_token_at / token_at, time.monotonic()):

    time_to_first_token_ms   first scheduled -> first token sampled (prefill; queue time excluded)
    queue_time_ms            added to the engine -> first scheduled
    generation_time_ms       first token -> last token (decode only)
    mean_itl_ms              generation_time_ms / (tokens - 1); absent with a single token
    tokens_per_second        tokens / (first scheduled -> last token): throughput including prefill

These are vLLM's definitions (so dashboards built for vLLM read the same figures). A field whose
timestamps are unknown is left out; a request of several choices (n > 1, several prompts) gets no
metrics, as in vLLM: one choice's timeline does not describe the request."""

from __future__ import annotations

from dataclasses import dataclass


@dataclass
class Timeline:
    arrival: float | None = None
    scheduled: float | None = None
    first_token: float | None = None
    last_token: float | None = None

    def record(self, out) -> None:
        """Take the times an engine output carries (outputs without them, e.g. beam search's, leave it)."""
        for name, attr in (("arrival", "arrival_at"), ("scheduled", "scheduled_at"), ("first_token", "first_token_at")):
            v = getattr(out, attr, None)
            if v is not None and getattr(self, name) is None:
                setattr(self, name, v)
        t = getattr(out, "token_at", None)
        if t is not None and out.new_token_ids:
            self.last_token = t


def request_metrics(choices: list, enabled: bool) -> dict[str, float] | None:
    """The `metrics` object of a request whose choices (ChoiceAssembler) are done; None when off
    or when the request had several choices."""
    if not enabled or len(choices) != 1:
        return None
    c = choices[0]
    t: Timeline = c.timeline
    n = c.num_tokens
    out: dict[str, float] = {}
    if t.scheduled is not None and t.first_token is not None:
        out["time_to_first_token_ms"] = max(0.0, (t.first_token - t.scheduled) * 1000)
    if t.first_token is not None and t.last_token is not None:
        gen = max(0.0, (t.last_token - t.first_token) * 1000)
        out["generation_time_ms"] = gen
        if n > 1:
            out["mean_itl_ms"] = gen / (n - 1)
    if t.arrival is not None and t.scheduled is not None:
        out["queue_time_ms"] = max(0.0, (t.scheduled - t.arrival) * 1000)
    if t.scheduled is not None and t.last_token is not None:
        span = t.last_token - t.scheduled
        if span > 0:
            out["tokens_per_second"] = n / span
    return out
