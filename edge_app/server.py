"""The HTTP side of ``edge-app serve``: ``create_app(config, runtime) -> web.Application``."""

from __future__ import annotations

import logging
import time
from pathlib import Path
from typing import Any

from aiohttp import web

from edge_app.config import AppConfig
from models.runtime import ModelRuntime

log = logging.getLogger(__name__)

STATIC_DIR = Path(__file__).parent / "static"
CONFIG_KEY = web.AppKey("config", AppConfig)
RUNTIME_KEY = web.AppKey("runtime", ModelRuntime)
STARTED_KEY = web.AppKey("started", float)


def model_status(rt: ModelRuntime) -> dict[str, Any]:
    m = rt.manifest
    return {
        "name": m.name,
        "folder": str(rt.folder),
        "providers": rt.providers,
        "device": rt.device,
        "input": [m.input.height, m.input.width],
        "classes": m.class_names,
        "exits": [
            {"name": ex.name, "test_accuracy": ex.test_accuracy, "backbone_fraction": ex.backbone_fraction,
             "manifest_cost_ms": ex.cpu_cost.median_ms, "cost_median_ms": round(c.median_ms, 3),
             "cost_p95_ms": round(c.high_ms, 3), "runs": c.count}
            for ex, c in zip(m.exits, rt.costs, strict=True)
        ],
    }


async def index(request: web.Request) -> web.FileResponse:
    return web.FileResponse(STATIC_DIR / "index.html")


async def healthz(request: web.Request) -> web.Response:
    return web.json_response({"ok": True})


async def status(request: web.Request) -> web.Response:
    app = request.app
    cfg = app[CONFIG_KEY]
    return web.json_response({
        "uptime_s": round(time.monotonic() - app[STARTED_KEY], 1),
        "model": model_status(app[RUNTIME_KEY]),
        "policy": cfg.policy.model_dump(mode="json"),
        "budget": cfg.budget.model_dump(mode="json"),
        "cameras": [{"name": c.name, "transport": c.transport} for c in cfg.cameras],
        "sessions": [],
    })


def create_app(config: AppConfig, runtime: ModelRuntime) -> web.Application:
    app = web.Application(client_max_size=256 * 1024)
    app[CONFIG_KEY] = config
    app[RUNTIME_KEY] = runtime
    app[STARTED_KEY] = time.monotonic()
    app.router.add_get("/", index)
    app.router.add_get("/healthz", healthz)
    app.router.add_get("/status", status)
    app.router.add_static("/static/", STATIC_DIR)
    return app
