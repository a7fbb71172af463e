"""Workload description (lengths, rate, concurrency) and the figures a run yields.

Both the offline (in-process engine) and the online (HTTP) benchmark produce a list of
RequestRecord (arrival, first token, every token's time) plus phase timings; summarize() turns
them into one JSON-ready dict with the same keys for both."""

from __future__ import annotations

import math
import random
from dataclasses import dataclass, field

from g906.errors import UsageError


@dataclass(frozen=True)
class LengthSpec:
    """A token count: fixed ("512") or uniform over a closed range ("256:768")."""
    lo: int
    hi: int

    @classmethod
    def parse(cls, text: str | int, what: str = "length") -> "LengthSpec":
        if isinstance(text, int):
            text = str(text)
        raw = str(text).strip()
        try:
            if ":" in raw:
                a, b = raw.split(":", 1)
                lo, hi = int(a), int(b)
            else:
                lo = hi = int(raw)
        except ValueError:
            raise UsageError(f"bad {what} {text!r}", hint="use a number (512) or a range (256:768)") from None
        if lo < 1 or hi < lo:
            raise UsageError(f"bad {what} {text!r}: need 1 <= low <= high")
        return cls(lo, hi)

    def sample(self, rng: random.Random) -> int:
        return self.lo if self.lo == self.hi else rng.randint(self.lo, self.hi)

    def __str__(self) -> str:
        return str(self.lo) if self.lo == self.hi else f"{self.lo}:{self.hi}"


@dataclass
class Workload:
    num_requests: int = 16
    prompt_len: LengthSpec = field(default_factory=lambda: LengthSpec(128, 128))
    output_len: LengthSpec = field(default_factory=lambda: LengthSpec(128, 128))
    concurrency: int | None = None          # most requests in flight (None: all at once)
    request_rate: float = math.inf          # Poisson arrivals per second (inf: all at t=0)
    ignore_eos: bool = True
    temperature: float = 0.0
    seed: int = 0

    def __post_init__(self) -> None:
        if self.num_requests < 1:
            raise UsageError("--num-requests must be at least 1")
        if self.concurrency is not None and self.concurrency < 1:
            raise UsageError("--concurrency must be at least 1")
        if not self.request_rate > 0:
            raise UsageError("--request-rate must be positive (inf: all at once)")

    @property
    def max_concurrency(self) -> int:
        return min(self.concurrency or self.num_requests, self.num_requests)

    def plan(self, vocab: int) -> list[tuple[float, list[int], int]]:
        """(arrival offset s, prompt token ids, output length) per request; deterministic."""
        rng = random.Random(self.seed)
        t = 0.0
        out = []
        lo_id = min(1000, max(0, vocab // 8))     # avoid the very first ids (often control tokens)
        for _ in range(self.num_requests):
            n = self.prompt_len.sample(rng)
            m = self.output_len.sample(rng)
            ids = [rng.randrange(lo_id, vocab) for _ in range(n)]
            out.append((t, ids, m))
            if math.isfinite(self.request_rate):
                t += rng.expovariate(self.request_rate)
        return out

    def describe(self) -> dict:
        return {"num_requests": self.num_requests, "prompt_len": str(self.prompt_len),
                "output_len": str(self.output_len), "concurrency": self.max_concurrency,
                "request_rate": None if math.isinf(self.request_rate) else self.request_rate,
                "ignore_eos": self.ignore_eos, "temperature": self.temperature, "seed": self.seed}


@dataclass
class RequestRecord:
    prompt_tokens: int
    arrival: float                        # when it was sent / added (perf_counter seconds)
    token_times: list[float] = field(default_factory=list)
    output_tokens: int = 0
    error: str | None = None

    @property
    def ttft(self) -> float | None:
        return self.token_times[0] - self.arrival if self.token_times else None

    def itls(self) -> list[float]:
        t = self.token_times
        return [b - a for a, b in zip(t, t[1:])]


def percentile(values: list[float], q: float) -> float | None:
    if not values:
        return None
    v = sorted(values)
    k = (len(v) - 1) * q / 100.0
    f = math.floor(k)
    c = min(f + 1, len(v) - 1)
    return v[f] + (v[c] - v[f]) * (k - f)


def _ms(values: list[float]) -> dict:
    if not values:
        return {"mean": None, "p50": None, "p99": None}
    return {"mean": round(1e3 * sum(values) / len(values), 3),
            "p50": round(1e3 * percentile(values, 50), 3), "p99": round(1e3 * percentile(values, 99), 3)}


def summarize(records: list[RequestRecord], *, duration: float, prefill_seconds: float | None = None,
              prefill_tokens: int | None = None, decode_seconds: float | None = None,
              decode_tokens: int | None = None) -> dict:
    ok = [r for r in records if r.error is None]
    out_tok = sum(r.output_tokens for r in ok)
    prompt_tok = sum(r.prompt_tokens for r in ok)
    ttfts = [r.ttft for r in ok if r.ttft is not None]
    itls = [x for r in ok for x in r.itls()]
    res = {
        "completed": len(ok), "failed": len(records) - len(ok),
        "errors": sorted({r.error for r in records if r.error})[:5],
        "duration_s": round(duration, 4),
        "prompt_tokens": prompt_tok, "output_tokens": out_tok,
        "request_throughput": round(len(ok) / duration, 4) if duration > 0 else None,
        "output_tok_s": round(out_tok / duration, 2) if duration > 0 else None,
        "total_tok_s": round((out_tok + prompt_tok) / duration, 2) if duration > 0 else None,
        "ttft_ms": _ms(ttfts), "itl_ms": _ms(itls),
    }
    if prefill_seconds and prefill_tokens:
        res["prefill_tok_s"] = round(prefill_tokens / prefill_seconds, 2)
    elif ttfts and prompt_tok:
        # online: each request's prompt over its time to first token (an underestimate when
        # requests queue)
        res["prefill_tok_s"] = round(sum(r.prompt_tokens / r.ttft for r in ok if r.ttft) / len(ttfts), 2)
    else:
        res["prefill_tok_s"] = None
    if decode_seconds and decode_tokens:
        res["decode_tok_s"] = round(decode_tokens / decode_seconds, 2)
    elif itls:
        res["decode_tok_s"] = round(len(itls) / sum(itls), 2)   # per sequence
    else:
        res["decode_tok_s"] = None
    return res
