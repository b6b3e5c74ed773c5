"""The HTTP side of ``edge-app serve``: ``create_app(config, service) -> web.Application``.

Routes: ``/`` (the browser client), the signalling doors (``POST /offer``, WHIP ``POST /whip``, WHEP
``POST /whep/{camera}``, ``DELETE /sessions/{id}``: ``edge_app.doors.offers``), ``/healthz``, ``/status`` (JSON),
``/metrics`` (Prometheus), ``/static/`` and the teach API (``edge_app.teach.api``).
"""

from __future__ import annotations

import functools
import logging
import time
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

from aiohttp import web
from aiohttp.typedefs import Handler
from prometheus_client import CONTENT_TYPE_LATEST

from edge_app import events
from edge_app.appkeys import CONFIG_KEY, HUB_KEY, LIMITER_KEY, METRICS_KEY, STARTED_KEY
from edge_app.config import AppConfig
from edge_app.config.cameras import RtspCameraConfig
from edge_app.doors.access import OfferRateLimiter, Tokens, auth_middleware, cors_middleware, effective_tokens, role
from edge_app.doors.offers import add_routes as add_signalling_routes
from edge_app.doors.offers import json_error
from edge_app.hub import Hub
from edge_app.metrics import Metrics
from edge_app.stallwatch import StallWatch
from edge_app.teach.api import add_routes as add_teach_routes
from edge_app.teach.state import TEACH_KEY
from models.registry import ModelRegistry
from models.service import Runner
from streams.aiortc_adapter import check_internals_at_start
from streams.redact import add_secret, add_url_secrets
from streams.rtc_settings import machine_host_addresses, restrict_host_addresses

log = logging.getLogger(__name__)

STATIC_DIR = Path(__file__).parent.parent / "static"
MAX_BODY_BYTES = 256 * 1024


@web.middleware
async def json_errors(request: web.Request, handler: Handler) -> web.StreamResponse:
    """aiohttp's own 4xx (unknown path, wrong method, body too large) as JSON like ours."""
    try:
        return await handler(request)
    except web.HTTPException as exc:
        if not 400 <= exc.status < 500:
            raise
        reason = exc.text or exc.reason
        if exc.status == 413:
            reason = f"request body over {MAX_BODY_BYTES // 1024} KiB ({reason})"
        return json_error(exc.status, reason, {k: v for k, v in exc.headers.items() if k in ("Allow", "Retry-After")})


def model_status(service: Runner) -> dict[str, Any]:
    rt = service.backend
    m = rt.manifest
    return {
        "name": m.name,
        "folder": str(rt.folder),
        "providers": rt.providers,
        "device": rt.device,
        "device_name": rt.device_name,
        "num_exits": rt.num_exits,
        "input": [m.input.height, m.input.width],
        "classes": m.class_names,
        "exits": [
            {"name": ex.name, "test_accuracy": ex.test_accuracy, "backbone_fraction": ex.backbone_fraction,
             "manifest_cost_ms": ex.cpu_cost.median_ms, "cost_median_ms": round(c.median_ms, 3),
             "cost_p95_ms": round(c.high_ms, 3), "runs": c.count}
            for ex, c in zip(m.exits, service.costs, strict=True)
        ],
        "check": _check_summary(rt.folder),
        "runner": service.status(),
    }


@functools.lru_cache(maxsize=16)
def _check_summary(folder: Path) -> dict[str, Any] | None:
    """A taught model's accuracy on its check recording (None: not taught here, or taught without a check). A model
    folder does not change once written, so report.json is read once per folder, not on every /status."""
    report = ModelRegistry.report(folder)
    check = None if report is None else report.get("check")
    if not isinstance(check, dict):
        return None
    return {k: check.get(k) for k in ("frames", "accuracy", "per_exit_accuracy", "exits_used")}


async def index(request: web.Request) -> web.FileResponse:
    return web.FileResponse(STATIC_DIR / "index.html")


async def healthz(request: web.Request) -> web.Response:
    """Liveness, and the number of open sessions (a control process or a balancer places offers by it)."""
    return web.json_response({"ok": True, "sessions": len(request.app[HUB_KEY].sessions)})


