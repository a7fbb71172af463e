"""Hostile clients (issue 43): malformed and oversized requests get a 4xx in OpenAI's shape, never
a 500 or a traceback; heavy work never freezes the event loop; slow or vanishing clients cost
nothing. Small sizes: this runs in CI.

Against the session's `g906 up` (tests/server/conftest.py) where a real server is needed; the
event-loop and connection tests run the app under the same uvicorn setup in-process, with an
engine stand-in whose tokenizer blocks until told (the property tested is where the work runs)."""

from __future__ import annotations

import contextlib
import json
import logging
import socket
import threading
import time

import httpx
import pytest

from g906.server.app import ServerState, create_app
from g906.server.intake import MAX_IGNORED_NAMES, MAX_REMEMBERED_NAMES, report_ignored
from g906.serving.serve import DrainingServer, bind
from tests.server.conftest import API_KEY

AUTH = {"Authorization": f"Bearer {API_KEY}", "Content-Type": "application/json"}


def post(server, path, raw: bytes | str, **kw):
    return httpx.post(server.v1 + path, content=raw, headers={**AUTH, **kw.pop("headers", {})}, timeout=60, **kw)


def assert_openai_400(r, *, code=None, contains=None):
    assert r.status_code == 400, (r.status_code, r.text[:500])
    err = r.json()["error"]
    assert err["type"] == "invalid_request_error"
    if code:
        assert err["code"] == code, err
    if contains:
        assert contains in err["message"], err


# -- 4: JSON depth and number limits -----------------------------------------------------------------

@pytest.mark.parametrize("path", ["/completions", "/chat/completions"])
def test_deeply_nested_json_is_400(server, path):
    deep = "[" * 50_000 + "]" * 50_000
    r = post(server, path, '{"model": "tiny", "prompt": "x", "messages": [], "x": ' + deep + "}")
    assert_openai_400(r, code="invalid_json", contains="nest more than")
    mid = "[" * 200 + "]" * 200     # within Python's recursion limit, beyond g906's depth limit
    r = post(server, path, '{"model": "tiny", "prompt": "x", "x": ' + mid + "}")
    assert_openai_400(r, code="invalid_json", contains="nest more than")


@pytest.mark.parametrize("number", ["1" * 5000, "1." + "1" * 5000, "1e" + "9" * 5000, "NaN", "-Infinity"])
def test_huge_numbers_are_400(server, number):
    r = post(server, "/completions", '{"model": "tiny", "prompt": "x", "max_tokens": ' + number + "}")
    assert_openai_400(r, code="invalid_json")


# -- 5: unknown field names in the header and the log -----------------------------------------------

def test_unknown_field_names_are_bounded_and_escaped(server):
    odd = ["caf\u00e9", "x\r\ny: z", "\u2603snow", "a" * 500, "a,b", "back\\slash"]
    r = post(server, "/completions", json.dumps({"model": "tiny", "prompt": "hi", "max_tokens": 1,
                                                  **{n: 1 for n in odd}}))
    assert r.status_code == 200, r.text[:500]
    header = r.headers["x-g906-ignored-fields"]
    assert header.isascii() and "\r" not in header and "\n" not in header
    assert "caf\\xe9" in header and "x\\x0d\\x0ay: z" in header and "\\u2603snow" in header
    assert "a\\x2cb" in header and "back\\x5cslash" in header and "a" * 64 + "..." in header
    many = [f"f{i}" for i in range(2000)]
    r = post(server, "/completions", json.dumps({"model": "tiny", "prompt": "hi", "max_tokens": 1,
                                                  **{n: 1 for n in many}}))
    assert r.status_code == 200, r.text[:500]
    header = r.headers["x-g906-ignored-fields"]
    assert len(header) < 1000 and f"(+{len(many) - MAX_IGNORED_NAMES} more)" in header
    err = server.stderr_path.read_text()
    assert "\ny: z" not in err and "f1999" not in err and "x\\x0d\\x0ay: z" in err


def test_the_set_of_names_seen_stays_bounded():
    st = ServerState(served_model_name="m")
    for i in range(0, 5000, 10):
        report_ignored(st, [f"n{j}" for j in range(i, i + 10)])
    assert len(st._logged_ignored) <= MAX_REMEMBERED_NAMES


# -- 8: a batch that can never fit the queue -----------------------------------------------------------

def test_batch_larger_than_the_queue_can_ever_hold_is_400(server):
    # the session server holds max_waiting_requests 256 + max_num_seqs 16 = 272 sequences
    r = post(server, "/completions", json.dumps({"model": "tiny", "prompt": ["a"] * 20, "n": 16,
                                                  "max_tokens": 1}))
    assert_openai_400(r, code="too_many_sequences", contains="272")
    assert "retry-after" not in r.headers


# -- 3: a huge prompt is refused by its size in bytes before any tokenizer runs ------------------------

def test_huge_prompt_refused_by_bytes_first(server):
    big = "lorem ipsum " * 80_000          # ~940 KiB, under the session's 1 MiB body limit
    r = post(server, "/completions", json.dumps({"model": "tiny", "prompt": big, "max_tokens": 1}))
    assert_openai_400(r, code="context_length_exceeded", contains="bytes long")
    r = post(server, "/chat/completions", json.dumps({"model": "tiny", "max_tokens": 1,
                                                       "messages": [{"role": "user", "content": big}]}))
    assert_openai_400(r, code="context_length_exceeded", contains="bytes long")


