"""The HTTP API behind the page's "Teach it your scene" panel (docs/teach.md lists every call). Everything is
behind the token when one is set; bad input gets a 4xx with a reason.

    GET    /api/sources                                     what can be captured (cameras, open browser sessions)
    GET    /api/datasets                                    POST {"name"}: create
    GET    /api/datasets/{ds}                               classes, counts per split, recent frame ids
    POST   /api/datasets/{ds}/classes                       {"name"}            DELETE .../classes/{cls}
    POST   /api/datasets/{ds}/classes/{cls}/capture         {"source", "seconds": 0 (a snapshot) or S, "fps",
                                                             "role": "auto" | "check"}
    GET    /api/recordings/{id}
    GET    /api/datasets/{ds}/frames/{frame}.jpg            DELETE /api/datasets/{ds}/frames/{frame}
    POST   /api/datasets/{ds}/relabel                       {"frames": [...]} or {"recording", "from_unix",
                                                             "to_unix"}, with "class" and/or "role"
    GET    /api/cameras/{name}/region                       PUT {"region": [x, y, w, h] or null}
    POST   /api/training                                    {"dataset", "epochs"?, "from"?, "input_size"?,
                                                             "width"?}: start
                                                             (409 while one runs)
    GET    /api/training/{id}                               progress; DELETE: cancel
    GET    /api/models                                      versions, in use, per-exit held-out accuracy and cost
    POST   /api/models/{name}/deploy                        swap it in (422 when it fails validation); {"camera":
                                                             NAME} (or ?camera=NAME): on that camera only, else
                                                             as the box's default
    POST   /api/models/rollback                             back to the model before ({"camera"}: on that camera)
    POST   /api/models/{name}/shadow                        {"source", "seconds"}: answer the live source next to
                                                             the model in use (GET /api/shadow/{id}: where they
                                                             disagree; .../frames/{k}.jpg; POST .../frames/{k}/keep
                                                             {"dataset", "class"}: add it to training)
"""

from __future__ import annotations

import logging
from collections.abc import Awaitable, Callable
from typing import Any

from aiohttp import web
from aiohttp.typedefs import Handler

from edge_app.config import AppConfig
from edge_app.config.cameras import check_region
from edge_app.hub import Hub
from edge_app.teach.frames import DatasetError
from edge_app.teach.state import TEACH_KEY, Teach
from models.errors import RegistryError

log = logging.getLogger(__name__)


INPUT_SIZES = (64, 96, 128, 160, 192, 224)


async def _body(request: web.Request) -> dict[str, Any]:
    try:
        body = await request.json()
    except ValueError as exc:
        raise DatasetError(f"the body must be a JSON object ({exc})") from exc
    if not isinstance(body, dict):
        raise DatasetError("the body must be a JSON object")
    return body


def _number(body: dict[str, Any], key: str, default: float) -> float:
    value = body.get(key, default)
    if isinstance(value, bool) or not isinstance(value, int | float):
        raise DatasetError(f"{key!r} must be a number")
    return float(value)


def _handler(fn: Callable[[web.Request, Teach], Awaitable[web.StreamResponse]]) -> Handler:
    async def wrapped(request: web.Request) -> web.StreamResponse:
        try:
            return await fn(request, request.app[TEACH_KEY])
        except (DatasetError, RegistryError) as exc:
            return web.json_response({"error": exc.reason}, status=exc.status)
    return wrapped


async def sources(request: web.Request, t: Teach) -> web.Response:
    return web.json_response({"sources": t.sources()})


async def datasets(request: web.Request, t: Teach) -> web.Response:
    if request.method == "POST":
        name = (await _body(request)).get("name")
        t.store.create(name)  # type: ignore[arg-type]
        return web.json_response(t.store.summary(name), status=201)  # type: ignore[arg-type]
    return web.json_response({"datasets": [t.store.summary(d) for d in t.store.datasets()]})


async def dataset(request: web.Request, t: Teach) -> web.Response:
    return web.json_response(t.store.summary(request.match_info["ds"]))


async def classes(request: web.Request, t: Teach) -> web.Response:
    ds = request.match_info["ds"]
    if request.method == "DELETE":
        removed = t.store.delete_class(ds, request.match_info["cls"])
        return web.json_response({"deleted_frames": removed, **t.store.summary(ds)})
    t.store.add_class(ds, (await _body(request)).get("name"))  # type: ignore[arg-type]
    return web.json_response(t.store.summary(ds), status=201)


