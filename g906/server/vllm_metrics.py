"""The same figures under vLLM's metric names (`vllm:`), so that dashboards and alerts written
for vLLM (its Grafana dashboard, KEDA/HPA rules on vllm:num_requests_waiting, the Gateway API
inference extension) read a g906 server unchanged. g906's own `g906:` names stay as they are.

Names and types as vLLM's V1 engine exports them: gauges vllm:num_requests_running /
vllm:num_requests_waiting / vllm:kv_cache_usage_perc (and the older vllm:gpu_cache_usage_perc),
counters vllm:prompt_tokens_total / vllm:generation_tokens_total / vllm:request_success_total /
vllm:num_preemptions_total, histograms vllm:time_to_first_token_seconds /
vllm:inter_token_latency_seconds / vllm:time_per_output_token_seconds /
vllm:e2e_request_latency_seconds; every series labelled model_name."""

from __future__ import annotations

from prometheus_client import Counter, Histogram
from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily

_E2E_BUCKETS = (0.3, 0.5, 0.8, 1.0, 1.5, 2.0, 2.5, 5.0, 10.0, 15.0, 20.0, 30.0, 40.0, 50.0, 60.0, 120.0,
                240.0, 480.0, 960.0, 1920.0, 7680.0)


class VllmEngineCollector:
    """Scheduler and cache gauges, read from the engine at scrape time."""

    def __init__(self, state):
        self.state = state

    def collect(self):
        eng = self.state.engine
        stats = eng.engine.stats() if eng is not None else {}
        model = self.state.served_model_name
        used = stats.get("kv_blocks_used", 0)
        usage = used / (stats.get("kv_blocks_total", 0) or 1)
        for name, doc, value in (
            ("num_requests_running", "Number of requests in model execution batches.", stats.get("num_requests_running", 0)),
            ("num_requests_waiting", "Number of requests waiting to be processed.", stats.get("num_requests_waiting", 0)),
            ("kv_cache_usage_perc", "KV-cache usage. 1 means 100 percent usage.", usage),
            ("gpu_cache_usage_perc", "KV-cache usage (vLLM V0's name). 1 means 100 percent usage.", usage),
        ):
            g = GaugeMetricFamily(f"vllm:{name}", doc, labels=["model_name"])
            g.add_metric([model], float(value))
            yield g
        c = CounterMetricFamily("vllm:num_preemptions", "Cumulative number of preemptions from the engine.",
                                labels=["model_name"])
        c.add_metric([model], float(stats.get("num_preemptions", 0)))
        yield c


class VllmRequestMetrics:
    """Token counters and latency histograms, fed by the same observer calls as g906's own."""

    def __init__(self, registry, model: str, latency_buckets):
        r = registry
        self.model = model
        self.prompt_tokens = Counter("vllm:prompt_tokens", "Number of prefill tokens processed.",
                                     ["model_name"], registry=r).labels(model)
        self.generation_tokens = Counter("vllm:generation_tokens", "Number of generation tokens processed.",
                                         ["model_name"], registry=r).labels(model)
        self.success = Counter("vllm:request_success", "Count of successfully processed requests.",
                               ["model_name", "finished_reason"], registry=r)
        self.ttft = Histogram("vllm:time_to_first_token_seconds", "Histogram of time to first token in seconds.",
                              ["model_name"], buckets=latency_buckets, registry=r).labels(model)
        self.itl = Histogram("vllm:inter_token_latency_seconds", "Histogram of inter-token latency in seconds.",
                             ["model_name"], buckets=latency_buckets, registry=r).labels(model)
        self.tpot = Histogram("vllm:time_per_output_token_seconds",
                              "Histogram of time per output token in seconds.", ["model_name"],
                              buckets=latency_buckets, registry=r).labels(model)
        self.e2e = Histogram("vllm:e2e_request_latency_seconds",
                             "Histogram of end to end request latency in seconds.", ["model_name"],
                             buckets=_E2E_BUCKETS, registry=r).labels(model)

    def on_first_token(self, seconds: float, n: int = 1) -> None:
        self.ttft.observe(seconds)
        self.generation_tokens.inc(n)

    def on_token(self, seconds: float, n: int = 1) -> None:
        self.itl.observe(seconds)
        self.tpot.observe(seconds)
        self.generation_tokens.inc(n)

    def on_finish(self, out) -> None:
        # vLLM's finished_reason values: stop, length, abort
        reason = out.finish_reason or "abort"
        self.success.labels(self.model, reason if reason in ("stop", "length") else "abort").inc()

    def on_prompt(self, num_tokens: int) -> None:
        self.prompt_tokens.inc(num_tokens)

    def on_e2e(self, seconds: float) -> None:
        self.e2e.observe(seconds)
