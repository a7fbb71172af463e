"""vLLM's extensions and rules of the OpenAI API (g906/server/vllm_extras.py), end to end through
the official openai client against the session's `g906 up` (tests/server/conftest.py)."""

from __future__ import annotations

import httpx
import openai
import pytest

from tests.server.conftest import API_KEY

MSG = [{"role": "user", "content": "Tell me a story about a cat."}]
NOEOS = {"ignore_eos": True}
VOCAB = 512          # builtin:tiny-qwen35


def post(server, path, body):
    return httpx.post(server.v1 + path, json=body, headers={"Authorization": f"Bearer {API_KEY}"}, timeout=120)


# -- stream_options --------------------------------------------------------------------------------

@pytest.mark.parametrize("path,body", [
    ("/chat/completions", {"messages": MSG}),
    ("/completions", {"prompt": "hi"}),
])
def test_stream_options_without_stream_is_400(server, path, body):
    r = post(server, path, {**body, "max_tokens": 2, "stream_options": {"include_usage": True}})
    assert r.status_code == 400, r.text
    assert r.json()["error"]["param"] == "stream_options"
    r = post(server, path, {**body, "max_tokens": 2, "stream": False})
    assert r.status_code == 200, r.text


def test_continuous_usage_stats_needs_include_usage(client):
    chunks = list(client.chat.completions.create(
        model="tiny", messages=MSG, max_tokens=4, stream=True, extra_body=NOEOS,
        stream_options={"include_usage": False, "continuous_usage_stats": True}))
    assert chunks and all(c.usage is None for c in chunks)
    chunks = list(client.completions.create(
        model="tiny", prompt="hello", max_tokens=4, stream=True, extra_body=NOEOS,
        stream_options={"include_usage": True, "continuous_usage_stats": True}))
    assert all(c.usage is not None for c in chunks)
    assert chunks[-1].choices == [] and chunks[-1].usage.completion_tokens == 4


# -- validation ------------------------------------------------------------------------------------

def test_seed_is_a_signed_64_bit_integer(server):
    r = post(server, "/chat/completions", {"messages": MSG, "max_tokens": 1, "seed": 2**63})
    assert r.status_code == 400 and r.json()["error"]["param"] == "seed", r.text
    r = post(server, "/completions", {"prompt": "x", "max_tokens": 1, "seed": 2**63 - 1})
    assert r.status_code == 200, r.text
    r = post(server, "/completions", {"prompt": "x", "max_tokens": 1, "seed": -(2**63)})
    assert r.status_code == 200, r.text


def test_top_logprobs_minus_one_is_the_whole_vocabulary(client):
    r = client.chat.completions.create(model="tiny", messages=MSG, max_tokens=2, temperature=0, logprobs=True,
                                       top_logprobs=-1, extra_body=NOEOS)
    for t in r.choices[0].logprobs.content:
        assert len(t.top_logprobs) == VOCAB
        assert t.top_logprobs[0].logprob == pytest.approx(t.logprob)
    # as token ids: one key per vocabulary entry (texts of unused ids may coincide)
    c = client.completions.create(model="tiny", prompt="hello", max_tokens=2, temperature=0, logprobs=-1,
                                  extra_body={**NOEOS, "return_tokens_as_token_ids": True})
    assert all(len(d) == VOCAB for d in c.choices[0].logprobs.top_logprobs)


def test_custom_message_roles_reach_the_chat_template(server):
    from g906.server import protocol as P

    body = {"messages": [{"role": "narrator", "content": "Once upon a time"}, *MSG], "max_tokens": 2}
    assert P.ChatCompletionRequest.model_validate(body).messages[0].role == "narrator"
    # the protocol accepts any role (as vLLM does); this template refuses unknown ones itself
    r = post(server, "/chat/completions", body)
    assert r.status_code == 400, r.text
    assert "unknown message role: narrator" in r.json()["error"]["message"]
    r = post(server, "/chat/completions", {"messages": [{"role": "", "content": "x"}], "max_tokens": 2})
    assert r.status_code == 400, r.text


