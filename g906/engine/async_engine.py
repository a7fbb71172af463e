"""The async front-end: one background thread drives LLMEngine; each request gets an async
stream of deltas.

Requests join and leave between steps: add and abort are posted to an inbox that the loop
drains before every step, so an abort (a client that went away: the stream is closed) takes
effect before the next step runs and frees the request's cache at once.

    engine = AsyncEngine(LLMEngine(...)); engine.start()
    async for index, delta in engine.generate("r1", prompt_ids, SamplingParams(n=2)):
        ...
    engine.shutdown()
"""

from __future__ import annotations

import asyncio
import logging
import threading
import time
from collections import deque
from typing import Protocol

from g906.engine.llm_engine import LLMEngine, StepOutput
from g906.engine.sampling_params import SamplingParams

log = logging.getLogger("g906.engine")


class QueueFull(RuntimeError):
    """The waiting queue is at max_waiting_requests."""


class EngineDead(RuntimeError):
    """The engine loop stopped after an error, or is shutting down."""


class Observer(Protocol):  # what the server's metrics implement
    # n: tokens that arrived together (several with speculative decoding)
    def on_first_token(self, seconds: float, n: int = 1) -> None: ...
    def on_token(self, seconds: float, n: int = 1) -> None: ...
    def on_finish(self, out: StepOutput) -> None: ...


class _Stream:
    __slots__ = ("loop", "queue", "index")

    def __init__(self, loop: asyncio.AbstractEventLoop, queue: asyncio.Queue, index: int):
        self.loop = loop
        self.queue = queue
        self.index = index


class AsyncEngine:
    def __init__(self, engine: LLMEngine, *, max_waiting_requests: int | None = None,
                 observer: Observer | None = None):
        self.engine = engine
        self.max_waiting_requests = max_waiting_requests or engine.config.max_waiting_requests
        self.observer = observer
        self._inbox: deque[tuple] = deque()
        self._cond = threading.Condition()
        self._streams: dict[str, _Stream] = {}
        self._thread: threading.Thread | None = None
        self._stopping = False
        self._accepting = True
        self.dead: BaseException | None = None
        self._pending = 0          # requests accepted but not yet finished (children counted)

    # -- lifecycle --------------------------------------------------------------------------------
    def start(self) -> None:
        if self._thread is None:
            self._thread = threading.Thread(target=self._run, name="g906-engine", daemon=True)
            self._thread.start()

    @property
    def running(self) -> bool:
        return self._thread is not None and self._thread.is_alive() and self.dead is None

    def stop_accepting(self) -> None:
        self._accepting = False

    def num_unfinished(self) -> int:
        return self._pending

    def shutdown(self, drain_timeout: float = 30.0) -> bool:
        """Stop taking requests, let the in-flight ones finish (up to drain_timeout), stop the loop.
        Returns True when everything finished."""
        self._accepting = False
        deadline = time.monotonic() + drain_timeout
        while self._pending and time.monotonic() < deadline and self.running:
            time.sleep(0.02)
        drained = self._pending == 0
        with self._cond:
            self._stopping = True
            self._cond.notify_all()
        if self._thread is not None:
            self._thread.join(timeout=10)
        return drained

    # -- requests ---------------------------------------------------------------------------------
    def _post(self, cmd: tuple) -> None:
        with self._cond:
            self._inbox.append(cmd)
            self._cond.notify_all()

    def abort(self, request_id: str) -> None:
        self._post(("abort", request_id))

    def check(self, prompt_token_ids: list[int], params: SamplingParams) -> None:
        """Raise what generate() would raise at once: EngineDead, QueueFull, ValueError (prompt,
        or a structured-outputs constraint the engine cannot compile)."""
        if self.dead is not None or self._stopping or not self.running:
            raise EngineDead("the engine is not running")
        if not self._accepting:
            raise EngineDead("the server is shutting down")
        waiting_room = self.max_waiting_requests + self.engine.config.max_num_seqs
        if self._pending + params.n > waiting_room:
            raise QueueFull(
                f"the request queue is full ({self._pending} requests queued or running, "
                f"max_waiting_requests = {self.max_waiting_requests})"
            )
        self.engine.check_prompt(prompt_token_ids)
        self.engine.check_params(params)

    def generate(self, request_id: str, prompt_token_ids: list[int], params: SamplingParams,
                 mm=None) -> "RequestStream":
        """Admit a request at once (raising EngineDead, QueueFull or ValueError) and return the async
        stream of its (index, delta) pairs for the params.n samples, interleaved as they come.
        Closing the stream early (aclose(), or cancelling the task reading it) aborts what still runs."""
        self.check(prompt_token_ids, params)
        n = params.n
        loop = asyncio.get_running_loop()
        queue: asyncio.Queue = asyncio.Queue()
        ids = [request_id] if n == 1 else [f"{request_id}:{i}" for i in range(n)]
        for rid in ids:
            if rid in self._streams:
                raise ValueError(f"request id {rid!r} is already in use")
        for i, rid in enumerate(ids):
            self._streams[rid] = _Stream(loop, queue, i)
        self._pending += n
        stream = RequestStream(self, ids, queue)
        if params.use_beam_search:      # one beam group whose n outputs come back under the n ids
            self._post(("beam", request_id, list(prompt_token_ids), params, mm, ids))
            return stream
        for i, rid in enumerate(ids):
            self._post(("add", rid, list(prompt_token_ids), params if n == 1 else params.for_child(i), mm))
        return stream

    # -- the loop -----------------------------------------------------------------------------------
    def _deliver(self, rid: str, item) -> None:
        st = self._streams.get(rid)
        if st is None:
            return
        payload = item if isinstance(item, BaseException) else (st.index, item)
        try:
            st.loop.call_soon_threadsafe(st.queue.put_nowait, payload)
        except RuntimeError:  # the event loop is closed: nobody is listening any more
            pass

    def _run(self) -> None:
        eng = self.engine
        try:
            while True:
                with self._cond:
                    while not self._inbox and not eng.has_unfinished_requests() and not self._stopping:
                        self._cond.wait()
                    if self._stopping:
                        break
                    cmds = list(self._inbox)
                    self._inbox.clear()
                for cmd in cmds:
                    if cmd[0] == "add":
                        _, rid, ids, params, mm = cmd
                        if rid not in self._streams:
                            continue  # aborted before it was added
                        try:
                            if mm is None:
                                eng.add_request(rid, ids, params)
                            else:  # images: encoded once, shared by the n children
                                eng.add_request(rid, ids, params, mm=mm)
                        except Exception as exc:  # noqa: BLE001 - goes back to the caller
                            self._deliver(rid, exc)
                    elif cmd[0] == "beam":
                        _, rid, ids, params, mm, outs = cmd
                        if any(o not in self._streams for o in outs):
                            continue  # aborted before it was added
                        try:
                            eng.add_request(rid, ids, params, mm=mm, output_ids=outs)
                        except Exception as exc:  # noqa: BLE001 - goes back to the caller
                            self._deliver(outs[0], exc)
                    else:
                        eng.abort_request(cmd[1])
                if eng.has_unfinished_requests():
                    for out in eng.step():
                        self._deliver(out.request_id, out)
        except BaseException as exc:  # noqa: BLE001
            log.exception("the engine loop stopped")
            self.dead = exc
            for rid in list(self._streams):
                self._deliver(rid, EngineDead(f"the engine failed: {type(exc).__name__}: {exc}"))


