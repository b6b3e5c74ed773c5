"""Teaching through the control process of ``serve --workers N``.

The datasets, the training jobs and the models are files every worker shares (``edge_app.teach.store`` locks each
dataset across processes); what needs a source's frames runs where the source is:

* ``GET /api/sources``: every worker's cameras and sessions (each with its ``worker``);
* ``POST /api/datasets/DS/classes/CLS/capture``: on the worker of its ``source`` (``camera:NAME``: the camera's
  worker; ``session:ID``: the worker holding the session); the recording's ``id`` comes back as
  ``id * N + worker``, so ``GET /api/recordings/ID`` finds it again;
* the rest of ``/api`` (datasets, training, models, shadow runs) goes to worker 0.
"""

from __future__ import annotations

import json

from aiohttp import web

from edge_app.doors.forward import CFG_KEY, STATE_KEY, SUP_KEY, each, forward
from edge_app.doors.offers import json_error
from edge_app.workers import owner


async def sources(request: web.Request) -> web.Response:
    got = await each(request, "/api/sources")
    merged, seen = [], set()
    for index, code, body in got:
        if code == 200 and isinstance(body, dict):
            for s in body.get("sources", []):
                if s.get("id") not in seen:
                    seen.add(s.get("id"))
                    merged.append({**s, "worker": index})
    if not merged and got and got[0][1] != 200:
        return web.json_response(got[0][2], status=got[0][1])
    return web.json_response({"sources": merged})


def source_worker(app: web.Application, source: object) -> int:
    """The worker that has ``source`` (``camera:NAME`` or ``session:ID``); worker 0 when none says."""
    if not isinstance(source, str):
        return 0
    kind, _, name = source.partition(":")
    if kind == "camera":
        return owner(app[CFG_KEY], name, len(app[SUP_KEY].workers))
    if kind == "session":
        return int(app[STATE_KEY]["where"].get(name, (0, None))[0])
    return 0


def renumbered(resp: web.Response, index: int, workers: int) -> web.Response:
    """A worker's recording (its ``id``) as the control process names it: ``id * workers + index``."""
    if resp.content_type != "application/json" or not isinstance(resp.body, bytes):
        return resp
    try:
        doc = json.loads(resp.body)
    except ValueError:
        return resp
    if isinstance(doc, dict) and isinstance(doc.get("id"), int):
        doc["id"] = doc["id"] * workers + index
    headers = {k: v for k, v in resp.headers.items() if k not in ("Content-Type", "Content-Length")}
    return web.json_response(doc, status=resp.status, headers=headers)


async def capture(request: web.Request) -> web.Response:
    body = await request.read()
    try:
        source = json.loads(body or b"{}").get("source")
    except (ValueError, AttributeError):
        source = None  # the worker answers what is wrong with the body
    app = request.app
    index = source_worker(app, source)
    cfg = app[CFG_KEY]
    resp = await forward(request, index, body, timeout_s=cfg.training.max_record_s + 30)
    return renumbered(resp, index, len(app[SUP_KEY].workers))


async def recording(request: web.Request) -> web.Response:
    raw, workers = request.match_info["id"], len(request.app[SUP_KEY].workers)
    if not raw.isdigit():
        return json_error(404, "a recording id is a number")
    index, own = int(raw) % workers, int(raw) // workers
    resp = await forward(request, index, path=f"/api/recordings/{own}")
    return renumbered(resp, index, workers)


def add_teach_routes(r: web.UrlDispatcher) -> None:
    r.add_get("/api/sources", sources)
    r.add_post("/api/datasets/{ds}/classes/{cls}/capture", capture)
    r.add_get("/api/recordings/{id}", recording)
