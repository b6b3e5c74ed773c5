"""The control process of ``serve --workers N``: the public HTTP port in front of the media workers.

* The page and its static files are served here.
* Offers: a camera's viewers (``POST /offer`` with ``camera``, ``POST /whep/NAME``) go to the camera's worker, a
  browser's own camera (``POST /offer``, ``POST /whip``) to the worker with the fewest sessions; ``max_sessions``
  and ``max_offers_per_minute`` hold across workers (counted here). ``DELETE``/``PATCH /sessions/ID`` reach the
  worker that holds the session.
* ``/status``: every worker's sessions and cameras, and the workers themselves; ``/metrics``: every worker's
  series with a ``worker`` label. Both pass the client's ``Authorization`` to the workers, which check it.
* ``POST /api/models/.../deploy`` and ``/api/models/rollback`` reach every worker; ``GET /api/events`` merges the
  workers' pages (one cursor for all: they share the order); ``/api/events/ID`` asks each; ``/api/cameras/NAME/...``
  (a camera's region) goes to the camera's worker; teaching: ``edge_app.doors.control_teach``.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import logging
import re
from collections.abc import AsyncIterator
from urllib.parse import quote

import aiohttp
from aiohttp import web

from edge_app.config import AppConfig
from edge_app.doors.access import OfferRateLimiter, client_address
from edge_app.doors.control_teach import add_teach_routes
from edge_app.doors.forward import CFG_KEY, HTTP_KEY, RELAYS_KEY, STATE_KEY, SUP_KEY, each, forward
from edge_app.doors.offers import json_error
from edge_app.events.live import Relays
from edge_app.events.query import merge_pages
from edge_app.workers import Supervisor, owner

log = logging.getLogger(__name__)

SESSION = re.compile(r"/sessions/([^/?]+)")


def _least_loaded(app: web.Application) -> int:
    counts = app[STATE_KEY]["sessions"]
    alive = [w.index for w in app[SUP_KEY].workers if w.alive] or [0]
    return min(alive, key=lambda i: counts.get(i, 0))


async def offer(request: web.Request) -> web.Response:
    app, cfg = request.app, request.app[CFG_KEY]
    retry = app[STATE_KEY]["limiter"].check(client_address(request, cfg.server.trusted_proxies))
    if retry is not None:
        return json_error(429, f"too many offers: at most {cfg.server.max_offers_per_minute} a minute "
                          "([server] max_offers_per_minute)", {"Retry-After": str(max(1, round(retry)))})
    total = sum(app[STATE_KEY]["sessions"].values())
    if total >= cfg.server.max_sessions:
        return json_error(503, f"{total} sessions open across the workers: the limit is {cfg.server.max_sessions} "
                          "([server] max_sessions)", {"Retry-After": "10"})
    body = await request.read()
    camera = request.match_info.get("camera")
    if camera is None and request.path == "/offer":
        with contextlib.suppress(ValueError, AttributeError):
            camera = json.loads(body).get("camera")
    index = owner(cfg, camera, len(app[SUP_KEY].workers)) if camera else _least_loaded(app)
    resp = await forward(request, index, body)
    if resp.status in (200, 201):
        app[STATE_KEY]["sessions"][index] = app[STATE_KEY]["sessions"].get(index, 0) + 1
        sid = None
        m = SESSION.search(resp.headers.get("Location", ""))
        if m:
            sid = m.group(1)
        elif resp.content_type == "application/json":
            with contextlib.suppress(ValueError, AttributeError, TypeError):
                sid = json.loads(resp.body).get("session")  # type: ignore[arg-type]
        if sid:
            app[STATE_KEY]["where"][sid] = (index, app[SUP_KEY].workers[index].pid)
    return resp


def end_orphans(app: web.Application) -> None:
    """Sessions whose worker died (or was restarted) ended with it: forgotten here and counted, so their URL says
    so (404) and ``/status`` counts them."""
    workers, state = app[SUP_KEY].workers, app[STATE_KEY]
    for sid, (index, pid) in list(state["where"].items()):
        if workers[index].pid != pid:
            del state["where"][sid]
            state["ended"][sid] = index
            while len(state["ended"]) > 1000:  # the newest thousand are kept, to answer their URLs
                del state["ended"][next(iter(state["ended"]))]
            state["closed"]["worker_exit"] = state["closed"].get("worker_exit", 0) + 1
            log.info("session %s: ended with worker %d (pid %s)", sid, index, pid)


async def session_route(request: web.Request) -> web.Response:
    sid = request.match_info["id"]
    end_orphans(request.app)
    placed = request.app[STATE_KEY]["where"].get(sid)
    if placed is None:
        index = request.app[STATE_KEY]["ended"].get(sid)
        if index is not None:
            return json_error(404, f"session {sid!r} ended: worker {index}, which held it, stopped; offer again")
        return json_error(404, f"no session {sid!r}")
    return await forward(request, placed[0])


async def to_all(request: web.Request) -> web.Response:
    """Deploy and roll back. On a camera (``{"camera"}`` or ``?camera=``): the worker that runs it, alone. As the
    box's default: worker 0 decides (a roll back's model) and records it in the shared registry; every other worker
    then serves what worker 0 answered without recording it again (``?follow=1``); worker 0's answer is returned."""
    app, body = request.app, await request.read()
    camera = request.query.get("camera")
    with contextlib.suppress(ValueError, AttributeError):
        camera = json.loads(body or b"{}").get("camera", camera)
    if isinstance(camera, str):
        return await forward(request, owner(app[CFG_KEY], camera, len(app[SUP_KEY].workers)), body)
    first = await forward(request, 0, body)
    if first.status != 200 or not isinstance(first.body, bytes):
        return first
    model = str(json.loads(first.body).get("model"))
    for w in app[SUP_KEY].workers[1:]:
        resp = await forward(request, w.index, b"", path=f"/api/models/{quote(model, safe='')}/deploy?follow=1")
        if resp.status != 200:
            log.warning("worker %d did not take model %s (HTTP %d): it serves it from its next start", w.index,
                        model, resp.status)
    return first


