"""Reading and checking a Responses API event stream: the raw server-sent events (event: and
data: lines), each validated against the openai package's own event types, and the stream's
structure: created and in_progress first, every item opened and closed in order with consistent
ids and indexes, the deltas adding up to the done events and to the final response."""

from __future__ import annotations

import json

import httpx
from pydantic import TypeAdapter

from openai.types.responses import Response, ResponseStreamEvent

_EVENTS = TypeAdapter(ResponseStreamEvent)


def raw_events(url: str, body: dict, api_key: str) -> list[dict]:
    """POST a stream=true request; the events as dicts, after checking their framing."""
    out = []
    with httpx.stream("POST", url + "/responses", json={**body, "stream": True}, timeout=120,
                      headers={"Authorization": f"Bearer {api_key}"}) as r:
        assert r.status_code == 200, r.read()
        assert r.headers["content-type"].startswith("text/event-stream")
        kind = None
        for line in r.iter_lines():
            if line.startswith("event: "):
                kind = line[len("event: "):]
            elif line.startswith("data: "):
                data = json.loads(line[len("data: "):])
                assert data["type"] == kind, (kind, data)
                out.append(data)
                kind = None
    return out


def check_stream(events: list[dict]) -> Response:
    """Validate a whole stream; returns its final response (completed or incomplete)."""
    assert [e["sequence_number"] for e in events] == list(range(len(events)))
    typed = [_EVENTS.validate_python(e) for e in events]
    assert [e.type for e in typed[:2]] == ["response.created", "response.in_progress"]
    final = typed[-1]
    assert final.type in ("response.completed", "response.incomplete"), final.type
    assert final.type == f"response.{final.response.status}"
    assert sum(e.type in ("response.completed", "response.incomplete") for e in typed) == 1
    items: dict[int, dict] = {}          # output_index -> what the stream said of it
    open_index = None
    for e in events[2:-1]:
        t = e["type"]
        if t == "response.output_item.added":
            assert open_index is None, "an item opened before the previous one closed"
            open_index = e["output_index"]
            assert open_index == len(items), "output_index must count the items"
            items[open_index] = {"item": e["item"], "text": "", "args": "", "parts": 0, "done": None}
            assert e["item"]["status"] == "in_progress"
            continue
        assert open_index is not None, f"{t} outside an item"
        assert e["output_index"] == open_index
        cur = items[open_index]
        if "item_id" in e:
            assert e["item_id"] == cur["item"]["id"]
        if t == "response.content_part.added":
            assert e["content_index"] == cur["parts"] == 0
            cur["parts"] += 1
        elif t in ("response.output_text.delta", "response.reasoning_text.delta"):
            assert e["content_index"] == 0 and cur["parts"] == 1
            cur["text"] += e["delta"]
        elif t in ("response.output_text.done", "response.reasoning_text.done"):
            assert e["text"] == cur["text"]
        elif t == "response.content_part.done":
            assert e["part"]["text"] == cur["text"]
        elif t == "response.function_call_arguments.delta":
            cur["args"] += e["delta"]
        elif t == "response.function_call_arguments.done":
            assert e["arguments"] == cur["args"] and e["name"] == cur["item"]["name"]
        elif t == "response.output_item.done":
            assert e["item"]["id"] == cur["item"]["id"]
            assert e["item"]["status"] in ("completed", "incomplete")
            cur["done"] = e["item"]
            open_index = None
        else:
            raise AssertionError(f"unexpected event {t}")
    assert open_index is None, "the last item was not closed"
    resp = final.response
    # the final response carries the streamed items (the same ids; a cut-off call left out)
    streamed = [c["done"] for c in items.values()]
    kept = [i for i in streamed if not (i["type"] == "function_call" and i["status"] == "incomplete")]
    assert events[-1]["response"]["output"] == kept
    text = "".join(c["text"] for c in items.values() if c["item"]["type"] == "message")
    assert text == resp.output_text
    return resp