def test_logit_bias_is_applied(client):
    greedy = client.completions.create(model="tiny", prompt="hello", max_tokens=6, temperature=0,
                                       extra_body={**NOEOS, "return_token_ids": True})
    ids = greedy.choices[0].model_extra["token_ids"]
    # +100 on one token: every greedy step picks it
    forced = client.completions.create(model="tiny", prompt="hello", max_tokens=6, temperature=0,
                                       logit_bias={"77": 100}, extra_body={**NOEOS, "return_token_ids": True})
    assert forced.choices[0].model_extra["token_ids"] == [77] * 6
    # -100 on each greedy choice: none of them comes first any more; sampled rows too
    banned = client.completions.create(model="tiny", prompt="hello", max_tokens=6, temperature=0,
                                       logit_bias={str(ids[0]): -100},
                                       extra_body={**NOEOS, "return_token_ids": True})
    assert banned.choices[0].model_extra["token_ids"][0] != ids[0]
    sampled = client.chat.completions.create(model="tiny", messages=MSG, max_tokens=8, temperature=1.0, seed=3,
                                             logit_bias={"200": 100.0, "201": 250},  # clamped to 100
                                             extra_body={**NOEOS, "return_token_ids": True})
    assert set(sampled.choices[0].model_extra["token_ids"]) <= {200, 201}


@pytest.mark.parametrize("bias,what", [({"512": 1}, "outside the vocabulary"), ({"-1": 1}, "outside"),
                                       ({"cat": 1}, "not a token id")])
def test_logit_bias_keys_are_checked(server, bias, what):
    for path, body in (("/chat/completions", {"messages": MSG}), ("/completions", {"prompt": "x"})):
        r = post(server, path, {**body, "max_tokens": 1, "logit_bias": bias})
        assert r.status_code == 400, r.text
        err = r.json()["error"]
        assert err["param"] == "logit_bias" and what in err["message"]


# -- logprobs: 0, token ids ------------------------------------------------------------------------

def test_completion_logprobs_zero_gives_the_sampled_token(client):
    c = client.completions.create(model="tiny", prompt="hello", max_tokens=3, temperature=0, logprobs=0,
                                  extra_body=NOEOS)
    lp = c.choices[0].logprobs
    assert [list(d) for d in lp.top_logprobs] == [[t] for t in lp.tokens]
    assert [d[t] for d, t in zip(lp.top_logprobs, lp.tokens)] == lp.token_logprobs


def test_return_token_ids_full_and_streamed(client):
    kw = dict(model="tiny", max_tokens=5, temperature=0, extra_body={**NOEOS, "return_token_ids": True})
    full = client.chat.completions.create(messages=MSG, **kw)
    prompt_ids = full.model_extra["prompt_token_ids"]
    ids = full.choices[0].model_extra["token_ids"]
    assert len(prompt_ids) == full.usage.prompt_tokens and len(ids) == 5
    chunks = list(client.chat.completions.create(messages=MSG, stream=True, **kw))
    assert chunks[0].model_extra["prompt_token_ids"] == prompt_ids
    assert [t for c in chunks for ch in c.choices for t in (ch.model_extra.get("token_ids") or [])] == ids
    # completions: per choice, the choice's own prompt
    c = client.completions.create(prompt=[[5, 6, 7], [9, 10]], **kw)
    assert [ch.model_extra["prompt_token_ids"] for ch in c.choices] == [[5, 6, 7], [9, 10]]
    assert all(len(ch.model_extra["token_ids"]) == 5 for ch in c.choices)
    chunks = list(client.completions.create(prompt=[5, 6, 7], stream=True, **kw))
    assert chunks[0].choices[0].model_extra["prompt_token_ids"] == [5, 6, 7]
    streamed = [t for ch in chunks for c in ch.choices for t in (c.model_extra.get("token_ids") or [])]
    assert streamed == c.choices[0].model_extra["token_ids"]
    plain = client.completions.create(model="tiny", prompt="hi", max_tokens=2)
    assert plain.choices[0].model_extra.get("token_ids") is None


def test_return_tokens_as_token_ids(client):
    body = {**NOEOS, "return_token_ids": True, "return_tokens_as_token_ids": True}
    c = client.completions.create(model="tiny", prompt="hello", max_tokens=4, temperature=0, logprobs=2,
                                  extra_body=body)
    ids = c.choices[0].model_extra["token_ids"]
    assert c.choices[0].logprobs.tokens == [f"token_id:{t}" for t in ids]
    assert all(all(k.startswith("token_id:") for k in d) for d in c.choices[0].logprobs.top_logprobs)
    r = client.chat.completions.create(model="tiny", messages=MSG, max_tokens=3, temperature=0, logprobs=True,
                                       top_logprobs=1, extra_body=body)
    assert [t.token for t in r.choices[0].logprobs.content] == \
        [f"token_id:{t}" for t in r.choices[0].model_extra["token_ids"]]


