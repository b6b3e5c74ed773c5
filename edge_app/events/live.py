"""``GET /api/events/live``: each event change as it happens, as Server-Sent Events (``text/event-stream``; one
``event: new|update|end`` with the change's JSON as ``data``, a comment every 15 s to keep proxies from closing it).

The page reads it with ``fetch`` (an ``EventSource`` cannot send the bearer token). A client that falls 256 changes
behind is cut off (counted) rather than kept: it reconnects and reads ``/api/events`` again, so a slow tab never
holds memory. A stream ends within ``GONE_CHECK_S`` of its client going; shutdown ends every stream once it has
sent what is queued. ``Relays`` merges the workers' streams in the control process of ``serve --workers``.
"""

from __future__ import annotations

import asyncio
import contextlib

import aiohttp
from aiohttp import web

from edge_app.events.detector import EventChange, StateChange
from edge_app.events.topics import event_payload
from streams.tasks import cancel_and_wait

BEHIND = 256
KEEPALIVE_S = 15.0
GONE_CHECK_S = 1.0  # how soon a stream notices its client went without a word


def client_gone(request: web.Request) -> bool:
    """The client closed its connection (aiohttp does not cancel a handler for that: it is noticed here, or at the
    next write)."""
    transport = request.transport
    return transport is None or transport.is_closing()


class LiveFeed:
    """A listener of ``EventsOutput``: one bounded queue per connected client."""

    def __init__(self) -> None:
        self.clients: set[asyncio.Queue[bytes | None]] = set()
        self.cut_off = 0

    def __call__(self, change: StateChange | EventChange) -> None:
        if not isinstance(change, EventChange) or not self.clients:
            return
        msg = b"event: " + change.kind.encode() + b"\ndata: " + event_payload(change) + b"\n\n"
        for q in list(self.clients):
            try:
                q.put_nowait(msg)
            except asyncio.QueueFull:
                self.cut_off += 1
                self._end(q, keep=False)

    def _end(self, q: asyncio.Queue[bytes | None], keep: bool) -> None:
        """The stream ends after what is queued (``keep``), or at once."""
        self.clients.discard(q)
        if not keep or q.full():
            while not q.empty():
                q.get_nowait()
        q.put_nowait(None)

    async def close(self, app: web.Application) -> None:
        """``on_shutdown``: every stream ends once it has sent what is queued (the events the stop ended)."""
        for q in list(self.clients):
            self._end(q, keep=True)

    async def handle(self, request: web.Request) -> web.StreamResponse:
        resp = web.StreamResponse(headers={"Content-Type": "text/event-stream", "Cache-Control": "no-cache",
                                           "X-Accel-Buffering": "no"})
        await resp.prepare(request)
        q: asyncio.Queue[bytes | None] = asyncio.Queue(BEHIND)
        self.clients.add(q)
        try:
            await resp.write(b": live\n\n")
            quiet_s = 0.0
            while not client_gone(request):
                try:
                    msg = await asyncio.wait_for(q.get(), GONE_CHECK_S)
                except TimeoutError:
                    quiet_s += GONE_CHECK_S
                    if quiet_s < KEEPALIVE_S:
                        continue
                    msg = b": keepalive\n\n"
                if msg is None:
                    break
                quiet_s = 0.0
                await resp.write(msg)
        except (ConnectionResetError, ConnectionError):
            pass  # the client went
        finally:
            self.clients.discard(q)
        with contextlib.suppress(ConnectionError):
            await resp.write_eof()
        return resp


class Relays:
    """The merged streams a control process serves (``relay``): each ends when its client goes, and ``close`` (its
    ``on_shutdown``) ends them all at once."""

    def __init__(self) -> None:
        self.stops: set[asyncio.Event] = set()

    async def close(self, app: web.Application) -> None:
        for stop in list(self.stops):
            stop.set()

    async def relay(self, request: web.Request, http: aiohttp.ClientSession, urls: list[str],
                    headers: dict[str, str]) -> web.StreamResponse:
        """The Server-Sent Events streams at ``urls`` merged into one (whole blocks), until they all end, the
        client goes, or the server stops."""
        resp = web.StreamResponse(headers={"Content-Type": "text/event-stream", "Cache-Control": "no-cache"})
        queue: asyncio.Queue[bytes] = asyncio.Queue(BEHIND)
        stop = asyncio.Event()
        self.stops.add(stop)

        async def pump(url: str) -> None:
            with contextlib.suppress(aiohttp.ClientError, TimeoutError):
                async with http.get(url, headers=headers,
                                    timeout=aiohttp.ClientTimeout(total=None, sock_read=60)) as r:
                    buf = b""
                    async for chunk in r.content.iter_any():
                        buf += chunk
                        while b"\n\n" in buf:
                            block, buf = buf.split(b"\n\n", 1)
                            await queue.put(block + b"\n\n")

        pumps = [asyncio.create_task(pump(u)) for u in urls]
        try:
            await resp.prepare(request)
            while not stop.is_set() and not client_gone(request) and (
                    not all(p.done() for p in pumps) or not queue.empty()):
                with contextlib.suppress(TimeoutError):
                    await resp.write(await asyncio.wait_for(queue.get(), GONE_CHECK_S))
        except ConnectionError:
            pass  # the client went
        finally:
            self.stops.discard(stop)
            await cancel_and_wait(*pumps)
        return resp
