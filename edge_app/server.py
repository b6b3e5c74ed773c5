"""The HTTP side of ``edge-app serve``: ``create_app(config, service) -> web.Application``.

Routes: ``/`` (the browser client), ``POST /offer`` (WebRTC signalling, JSON
``{"sdp", "type": "offer", "camera"?, "probe"?}`` answered in the same shape
plus ``"session"``), ``/healthz``, ``/status`` (JSON), ``/metrics``
(Prometheus) and ``/static/``.
"""

from __future__ import annotations

import asyncio
import errno
import functools
import logging
import os
import signal
import ssl
import time
from collections.abc import AsyncIterator, Callable
from pathlib import Path
from typing import Any, Literal

from aiohttp import web
from aiohttp.typedefs import Handler
from aiortc import RTCSessionDescription
from prometheus_client import CONTENT_TYPE_LATEST
from pydantic import BaseModel, ConfigDict, Field, ValidationError

from edge_app.access import OfferRateLimiter, auth_middleware, cors_middleware, effective_token
from edge_app.config import AppConfig
from edge_app.errors import EdgeAppError
from edge_app.hub import Hub, OfferRefused
from edge_app.metrics import Metrics
from edge_app.stallwatch import StallWatch
from edge_app.teach.api import TEACH_KEY
from edge_app.teach.api import add_routes as add_teach_routes
from edge_app.teach.registry import ModelRegistry
from models.service import InferenceService
from streams.ice import machine_host_addresses, restrict_host_addresses
from streams.redact import add_secret, add_url_secrets

log = logging.getLogger(__name__)

STATIC_DIR = Path(__file__).parent / "static"
CONFIG_KEY = web.AppKey("config", AppConfig)
STARTED_KEY = web.AppKey("started", float)
HUB_KEY = web.AppKey("hub", Hub)
METRICS_KEY = web.AppKey("metrics", Metrics)
LIMITER_KEY = web.AppKey("offer_limiter", OfferRateLimiter)
MAX_OFFER_BYTES = 64 * 1024
MAX_BODY_BYTES = 256 * 1024


class Offer(BaseModel):
    """The body of ``POST /offer``.  Keys it does not know are ignored (logged at debug): clients we did not
    write send their own (aiortc's example page: ``video_transform``)."""

    model_config = ConfigDict(extra="ignore", frozen=True)
    sdp: str = Field(min_length=1, max_length=MAX_OFFER_BYTES)
    type: str = Field(pattern="^offer$")
    camera: str | None = Field(None, max_length=64, description="watch this configured camera")
    probe: bool = Field(False, description="read the frame counter stamped in the left margin of each frame")
    results: Literal["compact", "full"] = Field("compact", description="compact results (a full one each second), "
                                                "or every field on every result")
    video: Literal["annotated", "camera"] = Field("annotated", description="a camera viewer's video: the analysis "
                                                  "drawn in (annotated), or the camera's own picture, forwarded "
                                                  "without a transcode where it can be, with the client drawing "
                                                  "the analysis from the results (camera)")


def json_error(status: int, reason: str, headers: dict[str, str] | None = None) -> web.Response:
    return web.json_response({"error": reason}, status=status, headers=headers)


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


def model_status(service: InferenceService) -> dict[str, Any]:
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
    return web.json_response({"ok": True})


async def status(request: web.Request) -> web.Response:
    app = request.app
    cfg = app[CONFIG_KEY]
    return web.json_response({
        "uptime_s": round(time.monotonic() - app[STARTED_KEY], 1),
        "model": model_status(app[HUB_KEY].service),
        "policy": cfg.policy.model_dump(mode="json"),
        "budget": cfg.budget.model_dump(mode="json"),
        "limits": {"max_sessions": cfg.server.max_sessions, "connect_timeout_s": cfg.server.connect_timeout_s,
                   "peer_timeout_s": cfg.server.peer_timeout_s},
        "ice_servers": [{"urls": s.urls} for s in cfg.server.ice_servers],  # credentials stay on the server
        **app[HUB_KEY].status(),
        **app[TEACH_KEY].status(),
    })


async def offer(request: web.Request) -> web.Response:
    """``POST /offer``; every outcome is counted in ``edge_offers_total``, aiohttp's own refusals (413) too."""
    metrics = request.app[METRICS_KEY]
    try:
        return await _answer_offer(request)
    except web.HTTPException as exc:
        metrics.offers.labels("bad-request" if 400 <= exc.status < 500 else f"error-{exc.status}").inc()
        raise
    except Exception:
        metrics.offers.labels("error").inc()
        log.exception("offer from %s: unexpected error", request.remote)
        return json_error(500, "internal error answering the offer (the server log has the details)")


