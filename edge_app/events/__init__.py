"""What happened, kept: events from each camera's states (``detector``), in SQLite (``store``), found through the
pipeline registry (``output``), served at ``/api/events`` (``api``). ``attach`` wires them into the app."""

from __future__ import annotations

import asyncio
import time
from collections.abc import AsyncIterator
from importlib import metadata
from typing import Any

from aiohttp import web

from edge_app.appkeys import METRICS_KEY
from edge_app.config import AppConfig
from edge_app.errors import EdgeAppError
from edge_app.events.api import add_routes
from edge_app.events.detector import StateTracker
from edge_app.events.live import LiveFeed
from edge_app.events.metrics import EventsCollector
from edge_app.events.mqtt import MqttOutput
from edge_app.events.output import EventsOutput
from edge_app.events.store import EventStore
from edge_app.events.webhooks import Webhooks
from edge_app.hub import Hub
from streams.tasks import cancel_and_wait

OUTPUT_KEY = web.AppKey("events_output", EventsOutput)
HOOKS_KEY = web.AppKey("webhooks", Webhooks)
MQTT_KEY = web.AppKey("mqtt", MqttOutput)
LIVE_KEY = web.AppKey("events_live", LiveFeed)
RETENTION_EVERY_S = 600.0


DRAIN_S = 3.0  # at a clean stop, the longest the senders may take to deliver what the stop ended


def attach(app: web.Application, config: AppConfig, hub: Hub) -> None:
    """``[events] enabled``: the store opens (closing what a run that did not stop cleanly left open, and telling the
    listeners), follows every camera, enforces retention every 10 minutes. At a clean stop, once the hub has
    stopped: every event going on ends (store, webhooks, MQTT, the live streams), the senders deliver it (at most
    ``DRAIN_S``), the live streams end, and only then does MQTT say ``offline``."""
    ev = config.events
    if not ev.enabled:
        return
    _check_files(config)
    store = EventStore(config.resolve(ev.path), ev.retention_days, ev.max_bytes, ev.min_free_bytes)
    feed = app[LIVE_KEY] = LiveFeed()
    app.router.add_get("/api/events/live", feed.handle)  # before /api/events/{id}, which would match it
    add_routes(app, store)
    labels = {c.name: set(c.events) for c in config.cameras}

    def tracker(camera: str) -> StateTracker:
        wanted = set(ev.labels) | labels.get(camera, set())
        names = set(hub.model_of(camera).class_names) if "*" in wanted else wanted
        return StateTracker(camera, frozenset(names), ev.min_s, ev.min_confidence)

    async def end_and_drain(app: web.Application) -> None:
        """``on_shutdown``, after the hub stopped: what is going on ends, and is delivered."""
        output = app.get(OUTPUT_KEY)
        if output is None:
            return
        output.close(time.time())
        timeout = min(DRAIN_S, config.server.shutdown_timeout_s)
        mqtt = app.get(MQTT_KEY)
        await asyncio.gather(app[HOOKS_KEY].drain(timeout), *([] if mqtt is None else [mqtt.drain(timeout)]))

    async def run(app: web.Application) -> AsyncIterator[None]:
        await asyncio.get_running_loop().run_in_executor(None, store.open)
        hooks = app[HOOKS_KEY] = Webhooks(config.webhooks)
        mqtt = None
        if config.mqtt.enabled:
            mqtt = app[MQTT_KEY] = MqttOutput(config.mqtt, config.resolve, _version(), lambda: _stats(app))
        app[OUTPUT_KEY] = EventsOutput(store, hub.registry, tracker, hub.placement.manifest_name,
                                       ev.snapshots, listeners=[hooks, feed, *([] if mqtt is None else [mqtt])],
                                       snapshot_listeners=[] if mqtt is None else [mqtt.snapshot],
                                       camera_listeners=[] if mqtt is None else [mqtt.add_camera])
        tasks = [asyncio.create_task(_retention(store), name="event-retention"),
                 asyncio.create_task(hooks.run(), name="webhooks")]
        if mqtt is not None:
            tasks.append(asyncio.create_task(mqtt.run(), name="mqtt"))
        collector = EventsCollector(lambda: status(app))
        app[METRICS_KEY].registry.register(collector)
        yield
        app[METRICS_KEY].registry.unregister(collector)
        app[OUTPUT_KEY].close(time.time())  # a stop with no on_shutdown before it (tests that only clean up)
        await cancel_and_wait(*tasks)  # MQTT says offline on its way out
        await asyncio.get_running_loop().run_in_executor(None, store.close)

    app.on_shutdown.append(end_and_drain)
    app.on_shutdown.append(feed.close)  # after the ends were queued to the live streams
    app.cleanup_ctx.append(run)


def _check_files(config: AppConfig) -> None:
    """A TLS file of ``[mqtt]`` that is not there fails the start, naming it (not the first connect, later)."""
    if not config.mqtt.enabled:
        return
    for key in ("tls_ca", "tls_cert", "tls_key"):
        value = getattr(config.mqtt, key)
        if value is not None and not config.resolve(value).is_file():
            raise EdgeAppError(f"[mqtt] {key}: {config.resolve(value)}: no such file (a PEM file, relative to the "
                               "config file's folder)")


def _version() -> str:
    try:
        return metadata.version("edge-app")
    except metadata.PackageNotFoundError:
        return "0"


def _stats(app: web.Application) -> dict[str, Any]:
    output = app[OUTPUT_KEY]
    return {"cameras": output.states(), "changes": dict(output.counts), "store": output.store.status()}


async def _retention(store: EventStore) -> None:
    while True:
        store.enforce_retention()
        await asyncio.sleep(RETENTION_EVERY_S)


def status(app: web.Application) -> dict[str, Any] | None:
    output = app.get(OUTPUT_KEY)
    if output is None:
        return None
    mqtt = app.get(MQTT_KEY)
    return {**output.store.status(), "cameras": output.states(), "changes": dict(output.counts),
            "webhooks": app[HOOKS_KEY].status(), "mqtt": None if mqtt is None else mqtt.status(),
            "live": {"clients": len(app[LIVE_KEY].clients), "cut_off": app[LIVE_KEY].cut_off}}
