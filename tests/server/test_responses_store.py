"""Stored responses against a real `g906 up`: retrieve, delete, input_items (order, limit, after),
previous_response_id (one conversation continued, two branches from one response), background
responses (queued -> completed; cancelled and staying cancelled, its engine request aborted);
and the store itself (LRU bound, running responses kept, cancelled at close) in-process."""

from __future__ import annotations

import asyncio
import time

import httpx
import openai
import pytest

from g906.server.responses_store import ResponsesStore, StoredResponse
from g906.server.state import ServerState
from openai.types.responses import Response
from tests.server.conftest import API_KEY
from tests.server.test_responses import NO_THINKING


def _prompt(resp) -> str:
    return resp.input_messages[0]["message"]


def test_store_retrieve_delete(client):
    resp = client.responses.create(model="tiny", input="Hello!", max_output_tokens=4)
    got = client.responses.retrieve(resp.id)
    assert got.model_dump() == resp.model_dump()
    client.responses.delete(resp.id)
    with pytest.raises(openai.NotFoundError, match=f"Response with id '{resp.id}' not found."):
        client.responses.retrieve(resp.id)
    with pytest.raises(openai.NotFoundError):
        client.responses.delete(resp.id)
    # store=false: answered, not kept
    resp = client.responses.create(model="tiny", input="Hello!", max_output_tokens=4, store=False)
    assert resp.store is False
    with pytest.raises(openai.NotFoundError, match="Response with id .* not found."):
        client.responses.retrieve(resp.id)
    with pytest.raises(openai.NotFoundError, match="not found"):
        client.responses.input_items.list(resp.id)


def test_input_items_listing(client, server):
    items = [{"role": "user", "content": f"item {k}"} for k in range(5)]
    resp = client.responses.create(model="tiny", input=items, max_output_tokens=2)
    page = client.responses.input_items.list(resp.id)         # newest first, by default
    texts = [i.content[0].text for i in page.data]
    assert texts == [f"item {k}" for k in reversed(range(5))]
    asc = client.responses.input_items.list(resp.id, order="asc", limit=2)
    assert [i.content[0].text for i in asc.data] == ["item 0", "item 1"] and asc.has_more
    # the client follows `after` through the pages
    assert [i.content[0].text for i in client.responses.input_items.list(resp.id, order="asc", limit=2)] == \
        [f"item {k}" for k in range(5)]
    h = {"Authorization": f"Bearer {API_KEY}"}
    r = httpx.get(f"{server.v1}/responses/{resp.id}/input_items", params={"limit": 0}, headers=h)
    assert r.status_code == 400 and r.json()["error"]["param"] == "limit"
    r = httpx.get(f"{server.v1}/responses/{resp.id}/input_items", params={"after": "msg_nope"}, headers=h)
    assert r.status_code == 400 and r.json()["error"]["param"] == "after"


def test_previous_response_id_continues_the_conversation(client):
    first = client.responses.create(model="tiny", instructions="SYSTEM-ONE", input="My name is John.",
                                    max_output_tokens=6, reasoning=NO_THINKING)
    second = client.responses.create(model="tiny", input="Actually it is Mark.", previous_response_id=first.id,
                                     max_output_tokens=6, reasoning=NO_THINKING,
                                     extra_body={"enable_response_messages": True})
    prompt = _prompt(second)
    assert prompt.index("My name is John.") < prompt.index(first.output_text) < prompt.index("Actually it is Mark.")
    assert "SYSTEM-ONE" not in prompt           # instructions are not carried over (OpenAI's rule)
    assert second.previous_response_id == first.id
    third = client.responses.create(model="tiny", input="Name?", previous_response_id=second.id,
                                    max_output_tokens=4, extra_body={"enable_response_messages": True})
    assert _prompt(third).index("John") < _prompt(third).index("Mark") < _prompt(third).index("Name?")
    # input_items lists a response's own input
    assert [i.content[0].text for i in client.responses.input_items.list(third.id)] == ["Name?"]
    with pytest.raises(openai.NotFoundError, match="Response with id 'resp_missing' not found."):
        client.responses.create(model="tiny", input="x", previous_response_id="resp_missing")


def test_two_branches_from_one_response(server):
    async def run():
        # a client of this event loop (the session's async client belongs to no loop of ours)
        async with openai.AsyncOpenAI(base_url=server.v1, api_key=API_KEY, max_retries=0, timeout=120) as ac:
            first = await ac.responses.create(model="tiny", input="BASE", max_output_tokens=4)
            return await asyncio.gather(*(ac.responses.create(
                model="tiny", input=word, previous_response_id=first.id, max_output_tokens=4,
                extra_body={"enable_response_messages": True}) for word in ("BRANCH-A", "BRANCH-B")))

    a, b = asyncio.run(run())
    assert "BASE" in _prompt(a) and "BASE" in _prompt(b)
    assert "BRANCH-B" not in _prompt(a) and "BRANCH-A" not in _prompt(b)