async def _answer_offer(request: web.Request) -> web.Response:
    metrics = request.app[METRICS_KEY]
    client = request.remote or "unknown"
    retry = request.app[LIMITER_KEY].check(client)
    if retry is not None:
        metrics.offers.labels("refused-429").inc()
        limit = request.app[CONFIG_KEY].server.max_offers_per_minute
        return json_error(429, f"too many offers from {client}: at most {limit} a minute "
                               f"([server] max_offers_per_minute); retry in {retry:.0f} s",
                          {"Retry-After": str(max(1, round(retry)))})
    if request.content_type != "application/json":
        metrics.offers.labels("bad-request").inc()
        return json_error(415, f"Content-Type must be application/json, not {request.content_type!r}")
    try:
        raw = await request.json()
        body = Offer.model_validate(raw)
    except RecursionError:
        metrics.offers.labels("bad-request").inc()
        return json_error(400, "invalid offer: the JSON is nested too deeply")
    except ValueError as exc:  # JSONDecodeError and pydantic's ValidationError are both ValueErrors
        metrics.offers.labels("bad-request").inc()
        reason = exc.errors(include_url=False) if isinstance(exc, ValidationError) else f"body is not JSON: {exc}"
        return web.json_response({"error": "invalid offer", "details": reason}, status=400)
    if isinstance(raw, dict) and (unknown := sorted(set(raw) - set(Offer.model_fields))):
        log.debug("offer from %s: ignoring keys %s", client, [k[:40] for k in unknown[:10]])
    try:
        session, answer = await request.app[HUB_KEY].create_session(
            RTCSessionDescription(sdp=body.sdp, type=body.type), body.camera, body.probe, body.results == "full",
            body.video)
    except OfferRefused as exc:
        metrics.offers.labels(f"refused-{exc.status}").inc()
        return json_error(exc.status, exc.reason)
    metrics.offers.labels("answered").inc()
    return web.json_response({"sdp": answer.sdp, "type": answer.type, "session": session.id})


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
    await app[HUB_KEY].start()


async def _stop_hub(app: web.Application) -> None:
    await app[HUB_KEY].stop()


async def _watch_loop(app: web.Application) -> AsyncIterator[None]:
    watch = StallWatch(app[METRICS_KEY].loop_lag)
    watch.start()
    yield
    await watch.stop()


def register_secrets(cfg: AppConfig, token: str | None) -> None:
    """Everything secret in the configuration, for ``streams.redact`` to mask wherever it would be printed."""
    add_secret(token)
    for server in cfg.server.ice_servers:
        add_secret(server.credential)
    for cam in cfg.cameras:
        add_url_secrets(cam.url)


def create_app(config: AppConfig, service: InferenceService, token: str | None = None) -> web.Application:
    """The application around the inference ``service`` (started and stopped with it); ``token`` (default:
    ``effective_token(config)``) guards all but the page and /healthz."""
    token = effective_token(config) if token is None else token
    register_secrets(config, token)
    guards = [auth_middleware(token)] if token else []
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
    app.router.add_post("/offer", offer)
    app.router.add_static("/static/", STATIC_DIR)
    add_teach_routes(app, app[HUB_KEY], config)
    return app


class ListenError(EdgeAppError):
    """The server cannot listen on the address asked for; the message says why and what to do."""

    def __init__(self, host: str, port: int, exc: OSError) -> None:
        why = {errno.EADDRINUSE: "the port is already in use (another edge-app, or another program)",
               errno.EACCES: "permission denied (ports below 1024 need root)",
               errno.EADDRNOTAVAIL: f"this machine has no address {host} (check [server] host or --host)"}
        reason = why.get(exc.errno or 0, exc.strerror or str(exc))
        super().__init__(f"cannot listen on {host}:{port}: {reason}; pick another port with --port N or "
                         f"[server] port in the config file")


class ShutdownSignals:
    """SIGTERM/SIGINT once: stop gracefully (``requested`` is set); a second time: ``exit_now`` at once."""

    def __init__(self, exit_now: Callable[[int], None] = os._exit) -> None:
        self.requested = asyncio.Event()
        self._exit_now = exit_now

    def __call__(self, sig: signal.Signals) -> None:
        if self.requested.is_set():
            log.warning("%s again: exiting now, without waiting for the shutdown", sig.name)
            self._exit_now(128 + sig.value)
            return
        log.info("%s: shutting down (send it again to exit at once)", sig.name)
        self.requested.set()

    def install(self, loop: asyncio.AbstractEventLoop) -> None:
        for sig in (signal.SIGTERM, signal.SIGINT):
            loop.add_signal_handler(sig, self, sig)


async def serve_until_signalled(app: web.Application, host: str, port: int, ssl_context: ssl.SSLContext | None,
                                shutdown_timeout_s: float, signals: ShutdownSignals | None = None) -> None:
    """Serve until SIGTERM/SIGINT, then close peers and cameras within ``shutdown_timeout_s`` (plus HTTP)."""
    signals = signals or ShutdownSignals()
    signals.install(asyncio.get_running_loop())
    runner = web.AppRunner(app, handle_signals=False, shutdown_timeout=min(shutdown_timeout_s, 5.0))
    await runner.setup()
    site = web.TCPSite(runner, host, port, ssl_context=ssl_context)
    try:
        await site.start()
    except OSError as exc:
        await runner.cleanup()
        raise ListenError(host, port, exc) from exc
    bound = [s.getsockname()[:2] for s in getattr(site._server, "sockets", None) or []]
    log.info("serving on %s", ", ".join(f"{'https' if ssl_context else 'http'}://{h}:{p}/" for h, p in bound))
    await signals.requested.wait()
    t0 = time.monotonic()
    try:
        await asyncio.wait_for(runner.cleanup(), shutdown_timeout_s + 5.0)
    except TimeoutError:
        log.error("shutdown took over %.0f s; exiting anyway", shutdown_timeout_s + 5.0)
    log.info("stopped in %.2f s", time.monotonic() - t0)
