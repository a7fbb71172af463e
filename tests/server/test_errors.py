"""Every error status, in OpenAI's JSON shape, against the session server."""

from __future__ import annotations

import httpx
import pytest

from tests.server.conftest import API_KEY, MAX_BODY, MAX_MODEL_LEN

AUTH = {"Authorization": f"Bearer {API_KEY}"}
MSG = [{"role": "user", "content": "hi"}]


def post(server, path, body=None, *, headers=AUTH, content=None):
    return httpx.post(server.v1 + path, json=body, content=content, headers=headers, timeout=60)


def assert_error(r, status, *, param=None, code=None):
    assert r.status_code == status, r.text
    body = r.json()
    err = body["error"]
    assert set(err) == {"message", "type", "param", "code"}
    assert isinstance(err["message"], str) and err["message"]
    if param is not None:
        assert err["param"] == param, err
    if code is not None:
        assert err["code"] == code, err
    return err


def test_401_missing_or_wrong_key(server, client):
    openai = pytest.importorskip("openai")
    assert_error(post(server, "/chat/completions", {"messages": MSG}, headers={}), 401, code="invalid_api_key")
    assert_error(post(server, "/completions", {"prompt": "x"}, headers={"Authorization": "Bearer nope"}), 401)
    assert_error(httpx.get(server.v1 + "/models"), 401)
    bad = openai.OpenAI(base_url=server.v1, api_key="wrong", max_retries=0)
    with pytest.raises(openai.AuthenticationError):
        bad.models.list()
    # health, metrics, version and the API document stay open
    for path in ("/health", "/metrics", "/version", "/openapi.json"):
        assert httpx.get(server.url + path).status_code == 200


def test_400_unknown_model(server, client):
    openai = pytest.importorskip("openai")
    err = assert_error(post(server, "/chat/completions", {"model": "gpt-4", "messages": MSG}), 400,
                       param="model", code="model_not_found")
    assert "gpt-4" in err["message"]
    with pytest.raises(openai.BadRequestError):
        client.completions.create(model="nope", prompt="x", max_tokens=1)


def test_400_prompt_too_long(server):
    long = "word " * (MAX_MODEL_LEN * 2)
    err = assert_error(post(server, "/completions", {"prompt": long, "max_tokens": 1}), 400,
                       code="context_length_exceeded")
    assert str(MAX_MODEL_LEN) in err["message"]
    assert_error(post(server, "/chat/completions", {"messages": [{"role": "user", "content": long}]}), 400,
                 code="context_length_exceeded")
    # prompt + max_tokens beyond the context
    assert_error(post(server, "/completions", {"prompt": "hi", "max_tokens": MAX_MODEL_LEN}), 400,
                 param="max_tokens", code="context_length_exceeded")
    assert_error(post(server, "/completions", {"prompt": [5] * MAX_MODEL_LEN, "max_tokens": 1}), 400)


@pytest.mark.parametrize("body,param", [
    ({"messages": MSG, "temperature": "hot"}, "temperature"),
    ({"messages": MSG, "temperature": 2.5}, "temperature"),
    ({"messages": MSG, "top_p": 0}, "top_p"),
    ({"messages": MSG, "top_k": -5}, "top_k"),
    ({"messages": MSG, "min_p": 1.5}, "min_p"),
    ({"messages": MSG, "n": 0}, "n"),
    ({"messages": MSG, "n": 1000}, "n"),
    ({"messages": MSG, "max_tokens": 0}, "max_tokens"),
    ({"messages": MSG, "max_completion_tokens": -3}, "max_completion_tokens"),
    ({"messages": MSG, "logprobs": True, "top_logprobs": 50}, "top_logprobs"),
    ({"messages": MSG, "presence_penalty": 9}, "presence_penalty"),
    ({"messages": MSG, "repetition_penalty": 0}, "repetition_penalty"),
    ({"messages": MSG, "stop": [""]}, "stop"),
    ({"messages": MSG, "stop": ["a"] * 40}, "stop"),
    ({"messages": MSG, "seed": "abc"}, "seed"),
    ({"messages": MSG, "stream": "yes"}, "stream"),
    ({"messages": []}, "messages"),
    ({"messages": "hello"}, "messages"),
    ({"messages": [{"role": 7, "content": "x"}]}, None),
    ({"messages": [{"content": "x"}]}, None),
    ({}, "messages"),
    ({"messages": MSG, "response_format": {"type": "json_schema"}}, "response_format.json_schema"),
    ({"messages": [{"role": "user", "content": [{"type": "image_url", "image_url": {"url": "x"}}]}]}, None),
    ({"messages": MSG, "chat_template_kwargs": "nope"}, "chat_template_kwargs"),
])
def test_400_bad_chat_parameters(server, body, param):
    assert_error(post(server, "/chat/completions", body), 400, param=param)


@pytest.mark.parametrize("body,param", [
    ({"prompt": 5}, None),
    ({"prompt": []}, "prompt"),
    ({"prompt": [[]]}, "prompt"),
    ({"prompt": [-1, 2]}, "prompt"),
    ({"prompt": [100000]}, None),
    ({"prompt": "x", "logprobs": 99}, "logprobs"),
    ({"prompt": "x", "max_tokens": "ten"}, "max_tokens"),
    ({"prompt": "x", "suffix": "y"}, "suffix"),
    ({"prompt": "x", "echo": 3}, "echo"),
])
def test_400_bad_completion_parameters(server, body, param):
    assert_error(post(server, "/completions", body), 400, param=param)


def test_400_not_json(server):
    assert_error(post(server, "/chat/completions", content=b"{not json"), 400, code="invalid_json")
    assert_error(post(server, "/chat/completions", content=b"[1, 2]"), 400)
    assert_error(post(server, "/chat/completions", content=b""), 400)
    assert_error(post(server, "/chat/completions", content=b"\xff\xfe"), 400)


def test_413_body_too_large(server):
    big = {"prompt": "x" * (MAX_BODY + 10), "max_tokens": 1}
    assert_error(post(server, "/completions", big), 413, code="request_too_large")

    def chunks():  # no Content-Length: the limit holds while streaming the body in
        for _ in range(MAX_BODY // 65536 + 2):
            yield b" " * 65536

    r = httpx.post(server.v1 + "/completions", content=chunks(), headers={**AUTH, "Content-Type": "application/json"},
                   timeout=60)
    assert_error(r, 413)


def test_404_and_405_are_json(server):
    assert_error(httpx.get(server.url + "/v1/nothing"), 404)
    assert_error(httpx.get(server.v1 + "/chat/completions", headers=AUTH), 405)
    assert_error(httpx.get(server.v1 + "/models/other", headers=AUTH), 404, code="model_not_found")
    assert httpx.get(server.v1 + "/models/tiny", headers=AUTH).json()["id"] == "tiny"
