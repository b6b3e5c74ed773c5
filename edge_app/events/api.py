"""``/api/events``: the events kept, newest first, filtered and paged; one event; its snapshot; delete one.

    GET    /api/events?camera=&label=&after=&before=&limit=&cursor=   {"events": [...], "next": cursor | null}
    GET    /api/events/{id}                                              one event
    GET    /api/events/{id}/snapshot.jpg                                 its best frame (404 without one)
    DELETE /api/events/{id}                                              gone, with its snapshot
"""

from __future__ import annotations

import asyncio

from aiohttp import web

from edge_app.events.query import Query
from edge_app.events.store import EventStore

EVENTS_KEY = web.AppKey("events", EventStore)
MAX_LIMIT = 1000


def _error(status: int, reason: str) -> web.Response:
    return web.json_response({"error": reason}, status=status)


def _number(request: web.Request, key: str) -> float | None:
    raw = request.query.get(key)
    if raw is None:
        return None
    try:
        return float(raw)
    except ValueError:
        raise web.HTTPBadRequest(text=f"{key}: a number (unix seconds), not {raw[:40]!r}") from None


async def list_events(request: web.Request) -> web.Response:
    try:
        limit = int(request.query.get("limit", "50"))
    except ValueError:
        return _error(400, "limit: a whole number from 1 to 1000")
    if not 1 <= limit <= MAX_LIMIT:
        return _error(400, "limit: a whole number from 1 to 1000")
    q = Query(request.query.get("camera"), request.query.get("label"), _number(request, "after"),
              _number(request, "before"), limit, request.query.get("cursor"))
    try:
        page = await asyncio.get_running_loop().run_in_executor(None, request.app[EVENTS_KEY].query, q)
    except ValueError as exc:
        return _error(400, str(exc))
    return web.json_response(page)


async def get_event(request: web.Request) -> web.Response:
    event = await asyncio.get_running_loop().run_in_executor(None, request.app[EVENTS_KEY].get,
                                                             request.match_info["id"])
    if event is None:
        return _error(404, f"no event {request.match_info['id']!r}")
    return web.json_response(event)


async def snapshot(request: web.Request) -> web.StreamResponse:
    path = request.app[EVENTS_KEY].snapshot_path(request.match_info["id"])
    if not path.is_file():
        return _error(404, f"no snapshot of event {request.match_info['id']!r}")
    return web.FileResponse(path, headers={"Content-Type": "image/jpeg"})


async def delete_event(request: web.Request) -> web.Response:
    loop = asyncio.get_running_loop()
    done: asyncio.Future[bool | None] = loop.create_future()

    def deleted(gone: bool | None) -> None:
        loop.call_soon_threadsafe(done.set_result, gone)

    request.app[EVENTS_KEY].delete(request.match_info["id"], deleted)
    gone = await asyncio.wait_for(done, 10.0)
    if gone is None:
        return _error(503, "the event store cannot write now (its reason is in /status under events)")
    if not gone:
        return _error(404, f"no event {request.match_info['id']!r}")
    return web.json_response({"deleted": request.match_info["id"]})


def add_routes(app: web.Application, store: EventStore) -> None:
    app[EVENTS_KEY] = store
    app.router.add_get("/api/events", list_events)
    app.router.add_get("/api/events/{id}", get_event)
    app.router.add_get("/api/events/{id}/snapshot.jpg", snapshot)
    app.router.add_delete("/api/events/{id}", delete_event)