@pytest.mark.parametrize("side,keep", [(None, slice(-4, None)), ("left", slice(-4, None)), ("right", slice(0, 4))])
def test_truncate_prompt_tokens(client, side, keep):
    prompt = list(range(20, 30))
    extra = {**NOEOS, "return_token_ids": True, "truncate_prompt_tokens": 4}
    if side:
        extra["truncation_side"] = side
    c = client.completions.create(model="tiny", prompt=prompt, max_tokens=2, extra_body=extra)
    assert c.usage.prompt_tokens == 4 and c.choices[0].model_extra["prompt_token_ids"] == prompt[keep]
    r = client.chat.completions.create(model="tiny", messages=MSG, max_tokens=2, extra_body=extra)
    assert r.usage.prompt_tokens == 4


def test_truncate_prompt_tokens_bounds(server):
    for k in (0, 10**6, -2):
        r = post(server, "/completions", {"prompt": "x", "max_tokens": 1, "truncate_prompt_tokens": k})
        assert r.status_code == 400 and r.json()["error"]["param"] == "truncate_prompt_tokens", r.text


# -- reasoning ------------------------------------------------------------------------------------

def test_include_reasoning_false_and_reasoning_tokens(client):
    # the tiny model's template opens <think>: a short ignore_eos answer is all reasoning
    full = client.chat.completions.create(model="tiny", messages=MSG, max_tokens=6, temperature=0, extra_body=NOEOS)
    assert full.model_extra is not None
    assert full.usage.completion_tokens_details.reasoning_tokens == 6
    assert full.choices[0].message.model_extra.get("reasoning_content")
    off = client.chat.completions.create(model="tiny", messages=MSG, max_tokens=6, temperature=0,
                                         extra_body={**NOEOS, "include_reasoning": False})
    assert off.choices[0].message.model_extra.get("reasoning_content") is None
    assert off.usage.completion_tokens_details.reasoning_tokens == 6
    chunks = list(client.chat.completions.create(model="tiny", messages=MSG, max_tokens=6, temperature=0,
                                                 stream=True, stream_options={"include_usage": True},
                                                 extra_body={**NOEOS, "include_reasoning": False}))
    assert not any(ch.delta.model_extra.get("reasoning_content") for c in chunks for ch in c.choices)
    assert chunks[-1].usage.completion_tokens_details.reasoning_tokens == 6
    no_think = client.chat.completions.create(model="tiny", messages=MSG, max_tokens=4, temperature=0,
                                              extra_body={**NOEOS, "chat_template_kwargs": {"enable_thinking": False}})
    assert no_think.usage.completion_tokens_details.reasoning_tokens == 0


def test_openai_client_still_parses(client):
    assert isinstance(client.completions.create(model="tiny", prompt="hi", max_tokens=1),
                      openai.types.Completion)


def test_thinking_token_budget_forces_the_end_of_thinking(client, server):
    kw = dict(model="tiny", messages=MSG, max_tokens=16, temperature=0)
    free = client.chat.completions.create(**kw, extra_body=NOEOS)
    assert free.usage.completion_tokens_details.reasoning_tokens == 16    # never closes by itself
    capped = client.chat.completions.create(**kw, extra_body={**NOEOS, "thinking_token_budget": 3})
    spent = capped.usage.completion_tokens_details.reasoning_tokens
    assert 4 <= spent <= 12           # 3 thinking tokens + the ids of </think>
    msg = capped.choices[0].message
    assert msg.model_extra["reasoning_content"] and msg.content
    chunks = list(client.chat.completions.create(**kw, stream=True, stream_options={"include_usage": True},
                                                 extra_body={**NOEOS, "thinking_token_budget": 3}))
    assert chunks[-1].usage.completion_tokens_details.reasoning_tokens == spent
    r = post(server, "/chat/completions", {"messages": MSG, "max_tokens": 2, "thinking_token_budget": -1})
    assert r.status_code == 400 and r.json()["error"]["param"] == "thinking_token_budget"


def test_default_max_tokens_from_the_recipe(tmp_path_factory):
    from tests.server.conftest import MAIN_RECIPE, openai_client, serving

    recipe = MAIN_RECIPE.replace("[limits]\n", "[limits]\ndefault_max_tokens = 5\n")
    gen = serving(tmp_path_factory.mktemp("g906-default-max"), recipe)
    server = next(gen)
    try:
        c = openai_client(server)
        r = c.chat.completions.create(model="tiny", messages=MSG, extra_body=NOEOS)
        assert r.usage.completion_tokens == 5 and r.choices[0].finish_reason == "length"
        r = c.chat.completions.create(model="tiny", messages=MSG, max_tokens=7, extra_body=NOEOS)
        assert r.usage.completion_tokens == 7        # an explicit max_tokens wins (vLLM would cap it at 5)
    finally:
        next(gen, None)


