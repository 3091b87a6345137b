"""What travels between caller threads and the engine thread.

Callers post messages to the engine's `Inbox` (a `Submission`, a `Flush`, an `Unpin`, or a
rid string to abort) and wake the engine thread, which drains them between steps; it answers
each request through its `Sink`, one result dict per put, the last one carrying a
finish_reason. When its loop ends (shut down, or failed) the engine thread seals the inbox
before its last drain, so a caller that got past the engine's liveness check just then is
refused instead of waiting for an answer that would never come.
"""

from __future__ import annotations

import asyncio
import queue
import threading
from collections.abc import AsyncIterator, Callable, Iterator
from dataclasses import dataclass, field
from typing import Any

from radixflow.runtime.request import Req


def _is_final(item: dict[str, Any]) -> bool:
    return item["meta_info"]["finish_reason"] is not None


class Sink:
    """Where a request's outputs go: a thread queue, or an asyncio queue on its loop."""

    def __init__(self, loop: asyncio.AbstractEventLoop | None = None) -> None:
        self.loop = loop
        # One of the two, by kind: the engine thread feeds it, the caller drains it.
        self.queue: queue.Queue[dict[str, Any]] = queue.Queue()
        self.aqueue: asyncio.Queue[dict[str, Any]] = asyncio.Queue()

    def put(self, item: dict[str, Any]) -> None:
        """Deliver one result (called on the engine thread)."""
        if self.loop is None:
            self.queue.put(item)
        else:
            self.loop.call_soon_threadsafe(self.aqueue.put_nowait, item)

    def wait_final(self) -> dict[str, Any]:
        """Block until the final result (a thread sink)."""
        while True:
            item = self.queue.get()
            if _is_final(item):
                return item

    async def wait_final_async(self) -> dict[str, Any]:
        """Await the final result (an asyncio sink)."""
        while True:
            item = await self.aqueue.get()
            if _is_final(item):
                return item

    def stream(self) -> Iterator[dict[str, Any]]:
        """Every result up to and including the final one (a thread sink)."""
        while True:
            item = self.queue.get()
            yield item
            if _is_final(item):
                return

    async def stream_async(self, abandon: Callable[[], None]) -> AsyncIterator[dict[str, Any]]:
        """Every result up to the final one (an asyncio sink); a consumer that stops early
        (closes the iterator, or is cancelled) calls `abandon`."""
        finished = False
        try:
            while not finished:
                item = await self.aqueue.get()
                finished = _is_final(item)
                yield item
        finally:
            if not finished:
                abandon()


@dataclass
class Submission:
    """A new request and the sink its outputs go to."""

    req: Req
    sink: Sink


@dataclass
class Flush:
    """Empty the caches; `done` gets None, or the error that refused it."""

    done: queue.Queue[Exception | None] = field(default_factory=queue.Queue)


@dataclass
class Unpin:
    """Release the pinned prefix `pin_id`; `done` gets None once released."""

    pin_id: str
    done: queue.Queue[None] = field(default_factory=queue.Queue)


Message = Submission | Flush | Unpin | str  # a str: the rid of a request to abort


class Inbox:
    """The engine's mailbox and request table: the rids in use (from submit to close, read
    by any thread) and, once the engine thread has opened them, their sinks."""

    def __init__(self) -> None:
        self._messages: queue.Queue[Message] = queue.Queue()
        self._wake = threading.Event()
        self._live: set[str] = set()
        self._lock = threading.Lock()
        self._sinks: dict[str, Sink] = {}
        self._sealed: str | None = None  # why nothing more is taken, once the loop has ended

    # -- caller threads ---------------------------------------------------------------------
    def submit(self, reqs: list[Req], loop: asyncio.AbstractEventLoop | None) -> list[Sink]:
        """Post requests, with a new sink each; a rid still in use refuses them all
        (ValueError), and so does a sealed inbox (RuntimeError, with the engine's reason)."""
        sinks = [Sink(loop) for _ in reqs]
        with self._lock:
            if self._sealed is not None:
                raise RuntimeError(self._sealed)
            taken = [r.rid for r in reqs if r.rid in self._live]
            if taken or len({r.rid for r in reqs}) < len(reqs):
                name = taken[0] if taken else reqs[0].rid
                raise ValueError(f"rid {name!r} is already in use by a running request")
            self._live.update(r.rid for r in reqs)
            for req, sink in zip(reqs, sinks, strict=True):
                self._messages.put(Submission(req, sink))
        self.wake()
        return sinks

    def abort(self, rid: str) -> None:
        """Ask for the request `rid` to stop (after the seal there is nothing left to stop:
        the engine thread's last drain answered every request)."""
        with self._lock:
            if self._sealed is None:
                self._messages.put(rid)
        self.wake()

    def ask(self, message: Flush | Unpin) -> Exception | None:
        """Post a control message and wait for the engine thread's answer. Sealed: a flush is
        refused with the engine's reason; an unpin has nothing left to release."""
        with self._lock:
            if self._sealed is not None:
                return RuntimeError(self._sealed) if isinstance(message, Flush) else None
            self._messages.put(message)
        self.wake()
        return message.done.get()

    def wake(self) -> None:
        self._wake.set()

    # -- the engine thread ------------------------------------------------------------------
    def seal(self, reason: str) -> None:
        """From now on refuse what callers post, with `reason`; what was posted before stays
        to be drained."""
        with self._lock:
            self._sealed = reason

    def wait(self, timeout: float) -> None:
        """Sleep until something is posted (or `timeout` seconds pass)."""
        self._wake.wait(timeout=timeout)
        self._wake.clear()

    def drain(self) -> Iterator[Message]:
        """The messages posted so far, oldest first."""
        while True:
            try:
                yield self._messages.get_nowait()
            except queue.Empty:
                return

    def open(self, submission: Submission) -> Req:
        """Start delivering the submitted request's outputs to its sink."""
        self._sinks[submission.req.rid] = submission.sink
        return submission.req

    def sink(self, rid: str) -> Sink | None:
        return self._sinks.get(rid)

    def close(self, rid: str) -> None:
        """The request is finished: drop its sink and free its rid."""
        self._sinks.pop(rid, None)
        with self._lock:
            self._live.discard(rid)
