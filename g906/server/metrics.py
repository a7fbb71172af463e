"""Prometheus metrics (/metrics): engine gauges read at scrape time, latency histograms and
token counters fed by the async engine's observer."""

from __future__ import annotations

from prometheus_client import CollectorRegistry, Counter, Histogram, generate_latest
from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily

_LATENCY_BUCKETS = (0.001, 0.005, 0.01, 0.02, 0.04, 0.06, 0.08, 0.1, 0.25, 0.5, 0.75, 1.0, 2.5, 5.0, 10.0,
                    20.0, 40.0, 80.0)


class _EngineCollector:
    def __init__(self, state):
        self.state = state

    def collect(self):
        eng = self.state.engine
        stats = eng.engine.stats() if eng is not None else {}
        model = self.state.served_model_name

        def gauge(name, doc, key):
            g = GaugeMetricFamily(f"g906:{name}", doc, labels=["model_name"])
            g.add_metric([model], float(stats.get(key, 0)))
            return g

        yield gauge("num_requests_running", "Requests being decoded or prefilled.", "num_requests_running")
        yield gauge("num_requests_waiting", "Requests waiting for the scheduler.", "num_requests_waiting")
        yield gauge("kv_cache_blocks_used", "Paged KV-cache blocks in use.", "kv_blocks_used")
        yield gauge("kv_cache_blocks_free", "Paged KV-cache blocks free.", "kv_blocks_free")
        yield gauge("kv_cache_blocks_total", "Paged KV-cache blocks in all.", "kv_blocks_total")
        yield gauge("state_slots_used", "Linear-attention state slots in use.", "state_slots_used")
        yield gauge("state_slots_total", "Linear-attention state slots in all.", "state_slots_total")
        yield gauge("num_preemptions", "Sequences preempted (recomputed) so far.", "num_preemptions")
        yield gauge("engine_steps", "Engine steps run so far.", "steps")
        if "prefix_cache_queried_tokens" in stats:
            yield from _prefix_cache(stats, model)
        if "spec_num_drafts" in stats:
            yield from _spec_metrics(stats, model)
        total = stats.get("kv_blocks_total", 0) or 1
        g = GaugeMetricFamily("g906:kv_cache_usage_perc", "Fraction of KV-cache blocks in use.", labels=["model_name"])
        g.add_metric([model], stats.get("kv_blocks_used", 0) / total)
        yield g


def _prefix_cache(stats: dict, model: str):
    """The prefix cache's counters and its snapshot pool (g906/engine/prefix_cache.py)."""
    for name, doc, key in (
        ("prefix_cache_queries", "Prompt tokens looked up in the prefix cache.", "prefix_cache_queried_tokens"),
        ("prefix_cache_hits", "Prompt tokens served from the prefix cache.", "prefix_cache_hit_tokens"),
        ("prefix_cache_block_evictions", "Cached KV blocks evicted to make room.", "prefix_cache_block_evictions"),
        ("prefix_snapshot_evictions", "Linear-attention state snapshots evicted to make room.",
         "prefix_snapshot_evictions"),
    ):
        c = CounterMetricFamily(f"g906:{name}", doc, labels=["model_name"])
        c.add_metric([model], float(stats.get(key, 0)))
        yield c
    for name, doc, key in (
        ("prefix_cache_blocks", "KV blocks held by the prefix cache (in use or not).", "prefix_cache_blocks"),
        ("prefix_snapshots_used", "Linear-attention state snapshots in the pool.", "prefix_snapshots_used"),
        ("prefix_snapshots_total", "Linear-attention state snapshot slots in all.", "prefix_snapshots_total"),
        ("prefix_snapshots_pending", "Snapshots being taken (reserved by a step not yet read).",
         "prefix_snapshots_pending"),
    ):
        g = GaugeMetricFamily(f"g906:{name}", doc, labels=["model_name"])
        g.add_metric([model], float(stats.get(key, 0)))
        yield g


def _spec_metrics(stats: dict, model: str):
    """Speculative decoding's counters under vLLM's names (dashboards built for vLLM read them)."""
    for key, name, doc in (
        ("spec_num_drafts", "num_drafts", "Verify rows that carried drafts."),
        ("spec_num_draft_tokens", "num_draft_tokens", "Draft tokens proposed."),
        ("spec_num_accepted_tokens", "num_accepted_tokens", "Draft tokens accepted."),
    ):
        c = CounterMetricFamily(f"vllm:spec_decode_{name}", doc, labels=["model_name"])
        c.add_metric([model], float(stats.get(key, 0)))
        yield c
    c = CounterMetricFamily("vllm:spec_decode_num_accepted_tokens_per_pos", "Draft tokens accepted, by position.",
                            labels=["model_name", "position"])
    for pos, n in enumerate(stats.get("spec_accepted_per_pos", [])):
        c.add_metric([model, str(pos)], float(n))
    yield c
    g = GaugeMetricFamily("g906:spec_decode_mean_acceptance_length",
                          "Tokens emitted per verify row (1 + accepted drafts per draft).", labels=["model_name"])
    g.add_metric([model], float(stats.get("spec_mean_acceptance_length", 0.0)))
    yield g


class Metrics:
    """Also the AsyncEngine observer."""

    def __init__(self, state):
        self.registry = CollectorRegistry()
        self.registry.register(_EngineCollector(state))
        m = state.served_model_name
        r = self.registry
        self.prompt_tokens = Counter("g906:prompt_tokens", "Prompt tokens of finished requests.", ["model_name"], registry=r).labels(m)
        self.generation_tokens = Counter("g906:generation_tokens", "Generated tokens.", ["model_name"], registry=r).labels(m)
        self._finished = Counter("g906:request_success", "Finished requests by finish reason.",
                                 ["model_name", "finished_reason"], registry=r)
        self.model = m
        self.ttft = Histogram("g906:time_to_first_token_seconds", "Time to first token.", ["model_name"],
                              buckets=_LATENCY_BUCKETS, registry=r).labels(m)
        self.itl = Histogram("g906:inter_token_latency_seconds", "Time between tokens of one sequence.",
                             ["model_name"], buckets=_LATENCY_BUCKETS, registry=r).labels(m)
        self.http_errors = Counter("g906:http_errors", "Error responses by status.", ["status"], registry=r)
        from g906.server.vllm_metrics import VllmEngineCollector, VllmRequestMetrics

        r.register(VllmEngineCollector(state))
        self.vllm = VllmRequestMetrics(r, m, _LATENCY_BUCKETS)     # the same figures under vllm: names

    # observer
    def on_first_token(self, seconds: float, n: int = 1) -> None:
        self.ttft.observe(seconds)
        self.generation_tokens.inc(n)
        self.vllm.on_first_token(seconds, n)

    def on_token(self, seconds: float, n: int = 1) -> None:
        """n tokens arrived together (a speculative step): one gap observed, n tokens counted."""
        self.itl.observe(seconds)
        self.generation_tokens.inc(n)
        self.vllm.on_token(seconds, n)

    def on_finish(self, out) -> None:
        self._finished.labels(self.model, out.finish_reason or "unknown").inc()
        self.vllm.on_finish(out)

    def on_prompt(self, num_tokens: int) -> None:
        self.prompt_tokens.inc(num_tokens)
        self.vllm.on_prompt(num_tokens)

    def on_e2e(self, seconds: float) -> None:
        self.vllm.on_e2e(seconds)

    def render(self) -> bytes:
        return generate_latest(self.registry)