async def capture(request: web.Request, t: Teach) -> web.Response:
    body = await _body(request)
    source = body.get("source")
    if not isinstance(source, str):
        raise DatasetError("'source' is required: camera:NAME or session:ID (GET /api/sources)")
    role = body.get("role", "auto")
    if not isinstance(role, str):
        raise DatasetError("'role' is \"auto\" (dealt out to train, calibration and test) or \"check\"")
    rec = await t.recorder.record(request.match_info["ds"], request.match_info["cls"], source,
                                  _number(body, "seconds", 0.0), _number(body, "fps", 10.0), bool(body.get("wait")),
                                  role)
    return web.json_response(rec.status(), status=200 if rec.state != "recording" else 202)


async def recording(request: web.Request, t: Teach) -> web.Response:
    try:
        rec_id = int(request.match_info["id"])
    except ValueError as exc:
        raise DatasetError("a recording id is a number", 404) from exc
    return web.json_response(t.recorder.get(rec_id).status())


async def frame(request: web.Request, t: Teach) -> web.StreamResponse:
    ds, fid = request.match_info["ds"], request.match_info["frame"]
    if request.method == "DELETE":
        t.store.delete_frame(ds, fid)
        return web.json_response({"deleted": fid})
    return web.FileResponse(t.store.frame_path(ds, fid.removesuffix(".jpg")), headers={"Cache-Control": "max-age=3600"})


async def relabel(request: web.Request, t: Teach) -> web.Response:
    """Frames (or a span of a recording) to another class and/or role: a check's wrong frames "add to training"
    (role train; with "balance", as many check frames of the other classes go too), a recording labelled in spans
    (class)."""
    ds, body = request.match_info["ds"], await _body(request)
    cls, role = body.get("class"), body.get("role")
    if cls is None and role is None:
        raise DatasetError("say what to change: 'class' (a class of the dataset) and/or 'role' (auto, train, check)")
    if not all(v is None or isinstance(v, str) for v in (cls, role)):
        raise DatasetError("'class' and 'role' are strings")
    if "recording" in body:
        start, end = _number(body, "from_unix", 0.0), _number(body, "to_unix", 1e12)
        ids = [f.id for f in t.store.frames(ds) if f.recording == body["recording"] and start <= f.t <= end]
        if not ids:
            raise DatasetError(f"recording {body['recording']!r} has no frame in that span", 404)
        if cls is not None:
            ids = [f.id for f in t.store.label_span(ds, body["recording"], start, end, cls)]
    else:
        ids = body.get("frames")  # type: ignore[assignment]
        if cls is not None:
            t.store.relabel(ds, ids, cls)
    if role == "train" and body.get("balance"):
        ids = [f.id for f in t.store.add_to_training(ds, ids)]
    elif role is not None:
        t.store.set_role(ds, ids, role)
    return web.json_response({"changed": len(ids), "frames": ids, **t.store.summary(ds)})


async def region(request: web.Request, t: Teach) -> web.Response:
    """A camera's region of interest: read it, or set it live (the config file is read again at the next start:
    put the region there to keep it)."""
    name = request.match_info["name"]
    pipe = t.pipeline_for(f"camera:{name}")
    if request.method == "PUT":
        value = (await _body(request)).get("region")
        try:
            pipe.region = None if value is None else check_region(value)
        except ValueError as exc:
            raise DatasetError(str(exc)) from exc
        log.info("camera %s: region set to %s through the API", name, pipe.region)
    value = None if pipe.region is None else [round(v, 4) for v in pipe.region]
    return web.json_response({"camera": name, "region": value, "config": f"region = {value}" if value else None})


async def training(request: web.Request, t: Teach) -> web.Response:
    body = await _body(request)
    ds = body.get("dataset")
    if not isinstance(ds, str):
        raise DatasetError("'dataset' is required")
    epochs = body.get("epochs")
    if epochs is not None and (not isinstance(epochs, int) or not 1 <= epochs <= 500):
        raise DatasetError("'epochs' must be a whole number from 1 to 500")
    size = body.get("input_size")
    if size is not None and (not isinstance(size, int) or size not in INPUT_SIZES):
        raise DatasetError(f"'input_size' is one of {list(INPUT_SIZES)} pixels (a multiple of 32); larger sees "
                           "small things better and costs more per exit")
    width = body.get("width")
    if width is not None and (isinstance(width, bool) or not isinstance(width, int | float) or not 0 < width <= 1):
        raise DatasetError("'width' is the base's channel width, from 0 to 1 (0.5: twice the shipped 0.25)")
    start_from = body.get("from", "latest")
    if not isinstance(start_from, str):
        raise DatasetError("'from' is \"latest\" (the last model taught on this dataset), \"active\" or a model name")
    if start_from == "latest":
        start_from = t.registry.latest_for(ds, t.store.classes(ds)) or t.registry.active
    elif start_from == "active":
        start_from = t.registry.active
    job = await t.trainer.start(ds, t.registry.folder(start_from), epochs, size, width)
    return web.json_response(job.status(), status=202)


