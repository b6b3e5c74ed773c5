"""``GET /api/events/live``: each event change as it happens, as Server-Sent Events (``text/event-stream``; one
``event: new|update|end`` with the change's JSON as ``data``, a comment every 15 s to keep proxies from closing it).

The page reads it with ``fetch`` (an ``EventSource`` cannot send the bearer token). A client that falls 256 changes
behind is cut off (counted) rather than kept: it reconnects and reads ``/api/events`` again, so a slow tab never
holds memory. Shutdown ends every stream.
"""

from __future__ import annotations

import asyncio
import contextlib

import aiohttp
from aiohttp import web

from edge_app.events.detector import EventChange, StateChange
from edge_app.events.topics import event_payload

BEHIND = 256
KEEPALIVE_S = 15.0


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
                self._end(q)

    def _end(self, q: asyncio.Queue[bytes | None]) -> None:
        self.clients.discard(q)
        while not q.empty():
            q.get_nowait()
        q.put_nowait(None)

    async def close(self, app: web.Application) -> None:
        """``on_shutdown``: every stream ends (else the server would wait for them)."""
        for q in list(self.clients):
            self._end(q)

    async def handle(self, request: web.Request) -> web.StreamResponse:
        resp = web.StreamResponse(headers={"Content-Type": "text/event-stream", "Cache-Control": "no-cache",
                                           "X-Accel-Buffering": "no"})
        await resp.prepare(request)
        q: asyncio.Queue[bytes | None] = asyncio.Queue(BEHIND)
        self.clients.add(q)
        try:
            await resp.write(b": live\n\n")
            while True:
                try:
                    msg = await asyncio.wait_for(q.get(), KEEPALIVE_S)
                except TimeoutError:
                    msg = b": keepalive\n\n"
                if msg is None:
                    break
                await resp.write(msg)
        except (ConnectionResetError, ConnectionError):
            pass  # the client went
        finally:
            self.clients.discard(q)
        with contextlib.suppress(ConnectionError):
            await resp.write_eof()
        return resp


async def relay(request: web.Request, http: aiohttp.ClientSession, urls: list[str], headers: dict[str, str]
                ) -> web.StreamResponse:
    """The Server-Sent Events streams at ``urls`` merged into one (whole blocks), until they all end."""
    resp = web.StreamResponse(headers={"Content-Type": "text/event-stream", "Cache-Control": "no-cache"})
    queue: asyncio.Queue[bytes] = asyncio.Queue(256)

    async def pump(url: str) -> None:
        with contextlib.suppress(aiohttp.ClientError, TimeoutError):
            async with http.get(url, headers=headers, timeout=aiohttp.ClientTimeout(total=None, sock_read=60)) as r:
                buf = b""
                async for chunk in r.content.iter_any():
                    buf += chunk
                    while b"\n\n" in buf:
                        block, buf = buf.split(b"\n\n", 1)
                        await queue.put(block + b"\n\n")

    pumps = [asyncio.create_task(pump(u)) for u in urls]
    await resp.prepare(request)
    try:
        while not all(p.done() for p in pumps) or not queue.empty():
            with contextlib.suppress(TimeoutError):
                await resp.write(await asyncio.wait_for(queue.get(), 15.0))
    except (ConnectionError, asyncio.CancelledError):
        pass
    finally:
        for p in pumps:
            p.cancel()
    return resp
