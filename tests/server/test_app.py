"""The app before the engine is ready, and the protocol models on their own."""

from __future__ import annotations

from starlette.testclient import TestClient

from g906.server import protocol as P
from g906.server.app import ServerState, create_app


def test_health_is_503_until_ready_and_requests_wait_for_it():
    st = ServerState(served_model_name="m")
    c = TestClient(create_app(st))
    r = c.get("/health")
    assert r.status_code == 503 and r.json()["status"] == "loading"
    r = c.post("/v1/chat/completions", json={"messages": [{"role": "user", "content": "x"}]})
    assert r.status_code == 503 and r.json()["error"]["code"] == "not_ready"
    assert c.get("/metrics").status_code == 200
    st.set_failed("out of memory")
    r = c.get("/health")
    assert r.status_code == 503 and r.json() == {"status": "failed", "detail": "out of memory"}


def test_auth_comes_before_readiness():
    c = TestClient(create_app(ServerState(served_model_name="m", api_key="k")))
    assert c.post("/v1/completions", json={"prompt": "x"}).status_code == 401
    assert c.post("/v1/completions", json={"prompt": "x"}, headers={"Authorization": "Bearer k"}).status_code == 503


def test_ignored_fields_are_named_with_their_path():
    req = P.ChatCompletionRequest.model_validate({
        "messages": [{"role": "user", "content": "x", "refusal": None}, {"role": "user", "content": "y", "refusal": 1}],
        "user": "u", "stream_options": {"include_usage": True, "extra": 1}, "max_tokens": 3,
    })
    assert P.ignored_fields(req) == ["messages[].refusal", "stream_options.extra", "user"]
    assert P.ignored_fields(P.CompletionRequest.model_validate({"prompt": "x"})) == []


def test_openapi_is_generated_from_the_models():
    from g906.server.openapi import openapi_document

    doc = openapi_document()
    req = doc["components"]["schemas"]["CompletionRequest"]
    assert req["properties"]["max_tokens"]["anyOf"][0]["minimum"] == 1
    ref = doc["paths"]["/v1/completions"]["post"]["requestBody"]["content"]["application/json"]["schema"]["$ref"]
    assert ref == "#/components/schemas/CompletionRequest"
