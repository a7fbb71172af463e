"""A model that fails under a running request: the client gets 503 engine_unavailable in
OpenAI's error shape (not a 500), and /health reports the engine down."""

from __future__ import annotations

import pytest
from starlette.testclient import TestClient

from g906.serving import build_engine, load_and_resolve
from g906.engine.async_engine import AsyncEngine
from g906.engine.llm import PromptBuilder
from g906.server.app import ServerState, create_app


@pytest.fixture()
def failing_server(tmp_path):
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
    yield TestClient(create_app(state), raise_server_exceptions=False)
    aeng.shutdown(drain_timeout=1.0)


def test_engine_failure_under_a_request_is_503_not_500(failing_server):
    r = failing_server.post("/v1/chat/completions",
                            json={"messages": [{"role": "user", "content": "hi"}], "max_tokens": 4})
    assert r.status_code == 503, r.text
    err = r.json()["error"]
    assert err["code"] == "engine_unavailable"
    assert "illegal memory access" in err["message"]
