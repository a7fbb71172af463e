"""The Responses API when the engine fails under a running request (fault injected in the model's
forward): a full answer is 503 engine_unavailable in OpenAI's error shape; a stream whose status
line went out ends with an `error` event; a background response ends `failed` with its error."""

from __future__ import annotations

import json
import time

import pytest
from openai.types.responses import Response, ResponseErrorEvent

from tests.server.failing_engine import failing_client


@pytest.fixture()
def failing(tmp_path):
    with failing_client(tmp_path) as client:
        yield client


def test_full_answer_is_503(failing):
    r = failing.post("/v1/responses", json={"input": "hi", "max_output_tokens": 4})
    assert r.status_code == 503, r.text
    assert r.json()["error"]["code"] == "engine_unavailable"


def test_stream_ends_with_an_error_event(failing):
    with failing.stream("POST", "/v1/responses", json={"input": "hi", "max_output_tokens": 4, "stream": True}) as r:
        assert r.status_code == 200
        data = [json.loads(line[6:]) for line in r.iter_lines() if line.startswith("data: ")]
    assert [d["type"] for d in data[:2]] == ["response.created", "response.in_progress"]
    err = ResponseErrorEvent.model_validate(data[-1])
    assert "illegal memory access" in err.message and err.sequence_number == len(data) - 1
    assert err.code == "engine_unavailable"


def test_background_response_fails(failing):
    r = failing.post("/v1/responses", json={"input": "hi", "max_output_tokens": 4, "background": True})
    assert r.status_code == 200 and r.json()["status"] == "queued"
    rid = r.json()["id"]
    deadline = time.monotonic() + 20
    while time.monotonic() < deadline:
        body = failing.get(f"/v1/responses/{rid}").json()
        if body["status"] not in ("queued", "in_progress"):
            break
        time.sleep(0.05)
    assert body["status"] == "failed"
    assert "illegal memory access" in body["error"]["message"]
    assert Response.model_validate(body).error.code == "server_error"
