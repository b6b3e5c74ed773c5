"""Frames between stages, and the one-slot mailbox that gives every consumer latest-frame semantics.

A producer (a WebRTC track reader, an RTSP decoder thread) ``put``s every
frame it gets; a consumer ``await get()``s the newest one.  A frame that is
replaced before anyone took it is *stale*: it is dropped and counted, so a
slow consumer never builds a backlog and never sees old video.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Callable
from dataclasses import dataclass
from typing import Generic, TypeVar

import av

from streams.errors import StreamsError

T = TypeVar("T")
log = logging.getLogger(__name__)


@dataclass(frozen=True)
class SourceFrame:
    """A decoded frame as it arrived from a source."""

    frame: av.VideoFrame
    seq: int  # per-source arrival counter, from 0
    arrived_s: float  # time.monotonic() when it was decoded / received
    source: str
    truth: str | None = None  # the label a labelled source (the demo camera) knows this frame shows


class LatestSlot(Generic[T]):
    """Holds at most one item; ``put`` replaces (and counts) an item nobody took.

    ``put`` may be called from any thread (``put_threadsafe``) or from the
    loop; ``get`` is awaited on the loop that created the slot.
    """

    def __init__(self) -> None:
        self._item: T | None = None
        self._event = asyncio.Event()
        self._loop = asyncio.get_running_loop()
        self._closed = False
        self.on_put: Callable[[], None] | None = None  # hooks for metrics
        self.on_drop: Callable[[], None] | None = None
        self.on_replace: Callable[[T], None] | None = None  # gets each item replaced before anyone took it
        self.put_count = 0
        self.dropped = 0

    def put(self, item: T) -> None:
        if self._closed:
            return
        if self._item is not None:
            old = self._item
            self.drop()
            if self.on_replace is not None:
                self.on_replace(old)
        self._item = item
        self.put_count += 1
        if self.on_put is not None:
            self.on_put()
        self._event.set()

    def drop(self) -> None:
        """Count an item dropped (replaced before anyone took it, or refused by its producer)."""
        self.dropped += 1
        if self.on_drop is not None:
            self.on_drop()

    def put_threadsafe(self, item: T) -> None:
        if not self._loop.is_closed():
            self._loop.call_soon_threadsafe(self.put, item)

    async def get(self) -> T:
        """The newest item; waits for one.  Raises ``SlotClosed`` once closed and empty."""
        while self._item is None:
            if self._closed:
                raise SlotClosed
            self._event.clear()
            await self._event.wait()
        item, self._item = self._item, None
        return item

    def close(self) -> None:
        self._closed = True
        self._event.set()


class SlotClosed(StreamsError):
    """The producer went away; no more items will come."""


class Broadcast(Generic[T]):
    """One producer, many consumers: ``publish`` calls every subscriber's callback on the loop.

    Callbacks must not block (they put into their own ``LatestSlot`` or send
    a small message), so a slow consumer only ever drops its own frames.
    """

    def __init__(self) -> None:
        self._subscribers: list[Callable[[T], None]] = []

    def subscribe(self, callback: Callable[[T], None]) -> None:
        self._subscribers.append(callback)

    def unsubscribe(self, callback: Callable[[T], None]) -> None:
        if callback in self._subscribers:
            self._subscribers.remove(callback)

    def publish(self, item: T) -> None:
        for cb in list(self._subscribers):
            try:
                cb(item)
            except Exception:  # one broken consumer must not starve the others
                log.exception("subscriber %r failed", cb)

    def __len__(self) -> int:
        return len(self._subscribers)

