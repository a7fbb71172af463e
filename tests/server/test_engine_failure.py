"""A model that fails under a running request: the client gets 503 engine_unavailable in
OpenAI's error shape (not a 500), and /health reports the engine down."""

from __future__ import annotations

import pytest

from tests.server.failing_engine import failing_client


@pytest.fixture()
def failing_server(tmp_path):
    with failing_client(tmp_path) as client:
        yield client


def test_engine_failure_under_a_request_is_503_not_500(failing_server):
    r = failing_server.post("/v1/chat/completions",
                            json={"messages": [{"role": "user", "content": "hi"}], "max_tokens": 4})
    assert r.status_code == 503, r.text
    err = r.json()["error"]
    assert err["code"] == "engine_unavailable"
    assert "illegal memory access" in err["message"]