async def to_first(request: web.Request) -> web.Response:
    return await forward(request, 0)


async def to_camera_owner(request: web.Request) -> web.Response:
    """A camera's own settings (its region) on the worker that runs it."""
    app = request.app
    return await forward(request, owner(app[CFG_KEY], request.match_info["name"], len(app[SUP_KEY].workers)))


async def status(request: web.Request) -> web.Response:
    got = await each(request, "/status")
    ok = [(i, s) for i, code, s in got if code == 200 and isinstance(s, dict)]
    if not ok:
        denied = next(((code, s) for _, code, s in got if code in (401, 403)), None)
        if denied is not None:
            return web.json_response(denied[1], status=denied[0])
        return json_error(503, "no worker answered /status")
    base = dict(ok[0][1])
    base["sessions"] = [dict(s, worker=i) for i, st in ok for s in st.get("sessions", [])]
    base["cameras"] = [dict(c, worker=i) for i, st in ok for c in st.get("cameras", [])]
    base["models"] = [dict(m, worker=i) for i, st in ok for m in st.get("models", [])]  # each worker's own
    base["workers"] = [w.status() for w in request.app[SUP_KEY].workers]
    end_orphans(request.app)
    closed: dict[str, int] = dict(request.app[STATE_KEY]["closed"])
    for _, st in ok:
        for why, n in (st.get("sessions_closed") or {}).items():
            closed[why] = closed.get(why, 0) + n
    base["sessions_closed"] = dict(sorted(closed.items()))
    for w in base["workers"]:
        w["sessions"] = sum(1 for s in base["sessions"] if s["worker"] == w["index"])
    return web.json_response(base)


def relabel(text: str, worker: int, seen: set[str]) -> list[str]:
    """A worker's exposition with ``worker="i"`` on every sample; each HELP/TYPE line once."""
    out = []
    for line in text.splitlines():
        if line.startswith("#"):
            if line not in seen:
                seen.add(line)
                out.append(line)
            continue
        if not line.strip():
            continue
        if "{" in line:  # labels end at the last "}" (a label's value may hold spaces)
            series, _, rest = line.rpartition("}")
            out.append(f'{series},worker="{worker}"}}{rest}')
        else:
            name, _, rest = line.partition(" ")
            out.append(f'{name}{{worker="{worker}"}} {rest}')
    return out


async def metrics(request: web.Request) -> web.Response:
    got = await each(request, "/metrics")
    if got and all(code in (401, 403) for _, code, _ in got):
        return web.Response(status=got[0][1], text="unauthorized")
    seen: set[str] = set()
    lines: list[str] = []
    for i, code, text in got:
        if code == 200 and isinstance(text, str):
            lines += relabel(text, i, seen)
    return web.Response(text="\n".join(lines) + "\n", content_type="text/plain")