def test_background_runs_to_completion(client):
    resp = client.responses.create(model="tiny", input="Hello!", background=True, max_output_tokens=8)
    assert resp.status == "queued" and resp.background is True and resp.output == []
    deadline = time.monotonic() + 30
    while resp.status in ("queued", "in_progress") and time.monotonic() < deadline:
        time.sleep(0.1)
        resp = client.responses.retrieve(resp.id)
    assert resp.status in ("completed", "incomplete") and resp.usage.output_tokens > 0
    # a finished background response stays as it is when cancelled
    assert client.responses.cancel(resp.id).status == resp.status
    with pytest.raises(openai.BadRequestError, match="background can only be used when `store` is true"):
        client.responses.create(model="tiny", input="x", background=True, store=False)


def test_background_cancel_aborts_and_stays_cancelled(client, server):
    resp = client.responses.create(model="tiny", input="A long story", background=True, max_output_tokens=400,
                                   reasoning=NO_THINKING, temperature=0.0, extra_body={"ignore_eos": True})
    while client.responses.retrieve(resp.id).status == "queued":
        time.sleep(0.01)
    cancelled = client.responses.cancel(resp.id)
    assert cancelled.status == "cancelled"
    Response.model_validate(cancelled.model_dump())
    assert server.idle_metrics(5)["g906:num_requests_running"] == 0
    for _ in range(5):
        time.sleep(0.2)
        assert client.responses.retrieve(resp.id).status == "cancelled"
    assert client.responses.cancel(resp.id).status == "cancelled"


def test_a_synchronous_response_cannot_be_cancelled(client):
    resp = client.responses.create(model="tiny", input="Hello", max_output_tokens=2)
    with pytest.raises(openai.BadRequestError, match="Cannot cancel a synchronous response."):
        client.responses.cancel(resp.id)
    with pytest.raises(openai.NotFoundError):
        client.responses.cancel("resp_nope")


# -- the store in-process -------------------------------------------------------------------------

def _entry(status="completed") -> StoredResponse:
    return StoredResponse(response={"status": status}, input_items=[], history=[])


def test_store_is_a_bounded_lru():
    s = ResponsesStore(max_count=2)
    s.put("a", _entry())
    s.put("b", _entry())
    assert s.get("a") is not None            # a is now the most recently used
    s.put("c", _entry())
    assert s.get("b") is None and s.get("a") is not None and s.get("c") is not None and len(s) == 2
    # running background responses are not evicted while they run
    s.put("r", _entry("in_progress"))
    s.put("d", _entry())
    assert s.get("r") is not None and len(s) == 2
    with pytest.raises(ValueError):
        ResponsesStore(max_count=0)
    st = ServerState(served_model_name="m", max_stored_responses=3)
    assert st.responses.max_count == 3


def test_delete_cancels_a_running_background_response():
    class Stream:
        closed = False

        def close(self):
            self.closed = True

    async def run():
        s = ResponsesStore()
        e = _entry("in_progress")
        e.streams = [Stream()]
        e.task = asyncio.ensure_future(asyncio.sleep(60))
        s.put("x", e)
        assert s.delete("x") is e and s.get("x") is None
        await asyncio.gather(e.task, return_exceptions=True)
        return e

    e = asyncio.run(run())
    assert e.streams[0].closed and e.task.cancelled()


def test_shutdown_with_a_background_response_running(tmp_path):
    from tests.server.conftest import MAIN_RECIPE, openai_client, start_server, stop_server

    s = start_server(tmp_path, MAIN_RECIPE)
    try:
        c = openai_client(s)
        resp = c.responses.create(model="tiny", input="A long story", background=True, max_output_tokens=400,
                                  reasoning=NO_THINKING, extra_body={"ignore_eos": True})
        while c.responses.retrieve(resp.id).status == "queued":
            time.sleep(0.01)
    finally:
        code = stop_server(s)
    err = s.stderr_path.read_text()
    assert code == 0, err[-3000:]
    assert "Traceback" not in err and "Task was destroyed" not in err, err[-3000:]


def test_tool_loop_through_previous_response_id(client):
    from tests.server.test_responses import WEATHER

    first = client.responses.create(model="tiny", input="Weather?", tools=[WEATHER], tool_choice="required",
                                    reasoning=NO_THINKING, max_output_tokens=200, temperature=0.0)
    call = next(o for o in first.output if o.type == "function_call")
    second = client.responses.create(model="tiny", previous_response_id=first.id, tools=[WEATHER],
                                     reasoning=NO_THINKING, max_output_tokens=4,
                                     input=[{"type": "function_call_output", "call_id": call.call_id,
                                             "output": "RESULT-42"}],
                                     extra_body={"enable_response_messages": True})
    prompt = _prompt(second)
    # the stored call is the assistant's turn, the output answers it
    assert prompt.index("<function=get_weather>") < prompt.index("<tool_response>\nRESULT-42")
    items = list(client.responses.input_items.list(second.id))
    assert [i.type for i in items] == ["function_call_output"]
