"""Fuzz a running `g906 up` over its own /openapi.json: property-based bodies (schema-following
and wild) for every POST route, plus hand-made hostile bodies (deep nesting, huge numbers, bad
UTF-8, odd field names, truncated JSON, wrong content types). Every answer must be a 2xx, or a
4xx in OpenAI's error shape; any 5xx, a hang, or a traceback in the server's log is a finding.
(schemathesis is not installed here; this is the same idea with hypothesis.)"""

from __future__ import annotations

import json
import random
import time
from collections import Counter
from dataclasses import dataclass, field

import httpx
from hypothesis import HealthCheck, given, settings

from tests.fuzz.openapi_strategy import SchemaStrategies


@dataclass
class HttpFigures:
    cases: int = 0
    statuses: Counter = field(default_factory=Counter)
    server_errors: list[str] = field(default_factory=list)
    bad_shape: list[str] = field(default_factory=list)
    hangs: int = 0

    def as_dict(self) -> dict:
        return {"cases": self.cases, "statuses": dict(sorted(self.statuses.items())),
                "server_errors": len(self.server_errors), "bad_error_shape": len(self.bad_shape),
                "hangs": self.hangs, "examples": (self.server_errors + self.bad_shape)[:5]}


def _tame(body):
    """Keep generation short so that the fuzz spends its time on parsing, not decoding."""
    if isinstance(body, dict):
        for k in ("max_tokens", "max_completion_tokens"):
            if isinstance(body.get(k), int) and body[k] > 4:
                body[k] = 4
        if isinstance(body.get("n"), int) and body["n"] > 2 and random.random() < 0.8:
            body["n"] = 2
        if random.random() < 0.5:
            body.pop("stream", None)
    return body


def _check(fig: HttpFigures, what: str, r: httpx.Response) -> None:
    fig.cases += 1
    fig.statuses[r.status_code] += 1
    if r.status_code >= 500:
        fig.server_errors.append(f"{what}: {r.status_code} {r.text[:200]}")
    elif r.status_code >= 400:
        try:
            err = r.json()["error"]
            assert isinstance(err["message"], str) and "type" in err and "code" in err
        except Exception:  # noqa: BLE001 - any deviation from the shape is the finding
            fig.bad_shape.append(f"{what}: {r.status_code} {r.text[:200]}")


def hostile_bodies() -> list[tuple[str, bytes, str]]:
    """(name, raw body, content type) of hand-made bad requests."""
    ok = {"model": "tiny", "prompt": "hi", "max_tokens": 2}
    out = [
        ("deep-array", b'{"prompt": ' + b"[" * 100_000 + b"]" * 100_000 + b"}", "application/json"),
        ("deep-object", b'{"x": ' + b'{"a": ' * 5000 + b"1" + b"}" * 5000 + b"}", "application/json"),
        ("int-5000", b'{"prompt": "x", "max_tokens": ' + b"9" * 5000 + b"}", "application/json"),
        ("float-5000", b'{"prompt": "x", "temperature": 0.' + b"9" * 5000 + b"}", "application/json"),
        ("nan", b'{"prompt": "x", "temperature": NaN}', "application/json"),
        ("bad-utf8", b'{"prompt": "\xff\xfe\xfd"}', "application/json"),
        ("lone-surrogate", b'{"prompt": "\\ud800"}', "application/json"),
        ("nul", b'{"prompt": "a\\u0000b", "max_tokens": 1}', "application/json"),
        ("truncated", json.dumps(ok).encode()[:-3], "application/json"),
        ("not-object", b"[1, 2, 3]", "application/json"),
        ("empty", b"", "application/json"),
        ("text-plain", json.dumps(ok).encode(), "text/plain"),
        ("form", b"prompt=hi", "application/x-www-form-urlencoded"),
        ("crlf-names", json.dumps({**ok, "a\r\nX-Injected: 1": 1, "caf\u00e9": 2}).encode(), "application/json"),
        ("2000-names", json.dumps({**ok, **{f"k{i}": i for i in range(2000)}}).encode(), "application/json"),
        ("long-name", json.dumps({**ok, "n" * 100_000: 1}).encode(), "application/json"),
        ("n-too-many", json.dumps({**ok, "prompt": ["a"] * 64, "n": 16}).encode(), "application/json"),
        ("token-ids-negative", json.dumps({**ok, "prompt": [-1, 2**40]}).encode(), "application/json"),
        ("image-metadata-url", json.dumps({"model": "tiny", "max_tokens": 1, "messages": [{"role": "user", "content": [
            {"type": "image_url", "image_url": {"url": "http://169.254.169.254/latest/meta-data/"}}]}]}).encode(),
         "application/json"),
        ("image-file-url", json.dumps({"model": "tiny", "max_tokens": 1, "messages": [{"role": "user", "content": [
            {"type": "image_url", "image_url": {"url": "file:///etc/passwd"}}]}]}).encode(), "application/json"),
        ("huge-prompt", json.dumps({**ok, "prompt": "word " * 180_000}).encode(), "application/json"),
    ]
    return out


def run_http(base_url: str, api_key: str, *, cases: int, seed: int = 0) -> dict:
    random.seed(seed)
    headers = {"Authorization": f"Bearer {api_key}"}
    client = httpx.Client(base_url=base_url, headers=headers, timeout=120)
    doc = client.get("/openapi.json").json()
    gen = SchemaStrategies(doc)
    fig = HttpFigures()
    posts = [(path, op["post"]["requestBody"]["content"]["application/json"]["schema"]["$ref"].rsplit("/", 1)[-1])
             for path, op in doc["paths"].items() if "post" in op]

    for name, raw, ctype in hostile_bodies():
        for path, _ in posts:
            try:
                r = client.post(path, content=raw, headers={"Content-Type": ctype})
            except httpx.TimeoutException:
                fig.hangs += 1
                continue
            _check(fig, f"{path} {name}", r)

    per_route = max(1, cases // (2 * len(posts)))

    def route_test(path: str, model: str, wild: bool):
        @settings(max_examples=per_route, deadline=None, database=None, derandomize=True,
                  suppress_health_check=list(HealthCheck))
        @given(body=gen.body(model, wild=wild))
        def one(body):
            try:
                r = client.post(path, json=_tame(body))
            except httpx.TimeoutException:
                fig.hangs += 1
                return
            _check(fig, f"{path} wild={wild} {json.dumps(body)[:150]}", r)

        return one

    for path, model in posts:
        for wild in (False, True):
            route_test(path, model, wild)()
    for path in [p for p, op in doc["paths"].items() if "get" in op and "{" not in p]:
        _check(fig, f"GET {path}", client.get(path))
    t0 = time.monotonic()
    health = client.get("/health").status_code
    out = fig.as_dict()
    out["health_after"] = health
    out["health_seconds"] = round(time.monotonic() - t0, 3)
    return out

