"""kv_transfer_params (vLLM's disaggregated-prefill field, g906/server/kv_transfer.py): forwarded
prompt_token_ids are the prompt, verbatim; bad ones are a 400 naming the field; other keys are
accepted and named as ignored; answers carry kv_transfer_params: null."""

from __future__ import annotations

import httpx
import openai
import pytest

from tests.server.conftest import API_KEY, MAX_MODEL_LEN

MSG = [{"role": "user", "content": "Hello, how are you today?"}]
OTHER = [{"role": "user", "content": "unrelated decode-side text"}]
VOCAB = 512          # builtin:tiny-qwen35
PARAM = "kv_transfer_params.prompt_token_ids"


@pytest.fixture(scope="module")
def client(server):
    return openai.OpenAI(base_url=server.v1, api_key=API_KEY, max_retries=0, timeout=120)


def post(server, path, body):
    return httpx.post(server.v1 + path, json=body, headers={"Authorization": f"Bearer {API_KEY}"}, timeout=120)


def test_chat_uses_the_forwarded_ids_verbatim(client):
    base = client.chat.completions.create(model="tiny", messages=MSG, max_tokens=6, temperature=0,
                                          extra_body={"return_token_ids": True, "ignore_eos": True})
    ids = base.prompt_token_ids
    again = client.chat.completions.create(
        model="tiny", messages=OTHER, max_tokens=6, temperature=0,
        extra_body={"kv_transfer_params": {"prompt_token_ids": ids}, "return_token_ids": True, "ignore_eos": True})
    assert again.prompt_token_ids == ids
    assert again.usage.prompt_tokens == len(ids)
    # the same prompt, greedy: the same tokens as the request that rendered it
    assert again.choices[0].token_ids == base.choices[0].token_ids
    assert again.model_extra["kv_transfer_params"] is None
    # streamed: prompt_token_ids on the first chunk
    chunks = list(client.chat.completions.create(
        model="tiny", messages=OTHER, max_tokens=6, temperature=0, stream=True,
        extra_body={"kv_transfer_params": {"prompt_token_ids": ids}, "return_token_ids": True, "ignore_eos": True}))
    assert chunks[0].model_extra["prompt_token_ids"] == ids
    got = [t for ch in chunks if ch.choices for t in (ch.choices[0].model_extra.get("token_ids") or [])]
    assert got == base.choices[0].token_ids


def test_completions_use_the_forwarded_ids_except_with_echo(client, server):
    ids = client.completions.create(model="tiny", prompt="Once upon a time", max_tokens=1,
                                    extra_body={"return_token_ids": True}).choices[0].prompt_token_ids
    r = client.completions.create(model="tiny", prompt="something else", max_tokens=2,
                                  extra_body={"kv_transfer_params": {"prompt_token_ids": ids}, "return_token_ids": True})
    assert r.choices[0].prompt_token_ids == ids
    assert r.model_extra["kv_transfer_params"] is None
    # echo shows the prompt's text: the request's own prompt is rendered, as vLLM does
    r = client.completions.create(model="tiny", prompt="something else", max_tokens=1, echo=True,
                                  extra_body={"kv_transfer_params": {"prompt_token_ids": ids}})
    assert r.choices[0].text.startswith("something else")
    r = post(server, "/completions", {"prompt": ["a", "b"], "max_tokens": 1,
                                      "kv_transfer_params": {"prompt_token_ids": ids}})
    assert r.status_code == 400 and r.json()["error"]["param"] == PARAM, r.text


@pytest.mark.parametrize("ids,what", [
    ([], "non-empty list"), ("12", "non-empty list"), ([1, True], "non-empty list"), ([1, -2], "non-empty list"),
    ([1, 2.5], "non-empty list"), ([1, VOCAB], "out of vocabulary"), ([1] * MAX_MODEL_LEN, "context"),
])
@pytest.mark.parametrize("path,body", [("/chat/completions", {"messages": MSG}), ("/completions", {"prompt": "x"})])
def test_bad_forwarded_ids_are_a_400_naming_the_field(server, ids, what, path, body):
    r = post(server, path, {**body, "max_tokens": 1, "kv_transfer_params": {"prompt_token_ids": ids}})
    assert r.status_code == 400, r.text
    err = r.json()["error"]
    assert err["param"] == PARAM and what in err["message"], err


def test_other_keys_are_accepted_and_named_ignored(server):
    r = post(server, "/chat/completions", {"messages": MSG, "max_tokens": 1,
                                           "kv_transfer_params": {"do_remote_prefill": True, "remote_host": "h"}})
    assert r.status_code == 200, r.text
    assert r.headers["x-g906-ignored-fields"] == "kv_transfer_params.do_remote_prefill, kv_transfer_params.remote_host"
    assert r.json()["kv_transfer_params"] is None
    r = post(server, "/chat/completions", {"messages": MSG, "max_tokens": 1, "kv_transfer_params": [1]})
    assert r.status_code == 400 and r.json()["error"]["param"] == "kv_transfer_params", r.text


def test_the_batch_endpoint_refuses_forwarded_ids(server):
    r = post(server, "/chat/completions/batch", {"messages": [MSG, OTHER], "max_tokens": 1,
                                                 "kv_transfer_params": {"prompt_token_ids": [1, 2, 3]}})
    assert r.status_code == 400 and r.json()["error"]["param"] == PARAM, r.text
