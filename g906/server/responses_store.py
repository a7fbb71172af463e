"""Stored responses (the Responses API's `store`): kept in memory, at most `max_count` of them,
the least recently used dropped first; and the background responses that run in the server's
event loop, which can be cancelled.

Each entry holds the response object, its input items (for the input_items listing), the
conversation as chat messages (for previous_response_id) and, for a background response created
with stream=true, its events (for replays). A continued conversation shares its
earlier message objects with the response it continues (lists of references, not copies), so
a chain of N turns costs N message objects plus N lists of references."""

from __future__ import annotations

import asyncio
from collections import OrderedDict
from dataclasses import dataclass, field

DEFAULT_MAX_STORED_RESPONSES = 1000
RUNNING = ("queued", "in_progress")


class EventLog:
    """The events of a background response created with stream=true, kept for its readers: the
    request that created it and any later GET ?stream=true (from a sequence number on). A reader
    that goes away leaves the generation running."""

    def __init__(self):
        self.events: list[str] = []
        self.ended = False
        self._changed = asyncio.Event()

    def add(self, event: str) -> None:
        self.events.append(event)
        self._wake()

    def end(self) -> None:
        self.ended = True
        self._wake()

    def _wake(self) -> None:
        self._changed.set()
        self._changed = asyncio.Event()

    async def read(self, after: int = -1):
        """The events after sequence number `after`, then the new ones as they come, to the end."""
        i = after + 1
        while True:
            while i < len(self.events):
                yield self.events[i]
                i += 1
            if self.ended:
                return
            changed = self._changed
            await changed.wait()


@dataclass
class StoredResponse:
    response: dict
    input_items: list[dict]
    history: list[dict]                          # chat messages: the conversation, this answer included
    task: asyncio.Task | None = None             # a background response's generation
    streams: list = field(default_factory=list)  # its engine streams (closed to abort it)
    log: EventLog | None = None                  # its events, when it was created with stream=true

    @property
    def running(self) -> bool:
        return self.response.get("status") in RUNNING


class ResponsesStore:
    def __init__(self, max_count: int = DEFAULT_MAX_STORED_RESPONSES):
        if max_count < 1:
            raise ValueError("the responses store holds at least one response")
        self.max_count = max_count
        self._entries: OrderedDict[str, StoredResponse] = OrderedDict()

    def __len__(self) -> int:
        return len(self._entries)

    def get(self, response_id: str) -> StoredResponse | None:
        entry = self._entries.get(response_id)
        if entry is not None:
            self._entries.move_to_end(response_id)
        return entry

    def put(self, response_id: str, entry: StoredResponse) -> None:
        self._entries[response_id] = entry
        self._entries.move_to_end(response_id)
        self.evict()

    def evict(self) -> None:
        """Drop the least recently used finished responses beyond max_count (a running background
        response stays until it ends: its task would otherwise write into nothing)."""
        excess = len(self._entries) - self.max_count
        if excess <= 0:
            return
        for rid in [rid for rid, e in self._entries.items() if not e.running][:excess]:
            del self._entries[rid]

    def delete(self, response_id: str) -> StoredResponse | None:
        entry = self._entries.pop(response_id, None)
        if entry is not None:
            cancel_task(entry)
        return entry


def cancel_task(entry: StoredResponse) -> None:
    """Stop a background response: its engine requests at once, then its task."""
    for s in entry.streams:
        s.close()
    if entry.task is not None and not entry.task.done():
        entry.task.cancel()


def settle(entry: StoredResponse, store: ResponsesStore) -> None:
    """A background entry that ended: drop what only the run needed, let the store evict again."""
    entry.task = None
    entry.streams = []
    store.evict()