async def training_job(request: web.Request, t: Teach) -> web.Response:
    job_id = request.match_info["id"]
    job = await t.trainer.cancel(job_id) if request.method == "DELETE" else t.trainer.get(job_id)
    return web.json_response(job.status())


async def models(request: web.Request, t: Teach) -> web.Response:
    return web.json_response(t.models())


async def _camera(request: web.Request) -> str | None:
    """The camera a deploy or roll back is for: ``{"camera": NAME}`` in the body or ``?camera=NAME``; None (no
    body, no query): the box's default model."""
    camera = request.query.get("camera")
    if request.can_read_body:
        camera = (await _body(request)).get("camera", camera)
    if camera is not None and not isinstance(camera, str):
        raise DatasetError("'camera' is a camera's name (GET /status lists them)")
    return camera


async def deploy(request: web.Request, t: Teach) -> web.Response:
    # ?follow=1: serve it without recording it (serve --workers: worker 0 recorded it: edge_app.doors.control)
    return web.json_response(await t.deploy(request.match_info["name"], await _camera(request),
                                            record=request.query.get("follow") != "1"))


async def rollback(request: web.Request, t: Teach) -> web.Response:
    return web.json_response(await t.rollback(await _camera(request)))


async def shadow_start(request: web.Request, t: Teach) -> web.Response:
    name, body = request.match_info["name"], await _body(request)
    source = body.get("source")
    if not isinstance(source, str):
        raise DatasetError("'source' is required: camera:NAME or session:ID (GET /api/sources)")
    folder = t.registry.validate(name)
    run = await t.shadows.start(name, folder, source, t.pipeline_for(source), _number(body, "seconds", 20.0))
    return web.json_response(run.status(), status=202)


def _shadow_id(request: web.Request) -> int:
    try:
        return int(request.match_info["id"])
    except ValueError as exc:
        raise DatasetError("a shadow run id is a number", 404) from exc


async def shadow(request: web.Request, t: Teach) -> web.Response:
    return web.json_response(t.shadows.get(_shadow_id(request)).status())


async def shadow_frame(request: web.Request, t: Teach) -> web.Response:
    k = request.match_info["k"].removesuffix(".jpg")
    kept = t.shadows.frame(_shadow_id(request), int(k) if k.isdigit() else -1)
    if request.method == "GET":
        return web.Response(body=kept["jpeg"], content_type="image/jpeg")
    body = await _body(request)
    ds, cls = body.get("dataset"), body.get("class")
    if not isinstance(ds, str) or not isinstance(cls, str):
        raise DatasetError("'dataset' and 'class' are required: where the frame goes")
    frame = t.store.add_frame(ds, cls, kept["view"], f"shadow:{kept['seq']}", role=str(body.get("role", "train")))
    return web.json_response({"added": frame.id, **t.store.summary(ds)}, status=201)


def add_routes(app: web.Application, hub: Hub, config: AppConfig) -> Teach:
    teach = app[TEACH_KEY] = Teach(config, hub)
    r = app.router
    r.add_get("/api/sources", _handler(sources))
    r.add_route("*", "/api/datasets", _handler(datasets))
    r.add_get("/api/datasets/{ds}", _handler(dataset))
    r.add_post("/api/datasets/{ds}/classes", _handler(classes))
    r.add_delete("/api/datasets/{ds}/classes/{cls}", _handler(classes))
    r.add_post("/api/datasets/{ds}/classes/{cls}/capture", _handler(capture))
    r.add_get("/api/recordings/{id}", _handler(recording))
    r.add_get("/api/datasets/{ds}/frames/{frame}", _handler(frame))
    r.add_delete("/api/datasets/{ds}/frames/{frame}", _handler(frame))
    r.add_post("/api/datasets/{ds}/relabel", _handler(relabel))
    r.add_get("/api/cameras/{name}/region", _handler(region))
    r.add_put("/api/cameras/{name}/region", _handler(region))
    r.add_post("/api/training", _handler(training))
    r.add_get("/api/training/{id}", _handler(training_job))
    r.add_delete("/api/training/{id}", _handler(training_job))
    r.add_get("/api/models", _handler(models))
    r.add_post("/api/models/rollback", _handler(rollback))
    r.add_post("/api/models/{name}/deploy", _handler(deploy))
    r.add_post("/api/models/{name}/shadow", _handler(shadow_start))
    r.add_get("/api/shadow/{id}", _handler(shadow))
    r.add_get("/api/shadow/{id}/frames/{k}", _handler(shadow_frame))
    r.add_post("/api/shadow/{id}/frames/{k}/keep", _handler(shadow_frame))

    async def stop(app: web.Application) -> None:
        await teach.recorder.stop()
        await teach.trainer.stop()
        await teach.shadows.stop()

    app.on_shutdown.append(stop)
    return teach
