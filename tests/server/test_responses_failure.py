"""The Responses API when the engine fails under a running request (fault injected in the model's
forward): a full answer is 503 engine_unavailable in OpenAI's error shape; a stream whose status
line went out ends with an `error` event; a background response ends `failed` with its error."""

from __future__ import annotations

import json
import time

import pytest
from starlette.testclient import TestClient

from g906.engine.async_engine import AsyncEngine
from g906.engine.llm import PromptBuilder
from g906.server.app import ServerState, create_app
from g906.serving import build_engine, load_and_resolve
from openai.types.responses import Response, ResponseErrorEvent


@pytest.fixture()
def failing(tmp_path):
    recipe = tmp_path / "r.toml"
    recipe.write_text('[model]\nsource = "builtin:tiny-qwen35"\n[engine.embedded]\ncpu_kv_cache_gib = 0.01\n')
    loaded, engine = build_engine(load_and_resolve(recipe), progress=False)
    aeng = AsyncEngine(engine)
    aeng.start()
    state = ServerState(served_model_name="tiny-qwen35")
    state.set_ready(aeng, PromptBuilder(loaded.tokenizer, loaded.chat_template))

    def broken_forward(*args, **kwargs):   # fault injection: the device fails mid-request
        raise RuntimeError("HIP error: an illegal memory access was encountered")

    loaded.model.forward = broken_forward
    with TestClient(create_app(state), raise_server_exceptions=False) as client:
        yield client
    aeng.shutdown(drain_timeout=1.0)


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