class RequestStream:
    """The deltas of one request (all its n samples). Async-iterate it; aclose() aborts."""

    def __init__(self, owner: AsyncEngine, ids: list[str], queue: asyncio.Queue):
        self.owner = owner
        self.ids = ids
        self.queue = queue
        self.live = set(ids)
        self.closed = False
        self.start = time.monotonic()
        self._last: dict[int, float] = {}

    def __aiter__(self) -> "RequestStream":
        return self

    async def __anext__(self) -> tuple[int, StepOutput]:
        if self.closed or not self.live:
            self._cleanup()
            raise StopAsyncIteration
        try:
            item = await self.queue.get()
        except BaseException:  # cancelled: the reader went away
            self._cleanup()
            raise
        if isinstance(item, BaseException):
            self._cleanup()
            raise item
        index, out = item
        obs = self.owner.observer
        now = time.monotonic()
        if obs is not None and out.new_token_ids:
            n = len(out.new_token_ids)
            if index not in self._last:
                obs.on_first_token(now - self.start, n)
            else:
                obs.on_token(now - self._last[index], n)
        self._last[index] = now
        if out.finished:
            self.live.discard(self.ids[index])
            if obs is not None:
                obs.on_finish(out)
                on_e2e = getattr(obs, "on_e2e", None)       # optional: end-to-end latency
                if on_e2e is not None:
                    on_e2e(now - self.start)
            if not self.live:
                self._cleanup()
        return index, out

    async def aclose(self) -> None:
        self._cleanup()

    def close(self) -> None:
        self._cleanup()

    def _cleanup(self) -> None:
        if self.closed:
            return
        self.closed = True
        owner = self.owner
        for rid in self.ids:
            owner._streams.pop(rid, None)
        for rid in self.live:
            owner.abort(rid)
        owner._pending -= len(self.ids)

    def __del__(self) -> None:  # a stream dropped without being read to the end or closed
        try:
            self._cleanup()
        except Exception:  # noqa: BLE001
            pass