# -- in-process: the real app under the same uvicorn setup as `g906 up` ---------------------------------

class _Gate:
    """A tokenizer stand-in whose encode blocks until released (it then encodes nothing)."""

    def __init__(self):
        self.entered = threading.Event()
        self.release = threading.Event()
        self.tokenizer = None

    def encode(self, text):
        self.entered.set()
        self.release.wait(30)
        return []


class _Engine:
    running = True
    observer = None
    max_waiting_requests = 8

    class engine:       # noqa: N801 - the attribute the server reads
        max_model_len = 1 << 20

        @staticmethod
        def stats():
            return {}

        class config:   # noqa: N801
            max_num_seqs = 4


@contextlib.contextmanager
def in_process(state: ServerState, **kw):
    sock = bind("127.0.0.1", 0)
    srv = DrainingServer(create_app(state), sock, **kw)
    t = threading.Thread(target=srv.run, daemon=True)
    t.start()
    deadline = time.monotonic() + 20
    while not srv.server.started and time.monotonic() < deadline:
        time.sleep(0.02)
    try:
        yield f"http://127.0.0.1:{sock.getsockname()[1]}"
    finally:
        srv.stop()
        t.join(20)
        sock.close()


def test_tokenizing_does_not_block_the_event_loop():
    gate = _Gate()
    st = ServerState(served_model_name="m")
    st.set_ready(_Engine(), gate)
    with in_process(st) as url:
        result = {}

        def slow():
            result["r"] = httpx.post(url + "/v1/completions", json={"prompt": "x" * 1000, "max_tokens": 1},
                                     timeout=60)

        t = threading.Thread(target=slow)
        t.start()
        try:
            assert gate.entered.wait(20)
            # the tokenizer is busy; the loop must still answer
            assert httpx.get(url + "/health", timeout=5).status_code == 200
        finally:
            gate.release.set()
            t.join(30)
        assert result["r"].status_code == 400


def test_a_client_dropping_mid_upload_is_a_quiet_disconnect(caplog):
    st = ServerState(served_model_name="m")
    st.set_ready(_Engine(), _Gate())
    with caplog.at_level(logging.DEBUG):
        with in_process(st) as url:
            port = int(url.rsplit(":", 1)[1])
            for _ in range(5):
                s = socket.create_connection(("127.0.0.1", port))
                s.sendall(b"POST /v1/completions HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\n"
                          b"Content-Length: 100000\r\n\r\n{\"prompt\": \"abc")
                time.sleep(0.1)
                s.close()
            time.sleep(0.5)
            metrics = httpx.get(url + "/metrics", timeout=5).text
            assert "g906:http_errors_total" in metrics or "g906:engine_steps" in metrics
    assert not [r for r in caplog.records if r.levelno >= logging.ERROR], caplog.text[-3000:]
    assert "Traceback" not in caplog.text
    assert 'g906:http_errors_total{status="500"}' not in metrics


def test_slow_headers_and_bodies_are_cut_off():
    st = ServerState(served_model_name="m", body_timeout_s=0.5)
    st.set_ready(_Engine(), _Gate())
    with in_process(st, header_timeout_s=0.5) as url:
        port = int(url.rsplit(":", 1)[1])
        # headers trickled (never finished): the connection is closed by the server
        s = socket.create_connection(("127.0.0.1", port))
        s.settimeout(5)
        s.sendall(b"GET /health HTTP/1.1\r\nHo")
        t0 = time.monotonic()
        assert s.recv(100) == b""
        assert time.monotonic() - t0 < 4
        s.close()
        # a body trickled past its deadline: 408 in OpenAI's shape
        s = socket.create_connection(("127.0.0.1", port))
        s.settimeout(5)
        s.sendall(b"POST /v1/completions HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\n"
                  b"Content-Length: 1000\r\n\r\n{")
        answer = b""
        while chunk := s.recv(4096):
            answer += chunk
        s.close()
        assert answer.startswith(b"HTTP/1.1 408") and b'"request_timeout"' in answer, answer
        # an ordinary request on a connection is unaffected
        assert httpx.get(url + "/health", timeout=5).status_code == 200


def test_connection_cap():
    st = ServerState(served_model_name="m")
    st.set_ready(_Engine(), _Gate())
    with in_process(st, max_connections=3) as url:
        port = int(url.rsplit(":", 1)[1])
        held = [socket.create_connection(("127.0.0.1", port)) for _ in range(3)]
        time.sleep(0.3)
        try:
            r = httpx.get(url + "/health", timeout=5)
            assert r.status_code == 503
        finally:
            for s in held:
                s.close()
        time.sleep(0.3)
        assert httpx.get(url + "/health", timeout=5).status_code == 200


# -- 11: the OpenAPI document matches the configured auth -----------------------------------------------

def test_openapi_declares_bearer_auth_only_with_a_key(server):
    from starlette.testclient import TestClient

    with_key = httpx.get(server.url + "/openapi.json", timeout=10).json()
    assert "bearer" in with_key["components"]["securitySchemes"]
    assert with_key["paths"]["/v1/completions"]["post"]["security"] == [{"bearer": []}]
    doc = TestClient(create_app(ServerState(served_model_name="m"))).get("/openapi.json").json()
    assert "securitySchemes" not in doc["components"]
    assert all("security" not in op for p in doc["paths"].values() for op in p.values())
    assert all("401" not in op["responses"] for p in doc["paths"].values() for op in p.values())
