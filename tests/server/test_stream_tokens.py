"""Streams never send a token without text mid-stream (vLLM's rule, g906/server/openai_answers.py
_Held): a token whose text is held back (here: the bytes of a multi-byte UTF-8 character, which
builtin:tiny-qwen35's byte-level vocabulary spells one token per byte) goes out with the next chunk
that has text, its logprobs and id with it, and continuous usage counts the tokens sent."""

from __future__ import annotations

import openai
import pytest

from tests.server.conftest import API_KEY

WORD = "日本語"       # 9 byte tokens in the builtin vocabulary: text appears on every third
FORCED = {"structured_outputs": {"choice": [WORD]}, "return_token_ids": True}
USAGE = {"include_usage": True, "continuous_usage_stats": True}


@pytest.fixture(scope="module")
def client(server):
    return openai.OpenAI(base_url=server.v1, api_key=API_KEY, max_retries=0, timeout=120)


def test_completion_stream_holds_tokens_until_they_have_text(client):
    chunks = list(client.completions.create(model="tiny", prompt="Say it:", max_tokens=16, stream=True, logprobs=2,
                                            temperature=0, stream_options=USAGE, extra_body=FORCED))
    text, tokens, ids = "", 0, []
    for ch in chunks:
        if not ch.choices:
            continue
        c = ch.choices[0]
        if c.finish_reason is None:
            assert c.text, "a chunk without text mid-stream"
        if c.text:
            assert c.logprobs and c.logprobs.tokens
        n = len(c.logprobs.tokens) if c.logprobs else 0
        assert n == len(c.model_extra.get("token_ids") or [])
        tokens += n
        ids += c.model_extra.get("token_ids") or []
        text += c.text
        assert ch.usage.completion_tokens == tokens      # usage counts what was sent
    assert text == WORD
    assert chunks[-1].usage.completion_tokens == tokens == len(ids) >= 9
    # the held tokens' offsets: three tokens per character, each at its character's start
    full = client.completions.create(model="tiny", prompt="Say it:", max_tokens=16, logprobs=2, temperature=0,
                                     extra_body=FORCED)
    assert full.choices[0].text == WORD and full.choices[0].model_extra["token_ids"] == ids


def test_chat_stream_holds_tokens_until_they_have_text(client):
    chunks = list(client.chat.completions.create(
        model="tiny", messages=[{"role": "user", "content": "Say it."}], max_tokens=16, stream=True, logprobs=True,
        top_logprobs=2, temperature=0, stream_options=USAGE,
        extra_body={**FORCED, "chat_template_kwargs": {"enable_thinking": False}}))
    content, tokens = "", 0
    for ch in chunks[1:]:                  # after the role chunk
        if not ch.choices:
            continue
        c = ch.choices[0]
        if c.finish_reason is None:
            assert c.delta.content, "a chunk without text mid-stream"
        if c.logprobs is not None:
            assert c.logprobs.content
            tokens += len(c.logprobs.content)
        content += c.delta.content or ""
        assert ch.usage.completion_tokens == tokens
    assert content == WORD
    assert chunks[-1].usage.completion_tokens == tokens >= 9