# -- prompt logprobs, echo ------------------------------------------------------------------------

def test_prompt_logprobs_chat_and_completions(client, server):
    r = client.chat.completions.create(model="tiny", messages=MSG, max_tokens=2,
                                       extra_body={"prompt_logprobs": 2, "return_token_ids": True})
    plp, ids = r.model_extra["prompt_logprobs"], r.model_extra["prompt_token_ids"]
    assert len(plp) == len(ids) == r.usage.prompt_tokens and plp[0] is None
    for pos, d in zip(ids[1:], plp[1:]):
        assert str(pos) in d and 1 <= len(d) <= 3
        assert all(set(e) == {"logprob", "rank", "decoded_token"} for e in d.values())
        assert all(isinstance(e["rank"], int) and e["rank"] >= 1 for e in d.values())
        assert max(d.values(), key=lambda e: e["logprob"])["rank"] == 1
    c = client.completions.create(model="tiny", prompt=[[5, 6, 7], [9, 10]], max_tokens=1,
                                  extra_body={"prompt_logprobs": 0})
    got = [ch.model_extra["prompt_logprobs"] for ch in c.choices]
    assert [len(g) for g in got] == [3, 2] and got[0][0] is None and list(got[0][1]) == ["6"]
    assert client.completions.create(model="tiny", prompt="hi", max_tokens=1).choices[0].model_extra.get(
        "prompt_logprobs") is None
    r = post(server, "/completions", {"prompt": "x", "max_tokens": 1, "stream": True, "prompt_logprobs": 1})
    assert r.status_code == 400 and r.json()["error"]["param"] == "prompt_logprobs"


def test_echo_with_logprobs_covers_the_prompt(client):
    prompt = [5, 6, 7, 8]
    kw = dict(model="tiny", prompt=prompt, max_tokens=3, temperature=0, logprobs=1, echo=True, extra_body=NOEOS)
    full = client.completions.create(**kw)
    lp = full.choices[0].logprobs
    assert len(lp.tokens) == 4 + 3
    assert lp.token_logprobs[0] is None and lp.top_logprobs[0] is None
    assert all(isinstance(x, float) for x in lp.token_logprobs[1:])
    ref = client.completions.create(model="tiny", prompt=prompt, max_tokens=1, extra_body={"prompt_logprobs": 1})
    ref_lp = ref.choices[0].model_extra["prompt_logprobs"]
    for j in (1, 2, 3):
        assert lp.token_logprobs[j] == pytest.approx(ref_lp[j][str(prompt[j])]["logprob"], abs=1e-4)
        assert lp.tokens[j] in lp.top_logprobs[j]
    assert lp.text_offset == sorted(lp.text_offset) and lp.text_offset[0] == 0
    chunks = list(client.completions.create(stream=True, **kw))
    tokens = [t for ch in chunks for c in ch.choices if c.logprobs for t in c.logprobs.tokens]
    lps = [t for ch in chunks for c in ch.choices if c.logprobs for t in c.logprobs.token_logprobs]
    assert tokens == lp.tokens and lps[0] is None and lps[1:] == pytest.approx(lp.token_logprobs[1:])
    assert "".join(c.text for ch in chunks for c in ch.choices) == full.choices[0].text


# -- endpoints ------------------------------------------------------------------------------------

def test_load_tokenizer_info_and_invocations(server):
    auth = {"Authorization": f"Bearer {API_KEY}"}
    r = httpx.get(server.url + "/load", headers=auth)
    assert r.status_code == 200 and isinstance(r.json()["server_load"], int)
    assert httpx.get(server.url + "/load").status_code == 401
    info = httpx.get(server.url + "/tokenizer_info", headers=auth).json()
    assert info["tokenizer_class"] and info["model_max_length"] == 512 and info["eos_token_ids"]
    assert "{%" in info["chat_template"]
    chat = httpx.post(server.url + "/invocations", headers=auth, timeout=120,
                      json={"messages": MSG, "max_tokens": 2, "ignore_eos": True})
    assert chat.status_code == 200 and chat.json()["object"] == "chat.completion"
    assert chat.json()["usage"]["completion_tokens"] == 2
    cmpl = httpx.post(server.url + "/invocations", headers=auth, timeout=120,
                      json={"prompt": "hi", "max_tokens": 2, "stream": True})
    assert cmpl.status_code == 200 and cmpl.text.rstrip().endswith("data: [DONE]") and "text_completion" in cmpl.text
    bad = httpx.post(server.url + "/invocations", headers=auth, json={"input": "x"})
    assert bad.status_code == 400 and "messages" in bad.json()["error"]["message"]
    bad = httpx.post(server.url + "/invocations", headers=auth, json={"messages": MSG, "n": 0})
    assert bad.status_code == 400 and bad.json()["error"]["param"] == "n"
    assert httpx.post(server.url + "/invocations", json={"prompt": "x"}).status_code == 401


