"""Streamed responses (stream=true) against a real `g906 up`: every event read raw (event: and
data: lines, sequence numbers), validated against the openai package's event types and checked
as a whole (tests/server/responses_events.py); the openai client's own stream reader too."""

from __future__ import annotations

import json
import time

import httpx
import jsonschema

from openai.types.responses import ResponseCompletedEvent, ResponseCreatedEvent, ResponseTextDeltaEvent
from tests.server.conftest import API_KEY
from tests.server.responses_events import check_stream, raw_events
from tests.server.test_responses import NAMESPACE, NO_THINKING, SCHEMA, WEATHER


def test_reasoning_then_text_stream(server):
    # the template opens the thinking; a small budget usually ends inside it, a large one may close it
    events = raw_events(server.v1, {"input": "Hello", "max_output_tokens": 40, "temperature": 0.0}, API_KEY)
    resp = check_stream(events)
    types = [e["type"] for e in events]
    assert "response.reasoning_text.delta" in types
    added = next(e for e in events if e["type"] == "response.content_part.added")
    assert added["part"]["type"] == "reasoning_text"
    assert resp.output[0].type == "reasoning"
    assert resp.usage.output_tokens_details.reasoning_tokens > 0


def test_text_stream_with_logprobs(server):
    events = raw_events(server.v1, {"input": "Hi", "max_output_tokens": 12, "reasoning": NO_THINKING,
                                    "include": ["message.output_text.logprobs"], "top_logprobs": 2}, API_KEY)
    resp = check_stream(events)
    deltas = [e for e in events if e["type"] == "response.output_text.delta"]
    assert deltas and all(e["logprobs"] for e in deltas)
    assert all(len(lp["top_logprobs"]) == 2 for e in deltas for lp in e["logprobs"])
    # the final part's logprobs are the deltas' in order
    streamed = [lp["token"] for e in deltas for lp in e["logprobs"]]
    assert [lp.token for lp in resp.output[0].content[0].logprobs] == streamed


def test_incomplete_stream_ends_with_response_incomplete(server):
    events = raw_events(server.v1, {"input": "Tell me a story", "max_output_tokens": 4, "reasoning": NO_THINKING},
                        API_KEY)
    resp = check_stream(events)
    assert events[-1]["type"] == "response.incomplete"
    assert resp.status == "incomplete" and resp.incomplete_details.reason == "max_output_tokens"
    done = [e for e in events if e["type"] == "response.output_item.done"]
    assert done[-1]["item"]["status"] == "incomplete"


def test_forced_tool_call_stream(server):
    for choice in ("required", {"type": "function", "name": "get_weather"}):
        events = raw_events(server.v1, {"input": "Weather?", "tools": [WEATHER], "tool_choice": choice,
                                        "reasoning": NO_THINKING, "max_output_tokens": 200, "temperature": 0.0},
                            API_KEY)
        resp = check_stream(events)
        types = [e["type"] for e in events]
        assert "response.function_call_arguments.delta" in types and "response.output_text.delta" not in types
        call = next(o for o in resp.output if o.type == "function_call")
        jsonschema.validate(json.loads(call.arguments), WEATHER["parameters"])
        added = next(e for e in events if e["type"] == "response.output_item.added")
        assert added["item"]["call_id"] == call.call_id and added["item"]["id"] == call.id


def test_namespace_call_stream(server):
    events = raw_events(server.v1, {"input": "Inspect Chrome.", "tools": [NAMESPACE], "tool_choice": "required",
                                    "reasoning": NO_THINKING, "max_output_tokens": 200, "temperature": 0.0}, API_KEY)
    check_stream(events)
    added = next(e["item"] for e in events if e["type"] == "response.output_item.added")
    done = next(e["item"] for e in events if e["type"] == "response.output_item.done")
    assert (added["name"], added["namespace"]) == (done["name"], done["namespace"]) == ("get_app_state",
                                                                                        "mcp__computer")


def test_json_schema_stream(server):
    events = raw_events(server.v1, {"input": "A color?", "reasoning": NO_THINKING, "max_output_tokens": 120,
                                    "temperature": 0.0,
                                    "text": {"format": {"type": "json_schema", "name": "p", "schema": SCHEMA}}},
                        API_KEY)
    resp = check_stream(events)
    jsonschema.validate(json.loads(resp.output_text), SCHEMA)


def test_openai_client_reads_the_stream(client):
    stream = client.responses.create(model="tiny", input="Say hello", reasoning=NO_THINKING, max_output_tokens=10,
                                     stream=True)
    events = list(stream)
    assert isinstance(events[0], ResponseCreatedEvent)
    assert any(isinstance(e, ResponseTextDeltaEvent) for e in events)
    last = events[-1]
    assert last.type in ("response.completed", "response.incomplete")
    text = "".join(e.delta for e in events if e.type == "response.output_text.delta")
    assert text == last.response.output_text
    # a streamed response is stored once it ended
    assert client.responses.retrieve(last.response.id).output_text == text
    # the client's stream helper (it wants response.completed: a constrained answer that ends)
    with client.responses.stream(model="tiny", input="A color?", reasoning=NO_THINKING, max_output_tokens=120,
                                 temperature=0.0, text={"format": {"type": "json_schema", "name": "p",
                                                                   "schema": SCHEMA}}) as s:
        seen = [e for e in s]
        final = s.get_final_response()
    assert isinstance(seen[-1], ResponseCompletedEvent) and final.status == "completed"
    jsonschema.validate(json.loads(final.output_text), SCHEMA)