async def events(request: web.Request) -> web.Response:
    got = await each(request, request.path_qs)
    pages = [s for _, code, s in got if code == 200 and isinstance(s, dict)]
    if not pages:
        return web.json_response(got[0][2] if got else {"error": "no worker answered"},
                                 status=got[0][1] if got and got[0][1] else 503)
    limit = int(request.query.get("limit", "50")) if request.query.get("limit", "50").isdigit() else 50
    return web.json_response(merge_pages(pages, limit))


async def one_event(request: web.Request) -> web.Response:
    for w in request.app[SUP_KEY].workers:
        if w.alive:
            resp = await forward(request, w.index)
            if resp.status != 404:
                return resp
    return json_error(404, f"no event {request.match_info['id']!r}")


async def live(request: web.Request) -> web.StreamResponse:
    """Every worker's ``/api/events/live``, merged into one stream."""
    headers = {k: v for k, v in request.headers.items() if k == "Authorization"}
    urls = [f"http://127.0.0.1:{w.port}/api/events/live" for w in request.app[SUP_KEY].workers if w.alive]
    return await request.app[RELAYS_KEY].relay(request, request.app[HTTP_KEY], urls, headers)


async def poll_sessions(app: web.Application) -> None:
    """Each worker's open sessions, every second (offers placed meanwhile are counted at once)."""
    while True:
        for w in app[SUP_KEY].workers:
            n, ready = 0, False
            if w.alive:
                with contextlib.suppress(aiohttp.ClientError, TimeoutError, ValueError):
                    async with app[HTTP_KEY].get(f"http://127.0.0.1:{w.port}/healthz",
                                                 timeout=aiohttp.ClientTimeout(total=2)) as r:
                        n, ready = int((await r.json()).get("sessions", 0)), r.status == 200
            app[STATE_KEY]["sessions"][w.index] = n
            app[STATE_KEY]["ready"][w.index] = ready
        end_orphans(app)
        await asyncio.sleep(0.5 if not all(app[STATE_KEY]["ready"].values()) else 1.0)


def create_control_app(cfg: AppConfig, sup: Supervisor) -> web.Application:
    from edge_app.doors.server import STATIC_DIR, index

    app = web.Application(client_max_size=1 << 20)
    app[CFG_KEY], app[SUP_KEY] = cfg, sup
    app[STATE_KEY] = {"sessions": {}, "where": {}, "ready": {}, "ended": {}, "closed": {},
                      "limiter": OfferRateLimiter(cfg.server.max_offers_per_minute)}

    async def lifecycle(app: web.Application) -> AsyncIterator[None]:
        app[HTTP_KEY] = aiohttp.ClientSession()
        tasks = [asyncio.create_task(sup.run(), name="supervisor"),
                 asyncio.create_task(poll_sessions(app), name="poll-sessions")]
        yield
        for t in tasks:
            t.cancel()
        await asyncio.gather(*tasks, return_exceptions=True)
        await sup.stop()
        await app[HTTP_KEY].close()

    app.cleanup_ctx.append(lifecycle)
    app[RELAYS_KEY] = Relays()
    app.on_shutdown.append(app[RELAYS_KEY].close)  # every page's live events end at once
    r = app.router
    r.add_get("/", index)
    r.add_static("/static/", STATIC_DIR)
    async def healthz(request: web.Request) -> web.Response:
        """200 once every worker answers (a balancer or a script waits for it), else 503."""
        ready = [app[STATE_KEY]["ready"].get(w.index, False) for w in sup.workers]
        return web.json_response({"ok": all(ready), "sessions": sum(app[STATE_KEY]["sessions"].values()),
                                  "workers": ready}, status=200 if all(ready) else 503)

    r.add_get("/healthz", healthz)
    r.add_get("/status", status)
    r.add_get("/metrics", metrics)
    for path in ("/offer", "/whip", "/whep/{camera}"):
        r.add_post(path, offer)
    r.add_route("DELETE", "/sessions/{id}", session_route)
    r.add_route("PATCH", "/sessions/{id}", session_route)
    r.add_post("/api/models/rollback", to_all)
    r.add_post("/api/models/{name}/deploy", to_all)
    r.add_get("/api/events", events)
    r.add_get("/api/events/live", live)
    r.add_route("*", "/api/events/{id}", one_event)
    r.add_get("/api/events/{id}/snapshot.jpg", one_event)
    add_teach_routes(r)
    r.add_route("*", "/api/cameras/{name}/{tail:.*}", to_camera_owner)
    r.add_route("*", "/api/{tail:.*}", to_first)
    return app
