"""SIGTERM while a stream outlasts the drain period: uvicorn cancels the request, and the client
still gets an OpenAI-style error event and `data: [DONE]` (not a bare dropped connection), the
engine request is aborted, the log has one clear line and no traceback, and the exit is the
normal SIGTERM exit (0, "Stopped.").

In-process, SSEResponse's cut-off itself: the engine streams are closed (aborted) at once, the ASGI
call returns normally, and a connection that takes no more writes cannot hold the shutdown up."""

from __future__ import annotations

import asyncio
import logging
import signal
import time

import pytest

from g906.server.sse import SSEResponse
from tests.server.conftest import openai_client, start_server

DRAIN_S = 1.0

RECIPE = """
[model]
source = "builtin:tiny-qwen35"
name = "tiny"

[limits]
max_model_len = 4096
max_num_seqs = 2
max_num_batched_tokens = 256
"""


def test_stream_outlasting_the_drain_ends_with_an_error_event_and_no_traceback(tmp_path):
    openai = pytest.importorskip("openai")
    s = start_server(tmp_path, RECIPE, drain_timeout=DRAIN_S)
    try:
        client = openai_client(s)
        stream = client.completions.create(model="tiny", prompt="never stop", max_tokens=4000, temperature=0,
                                           stream=True, extra_body={"ignore_eos": True})
        chunks = []
        with pytest.raises(openai.APIError) as info:
            for chunk in stream:
                chunks.append(chunk)
                if len(chunks) == 3:
                    t_signal = time.monotonic()
                    s.proc.send_signal(signal.SIGTERM)
        cut_after = time.monotonic() - t_signal
        code = s.proc.wait(60)          # no second signal: that one would force the exit
        exited_after = time.monotonic() - t_signal
    finally:
        if s.proc.poll() is None:
            s.proc.kill()
    err = s.stderr_path.read_text()
    out = "".join(s.lines)
    # the stream ran past the drain period and was then ended by the server, not dropped
    assert type(info.value) is openai.APIError, repr(info.value)   # not APIConnectionError & co.
    body = info.value.body
    assert body["code"] == "server_shutting_down" and body["type"] == "server_error", body
    assert "shutting down" in body["message"]
    assert sum(c.choices[0].finish_reason is None for c in chunks) == len(chunks) > 3
    assert DRAIN_S <= cut_after < DRAIN_S + 10
    # the usual SIGTERM exit, quickly: the engine request was aborted, so its drain had nothing to wait for
    assert code == 0, err[-3000:]
    deadline = time.monotonic() + 5       # the stdout reader thread may lag the exit a little
    while "Stopped." not in out and time.monotonic() < deadline:
        time.sleep(0.05)
        out = "".join(s.lines)
    assert "Stopped." in out
    assert exited_after < DRAIN_S + 15
    assert "Traceback" not in err, err[-3000:]
    assert "Exception in ASGI application" not in err and "without completing response" not in err, err[-3000:]
    rid = chunks[0].id
    lines = [line for line in err.splitlines() if rid in line]
    assert len(lines) == 1 and "cut off" in lines[0] and "shutting down" in lines[0], err[-3000:]


def test_non_streamed_request_outlasting_the_drain_gets_an_openai_503(tmp_path):
    """The same for a request waiting for its full answer: a JSON 503 server_shutting_down (not
    uvicorn's plain-text 500), one log line, no traceback, exit 0."""
    import httpx

    s = start_server(tmp_path, RECIPE, drain_timeout=DRAIN_S)
    result = {}
    try:
        def call():
            result["r"] = httpx.post(s.v1 + "/completions", timeout=60, json={
                "model": "tiny", "prompt": "never stop", "max_tokens": 4000, "ignore_eos": True})

        import threading

        t = threading.Thread(target=call)
        t.start()
        time.sleep(1.0)               # the request is generating
        s.proc.send_signal(signal.SIGTERM)
        t.join(60)
        code = s.proc.wait(60)
    finally:
        if s.proc.poll() is None:
            s.proc.kill()
    err = s.stderr_path.read_text()
    r = result["r"]
    assert r.status_code == 503, (r.status_code, r.text[:300])
    body = r.json()["error"]
    assert body["code"] == "server_shutting_down" and body["type"] == "server_error", body
    assert code == 0, err[-3000:]
    assert "Traceback" not in err and "Exception in ASGI application" not in err, err[-3000:]
    assert len([line for line in err.splitlines() if "cut off" in line]) == 1, err[-3000:]


class _FakeRequestStream:
    def __init__(self):
        self.closed = 0

    def close(self):
        self.closed += 1


@pytest.mark.parametrize("transport", ["writable", "stuck+teardown", "stuck"])
def test_cut_off_aborts_at_once_and_never_waits_on_the_client(transport, caplog):
    """uvicorn's cancel, then (stuck+teardown) asyncio.run's second cancel of every task, or (stuck)
    nothing more: the send that never returns is given up on after a bounded wait."""
    sent: list[dict] = []
    unwound: list[str] = []
    stuck = asyncio.Event()   # never set

    async def send(msg):
        if transport != "writable" and len(sent) >= 2:
            await stuck.wait()              # the client stopped reading: writes are paused for good
        sent.append(msg)

    async def receive():                    # the client never disconnects
        await stuck.wait()

    async def events():
        try:
            yield "data: 1\n\n"
            await stuck.wait()              # the engine has nothing new yet
        finally:
            unwound.append("events")

    async def main():
        req = _FakeRequestStream()
        resp = SSEResponse(events(), request_id="cmpl-test", requests=[req])
        task = asyncio.ensure_future(resp({"type": "http"}, receive, send))
        while len(sent) < 2:
            await asyncio.sleep(0)
        task.cancel("Task cancelled, timeout graceful shutdown exceeded")
        await asyncio.sleep(0)              # one step of the task, as uvicorn's loop gives it before stopping
        assert req.closed == 1              # aborted in that step, before anything is awaited
        if transport == "stuck+teardown":
            task.cancel()
        t0 = time.monotonic()
        await asyncio.wait({task}, timeout=5)
        assert task.done() and not task.cancelled() and task.exception() is None   # ended normally
        await asyncio.sleep(0)
        return req, time.monotonic() - t0

    with caplog.at_level(logging.WARNING, logger="g906.server"):
        req, waited = asyncio.run(main())
    assert req.closed == 1 and unwound == ["events"]
    lines = [r.getMessage() for r in caplog.records if "cmpl-test" in r.getMessage()]
    assert len(lines) == 1 and "cut off" in lines[0] and "shutting down" in lines[0]
    if transport == "writable":
        assert b'"code": "server_shutting_down"' in sent[2]["body"] and sent[2]["body"].endswith(b"data: [DONE]\n\n")
        assert sent[3] == {"type": "http.response.body", "body": b"", "more_body": False}
        assert "sent a server_shutting_down error" in lines[0]
    else:
        assert len(sent) == 2 and "could not be told" in lines[0]
        assert waited < (0.5 if transport == "stuck+teardown" else 3)