def test_disconnect_aborts_the_generation(server):
    body = {"input": "A long story", "max_output_tokens": 400, "stream": True, "reasoning": NO_THINKING,
            "temperature": 0.0, "ignore_eos": True}
    with httpx.stream("POST", server.v1 + "/responses", timeout=60, json=body,
                      headers={"Authorization": f"Bearer {API_KEY}"}) as r:
        deltas, lines = 0, r.iter_lines()      # kept: a dropped iterator closes the connection
        for line in lines:
            deltas += line.startswith("event: response.output_text.delta")
            if deltas == 3:
                break               # leave after a few deltas
        m = server.metrics()
        assert m["g906:num_requests_running"] == 1, m
    steps_at_close = server.metrics()["g906:engine_steps"]
    m = server.idle_metrics(5)
    assert m["g906:num_requests_running"] == 0 and m["g906:kv_cache_blocks_used"] == 0
    assert m["g906:engine_steps"] - steps_at_close <= 20      # aborted, not run on to 400 tokens


def _replay(server, rid: str, after: int | None = None) -> list[dict]:
    params = {"stream": "true"} | ({"starting_after": str(after)} if after is not None else {})
    out = []
    with httpx.stream("GET", f"{server.v1}/responses/{rid}", params=params, timeout=60,
                      headers={"Authorization": f"Bearer {API_KEY}"}) as r:
        assert r.status_code == 200, r.read()
        for line in r.iter_lines():
            if line.startswith("data: "):
                out.append(json.loads(line[6:]))
    return out


def test_background_stream_and_its_replays(server, client):
    events = raw_events(server.v1, {"input": "Hi", "background": True, "max_output_tokens": 12,
                                    "reasoning": NO_THINKING}, API_KEY)
    resp = check_stream(events)
    assert resp.background is True
    assert client.responses.retrieve(resp.id).model_dump() == resp.model_dump()
    # replayed whole, or from a sequence number on
    assert _replay(server, resp.id) == events
    assert _replay(server, resp.id, after=3) == events[4:]
    # the openai client reads it too, and resumes it
    stream = client.responses.retrieve(resp.id, stream=True, starting_after=len(events) - 2)
    assert [e.type for e in stream] == [events[-1]["type"]]


def test_a_background_stream_outlives_its_reader(server, client):
    body = {"input": "A story", "background": True, "stream": True, "max_output_tokens": 60,
            "reasoning": NO_THINKING, "ignore_eos": True}
    with httpx.stream("POST", server.v1 + "/responses", json=body, timeout=60,
                      headers={"Authorization": f"Bearer {API_KEY}"}) as r:
        lines = r.iter_lines()
        rid = None
        for line in lines:
            if line.startswith("data: "):
                rid = json.loads(line[6:])["response"]["id"]
                break
    deadline = time.monotonic() + 30
    while client.responses.retrieve(rid).status in ("queued", "in_progress") and time.monotonic() < deadline:
        time.sleep(0.05)
    final = check_stream(_replay(server, rid))
    assert final.status == "incomplete" and final.usage.output_tokens == 60


def test_replay_needs_a_background_stream(server, client):
    h = {"Authorization": f"Bearer {API_KEY}"}
    resp = client.responses.create(model="tiny", input="Hi", background=True, max_output_tokens=2)
    r = httpx.get(f"{server.v1}/responses/{resp.id}", params={"stream": "true"}, headers=h)
    assert r.status_code == 400 and r.json()["error"]["param"] == "stream"
    events = raw_events(server.v1, {"input": "Hi", "background": True, "max_output_tokens": 2}, API_KEY)
    rid = events[0]["response"]["id"]
    r = httpx.get(f"{server.v1}/responses/{rid}", params={"stream": "true", "starting_after": "x"}, headers=h)
    assert r.status_code == 400 and r.json()["error"]["param"] == "starting_after"


def test_cancelling_a_background_stream_ends_it(server, client):
    body = {"input": "A story", "background": True, "stream": True, "max_output_tokens": 400,
            "reasoning": NO_THINKING, "ignore_eos": True, "temperature": 0.0}
    with httpx.stream("POST", server.v1 + "/responses", json=body, timeout=60,
                      headers={"Authorization": f"Bearer {API_KEY}"}) as r:
        data = []
        for line in r.iter_lines():
            if line.startswith("data: "):
                data.append(json.loads(line[6:]))
                if len(data) == 5:
                    assert client.responses.cancel(data[0]["response"]["id"]).status == "cancelled"
        # the stream ended (no final event: the response was cancelled)
    assert data[-1]["type"] not in ("response.completed", "response.incomplete")
    assert client.responses.retrieve(data[0]["response"]["id"]).status == "cancelled"