async def status(request: web.Request) -> web.Response:
    app = request.app
    cfg = app[CONFIG_KEY]
    return web.json_response({
        "uptime_s": round(time.monotonic() - app[STARTED_KEY], 1),
        "model": model_status(app[HUB_KEY].default.service),
        "policy": app[HUB_KEY].default.policy_info,  # the policy served (under load: operating_point says where it is)
        "policy_configured": cfg.policy.model_dump(mode="json"),
        "budget": cfg.budget.model_dump(mode="json"),
        "limits": {"max_sessions": cfg.server.max_sessions, "connect_timeout_s": cfg.server.connect_timeout_s,
                   "peer_timeout_s": cfg.server.peer_timeout_s},
        "ice_servers": [{"urls": s.urls} for s in cfg.server.ice_servers],  # credentials stay on the server
        **app[HUB_KEY].status(),
        **app[TEACH_KEY].status(),
        "events": events.status(app),
    })


async def metrics_endpoint(request: web.Request) -> web.Response:
    body = request.app[METRICS_KEY].exposition()
    return web.Response(body=body, headers={"Content-Type": CONTENT_TYPE_LATEST})


async def _start_hub(app: web.Application) -> None:
    hosts = app[CONFIG_KEY].server.ice_host_addresses
    if hosts:
        restrict_host_addresses(hosts)
        log.info("ICE host candidates restricted to %s", hosts)
    elif not machine_host_addresses():
        restrict_host_addresses(["127.0.0.1"])
        log.info("this machine has no network address but loopback: ICE offers 127.0.0.1 (browsers on this "
                 "machine only)")
    await check_internals_at_start()  # an aiortc that moved a name the adapter reads: one line, before any peer
    await app[HUB_KEY].start()


async def _stop_hub(app: web.Application) -> None:
    await app[HUB_KEY].stop()


async def _watch_loop(app: web.Application) -> AsyncIterator[None]:
    watch = StallWatch(app[METRICS_KEY].loop_lag)
    watch.start()
    yield
    await watch.stop()


def register_secrets(cfg: AppConfig, tokens: Tokens) -> None:
    """Everything secret in the configuration, for ``streams.redact`` to mask wherever it would be printed."""
    add_secret(tokens.operator)
    add_secret(tokens.viewer)
    for server in cfg.server.ice_servers:
        add_secret(server.credential)
    for cam in cfg.cameras:
        if isinstance(cam, RtspCameraConfig):
            add_url_secrets(cam.url)
    add_secret(cfg.mqtt.password)
    add_secret(getattr(cfg.model.backend, "access_token", None))
    for hook in cfg.webhooks:
        add_secret(hook.secret)
        add_url_secrets(hook.url)


def create_app(config: AppConfig, service: Runner, tokens: Tokens | None = None) -> web.Application:
    """The application around the inference ``service`` (started and stopped with it); ``tokens`` (default:
    ``effective_tokens(config)``) guard all but the page and /healthz, and say who is an operator."""
    tokens = effective_tokens(config) if tokens is None else tokens
    register_secrets(config, tokens)
    guards = [auth_middleware(tokens)]
    cors = [cors_middleware(config.server.cors_origins)] if config.server.cors_origins else []
    app = web.Application(client_max_size=MAX_BODY_BYTES, middlewares=[*cors, json_errors, *guards])
    app[LIMITER_KEY] = OfferRateLimiter(config.server.max_offers_per_minute)
    app[CONFIG_KEY] = config
    app[STARTED_KEY] = time.monotonic()
    rt = service.backend
    metrics = Metrics(rt.manifest.name, rt.providers, rt.num_exits)
    app[METRICS_KEY] = metrics
    app[HUB_KEY] = Hub(config, service, metrics)
    app.cleanup_ctx.append(_watch_loop)
    app.on_startup.append(_start_hub)
    app.on_shutdown.append(_stop_hub)
    app.router.add_get("/", index)
    app.router.add_get("/healthz", healthz)
    app.router.add_get("/status", status)
    app.router.add_get("/metrics", metrics_endpoint)
    app.router.add_get("/api/role", role)
    add_signalling_routes(app)
    app.router.add_static("/static/", STATIC_DIR)
    add_teach_routes(app, app[HUB_KEY], config)
    events.attach(app, config, app[HUB_KEY])
    return app
