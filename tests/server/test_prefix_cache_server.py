"""Prefix caching through the OpenAI API: a request extending an earlier one's prompt (or its
prompt and answer) reports usage.prompt_tokens_details.cached_tokens, /metrics counts the hits,
and after a load of concurrent requests with disconnects nothing stays referenced."""

from __future__ import annotations

import asyncio

import httpx
from tests.server.conftest import API_KEY

BLOCK = 16                         # the recipe's engine.embedded.block_size (the default)


def _shared(a: list[int], b: list[int]) -> int:
    n = 0
    while n < min(len(a), len(b)) and a[n] == b[n]:
        n += 1
    return n


def _want(shared: int) -> int:
    """The issue's bar: 90% of the shared part rounded down to the block size."""
    return int(0.9 * (shared // BLOCK * BLOCK))


def test_completions_extending_prompt_and_answer_hit_the_cache(server, client):
    before = server.metrics()
    prompt = [(i * 37 + 11) % 500 for i in range(90)]
    first = client.completions.create(model="tiny", prompt=prompt, max_tokens=20, temperature=0,
                                      extra_body={"ignore_eos": True})
    assert first.usage.prompt_tokens_details.cached_tokens == 0
    # the same prompt again: all but its last token (rounded down to a block) comes from the cache
    again = client.completions.create(model="tiny", prompt=prompt, max_tokens=20, temperature=0,
                                      extra_body={"ignore_eos": True})
    assert again.choices[0].text == first.choices[0].text
    assert again.usage.prompt_tokens_details.cached_tokens == (len(prompt) - 1) // BLOCK * BLOCK
    # extending the prompt
    ext = prompt + [7, 8, 9] * 10
    r = client.completions.create(model="tiny", prompt=ext, max_tokens=2, temperature=0)
    assert r.usage.prompt_tokens_details.cached_tokens >= _want(len(prompt))
    after = server.metrics()
    hits = after["g906:prefix_cache_hits_total"] - before.get("g906:prefix_cache_hits_total", 0)
    queries = after["g906:prefix_cache_queries_total"] - before.get("g906:prefix_cache_queries_total", 0)
    assert hits == again.usage.prompt_tokens_details.cached_tokens + r.usage.prompt_tokens_details.cached_tokens
    assert queries == 2 * len(prompt) + len(ext)
    assert after["g906:prefix_snapshots_used"] > 0 and after["g906:prefix_snapshots_total"] > 0


def test_chat_next_turn_with_the_answer_hits_the_cache(server, client):
    from g906 import LLM

    msgs = [{"role": "system", "content": "You are a terse assistant. " * 12},
            {"role": "user", "content": "Count the letters in the word banana, please."}]
    first = client.chat.completions.create(model="tiny", messages=msgs, max_tokens=24, temperature=0)
    answer = first.choices[0].message.content or ""
    nxt = msgs + [{"role": "assistant", "content": answer}, {"role": "user", "content": "And in apple?"}]
    r = client.chat.completions.create(model="tiny", messages=nxt, max_tokens=2, temperature=0)
    with LLM("builtin:tiny-qwen35", num_kv_blocks=4, enable_prefix_caching=False) as llm:
        tok = llm.get_tokenizer()
        a = tok.apply_chat_template(msgs, add_generation_prompt=True, tokenize=True)
        b = tok.apply_chat_template(nxt, add_generation_prompt=True, tokenize=True)
    assert len(a) == first.usage.prompt_tokens and len(b) == r.usage.prompt_tokens
    assert r.usage.prompt_tokens_details.cached_tokens >= _want(_shared(a, b)) > 0


def test_streamed_usage_reports_cached_tokens(client):
    prompt = [(i * 13 + 5) % 500 for i in range(70)]
    client.completions.create(model="tiny", prompt=prompt, max_tokens=1, temperature=0)
    chunks = list(client.completions.create(model="tiny", prompt=prompt + [1, 2, 3], max_tokens=3, temperature=0,
                                            stream=True, stream_options={"include_usage": True}))
    assert chunks[-1].usage.prompt_tokens_details.cached_tokens == 64


def test_no_leaks_after_load_with_disconnects(server):
    asyncio.run(_load_with_disconnects(server))


async def _load_with_disconnects(server):
    # a client of this event loop (the session's async client belongs to another test's loop)
    import openai

    aclient = openai.AsyncOpenAI(base_url=server.v1, api_key=API_KEY, max_retries=0, timeout=180)
    system = [(i * 7 + 3) % 500 for i in range(60)]

    async def one(i: int):
        body = {"model": "tiny", "prompt": system + [i, i + 1, i + 2], "max_tokens": 40, "temperature": 0,
                "ignore_eos": True, "stream": True}
        async with httpx.AsyncClient(timeout=60) as h:
            async with h.stream("POST", server.v1 + "/completions", json=body,
                                headers={"Authorization": f"Bearer {API_KEY}"}) as resp:
                got = 0
                async for line in resp.aiter_lines():
                    if line.startswith("data: "):
                        got += 1
                        if i % 2 and got == 2 + i % 5:      # every other client goes away mid-stream
                            return

    await asyncio.gather(*(one(i) for i in range(10)))
    done = await aclient.completions.create(model="tiny", prompt=system + [9, 9], max_tokens=4, temperature=0)
    assert done.usage.prompt_tokens_details.cached_tokens == 48     # the shared system prompt
    m = await asyncio.to_thread(server.idle_metrics)
    assert m["g906:num_requests_running"] == 0 and m["g906:num_requests_waiting"] == 0
    assert m["g906:kv_cache_blocks_used"] == 0 and m["g906:state_slots_used"] == 0
    assert m["g906:prefix_snapshots_pending"] == 0
    assert m["g906:prefix_cache_blocks"] > 0         # what was computed stays cached, unreferenced
