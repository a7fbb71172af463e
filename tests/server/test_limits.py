"""A second, deliberately small `g906 up`: 4 sequences, 2 waiting places, a KV cache far too small
for four long requests. Queue full (503), preemption, and draining on SIGTERM."""

from __future__ import annotations

import asyncio
import signal
import threading

import httpx
import pytest

from tests.server.conftest import start_server, stop_server

SMALL_RECIPE = """
[model]
source = "builtin:tiny-qwen35"
name = "small"

[limits]
max_model_len = 256
max_num_seqs = 4
max_num_batched_tokens = 128

[engine.embedded]
max_waiting_requests = 2
cpu_kv_cache_gib = 0.0002     # about 17 blocks of 16 tokens: 272 tokens for everything
"""


@pytest.fixture(scope="module")
def small(tmp_path_factory):
    s = start_server(tmp_path_factory.mktemp("g906-small"), SMALL_RECIPE)
    yield s
    stop_server(s)


def body(prompt, max_tokens, **kw):
    return {"prompt": prompt, "max_tokens": max_tokens, "temperature": 0, "ignore_eos": True, **kw}


def test_cache_too_small_still_completes_everything_by_preemption(small):
    prompts = [f"request {i}: " + "abc " * 10 for i in range(4)]
    # alone, each fits; together (4 x ~150 tokens) they need twice the cache
    expected = [httpx.post(small.v1 + "/completions", json=body(p, 110), timeout=120).json() for p in prompts]

    async def run():
        async with httpx.AsyncClient(timeout=300) as h:
            rs = await asyncio.gather(*(h.post(small.v1 + "/completions", json=body(p, 110)) for p in prompts))
        return [r.json() for r in rs]

    got = asyncio.run(run())
    for e, g in zip(expected, got):
        assert g["choices"][0]["finish_reason"] == "length"
        assert g["usage"]["completion_tokens"] == 110
        assert g["choices"][0]["text"] == e["choices"][0]["text"]
    m = small.metrics()
    assert m["g906:num_preemptions"] > 0
    assert m["g906:kv_cache_blocks_used"] == 0 and m["g906:state_slots_used"] == 0


def test_503_when_the_queue_is_full(small):
    async def run():
        async with httpx.AsyncClient(timeout=300) as h:
            return await asyncio.gather(*(h.post(small.v1 + "/completions", json=body("q", 60)) for _ in range(12)))

    rs = asyncio.run(run())
    codes = sorted(r.status_code for r in rs)
    assert codes.count(200) >= 4 and 503 in codes, codes
    for r in rs:
        if r.status_code == 503:
            err = r.json()["error"]
            assert err["code"] == "queue_full" and r.headers.get("retry-after")
    # and it recovers
    assert httpx.post(small.v1 + "/completions", json=body("q", 2), timeout=60).status_code == 200


def test_sigterm_drains_in_flight_requests_then_exits_0(small):
    # Behaviour, not speed: SIGTERM goes only once the stream is producing, and the server is then
    # left to exit on its own (a second signal, such as stop_server's SIGINT, would cut the drain).
    result = {"lines": []}
    streaming = threading.Event()

    def stream():
        with httpx.stream("POST", small.v1 + "/completions", json=body("drain me", 120, stream=True),
                          timeout=300) as r:
            for line in r.iter_lines():
                if line:
                    result["lines"].append(line)
                    streaming.set()
        streaming.set()

    t = threading.Thread(target=stream)
    t.start()
    assert streaming.wait(300), "the stream never started"
    small.proc.send_signal(signal.SIGTERM)
    t.join(300)
    assert not t.is_alive()
    code = small.proc.wait(300)
    assert code == 0, small.stderr_path.read_text()[-3000:]
    lines = result["lines"]
    assert lines[-1] == "data: [DONE]"
    assert '"finish_reason":"length"' in lines[-2]
    out = "".join(small.lines)
    assert "Stopped." in out
    assert "draining" in small.stderr_path.read_text()