def test_chat_completions_batch(server):
    auth = {"Authorization": f"Bearer {API_KEY}"}
    convs = [[{"role": "user", "content": "Say alpha"}], [{"role": "user", "content": "Say beta, please"}]]
    body = {"messages": convs, "max_tokens": 3, "temperature": 0, "ignore_eos": True, "logprobs": True,
            "return_token_ids": True}
    r = httpx.post(server.v1 + "/chat/completions/batch", headers=auth, json=body, timeout=120)
    assert r.status_code == 200, r.text
    data = r.json()
    assert data["object"] == "chat.completion" and [c["index"] for c in data["choices"]] == [0, 1]
    assert data["usage"]["completion_tokens"] == 6 and all(c["logprobs"]["content"] for c in data["choices"])
    # each choice is what the conversation alone gives
    for k, conv in enumerate(convs):
        one = post(server, "/chat/completions", {**body, "messages": conv}).json()
        assert one["choices"][0]["token_ids"] == data["choices"][k]["token_ids"]
    for bad, param in (({**body, "stream": True}, "stream"), ({**body, "messages": [[]]}, "messages.0"),
                       ({**body, "messages": [[{"role": "user", "content": "x" * 3000}]]}, "messages")):
        r = httpx.post(server.v1 + "/chat/completions/batch", headers=auth, json=bad, timeout=60)
        assert r.status_code == 400 and r.json()["error"]["param"] == param, r.text


def test_logprob_token_ids(client, server):
    r = client.chat.completions.create(model="tiny", messages=MSG, max_tokens=2, temperature=0, logprobs=True,
                                       top_logprobs=5, extra_body={"logprob_token_ids": [100, 300, 100],
                                                                   "return_tokens_as_token_ids": True})
    for t in r.choices[0].logprobs.content:
        assert {x.token for x in t.top_logprobs} == {"token_id:100", "token_id:300", t.token}
        assert t.top_logprobs[0].token == t.token
    full = client.chat.completions.create(model="tiny", messages=MSG, max_tokens=1, temperature=0, logprobs=True,
                                          top_logprobs=-1, extra_body={"return_tokens_as_token_ids": True})
    every = {x.token: x.logprob for x in full.choices[0].logprobs.content[0].top_logprobs}
    named = {x.token: x.logprob for x in r.choices[0].logprobs.content[0].top_logprobs}
    assert named["token_id:300"] == pytest.approx(every["token_id:300"], abs=1e-5)
    bad = post(server, "/chat/completions", {"messages": MSG, "max_tokens": 1, "logprobs": True,
                                             "logprob_token_ids": [VOCAB]})
    assert bad.status_code == 400 and bad.json()["error"]["param"] == "logprob_token_ids"


def test_tool_calls_null_without_tool_calls(server):
    r = post(server, "/chat/completions", {"messages": MSG, "max_tokens": 1})
    assert r.status_code == 200 and r.json()["choices"][0]["message"]["tool_calls"] is None


def test_thinking_tags_fill_a_constraint_that_waits_for_the_reasoning():
    """The reasoning parser's end tag reaches SamplingParams for a constraint applied after the
    reasoning (its stop tokens then close the thinking, g906/engine/constrained_thinking.py), not
    only for a thinking_token_budget."""
    from g906.engine.structured import StructuredOutputsParams as S
    from g906.server import protocol as P
    from g906.server import vllm_extras as X
    from g906.server.parsers.qwen3_reasoning import Qwen3ReasoningParser

    req = P.ChatCompletionRequest(model="m", messages=[{"role": "user", "content": "x"}])
    enc = {"<think>": [5], "</think>": [6]}.__getitem__
    parser = Qwen3ReasoningParser(opened=True)
    assert X.thinking_tags(req, parser, enc) == {} and X.thinking_tags(req, parser, enc, S(regex="a")) == {}
    got = X.thinking_tags(req, parser, enc, S(regex="a", after="</think>"))
    assert got == dict(thinking_token_budget=None, think_start_ids=(5,), think_end_ids=(6,), think_open=True)
