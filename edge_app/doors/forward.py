"""What the control process of ``serve --workers N`` shares with its route modules: its app keys and the one way it
passes a request on to a worker (``forward``) or asks every live worker (``each``); errors are answered as the
signalling doors answer them (``edge_app.doors.offers.json_error``)."""

from __future__ import annotations

import asyncio
import json
from typing import Any

import aiohttp
from aiohttp import web

from edge_app.config import AppConfig
from edge_app.doors.access import client_address
from edge_app.doors.offers import json_error
from edge_app.events.live import Relays
from edge_app.workers import Supervisor

SUP_KEY = web.AppKey("supervisor", Supervisor)
CFG_KEY = web.AppKey("config", AppConfig)
HTTP_KEY = web.AppKey("http", aiohttp.ClientSession)
STATE_KEY = web.AppKey("state", dict)
RELAYS_KEY = web.AppKey("relays", Relays)
PASS_HEADERS = ("Content-Type", "Location", "ETag", "Retry-After", "Allow", "WWW-Authenticate", "Cache-Control")


async def forward(request: web.Request, index: int, body: bytes | None = None, path: str | None = None,
                  timeout_s: float = 30.0) -> web.Response:
    sup = request.app[SUP_KEY]
    w = sup.workers[index]
    if not w.alive:
        return json_error(503, f"worker {index} is restarting; retry in a few seconds", {"Retry-After": "2"})
    headers = {k: v for k, v in request.headers.items() if k in ("Authorization", "Content-Type", "Accept")}
    headers["X-Forwarded-For"] = client_address(request, request.app[CFG_KEY].server.trusted_proxies)
    data = await request.read() if body is None else body
    try:
        async with request.app[HTTP_KEY].request(request.method, f"http://127.0.0.1:{w.port}{path or request.path_qs}",
                                                 data=data, headers=headers,
                                                 timeout=aiohttp.ClientTimeout(total=timeout_s)) as r:
            payload = await r.read()
            out = {k: v for k, v in r.headers.items() if k in PASS_HEADERS}
            return web.Response(status=r.status, body=payload, headers=out)
    except (aiohttp.ClientError, TimeoutError) as exc:
        return json_error(503, f"worker {index} did not answer ({type(exc).__name__}); retry", {"Retry-After": "2"})


async def each(request: web.Request, path: str) -> list[tuple[int, int, Any]]:
    """GET ``path`` from every live worker with the client's Authorization: (worker, status, JSON or None)."""
    headers = {k: v for k, v in request.headers.items() if k == "Authorization"}

    async def one(w: Any) -> tuple[int, int, Any]:
        try:
            async with request.app[HTTP_KEY].get(f"http://127.0.0.1:{w.port}{path}", headers=headers,
                                                 timeout=aiohttp.ClientTimeout(total=5)) as r:
                text = await r.text()
                try:
                    return w.index, r.status, json.loads(text)
                except ValueError:
                    return w.index, r.status, text
        except (aiohttp.ClientError, TimeoutError):
            return w.index, 0, None

    return list(await asyncio.gather(*(one(w) for w in request.app[SUP_KEY].workers if w.alive)))
