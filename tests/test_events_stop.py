"""An event going on when the app stops, as its listeners see it, with ``edge-app serve`` as a real process, Debian's
mosquitto with its own ``mosquitto_sub``, a webhook receiver and a live-stream reader:

- a clean stop (SIGTERM) ends it everywhere (the store, the webhook, MQTT's ``OFF``, the live stream) before MQTT
  says ``offline``;
- a crash (SIGKILL) leaves it open; the next start closes it at the last time the store heard of the camera, marks
  it ended by restart, and tells the webhook and MQTT.
"""

from __future__ import annotations

import asyncio
import json
import signal
import sqlite3
import subprocess
import sys
import time
from collections.abc import AsyncIterator, Callable
from contextlib import asynccontextmanager
from pathlib import Path
from typing import Any

import aiohttp
import pytest
from aiohttp import web
from support.live import REPO
from support.mqtt import Broker, Subscriber, broker, free_port

from edge_app.config import AppConfig

pytestmark = [pytest.mark.slow, pytest.mark.live]


class Receiver:
    """A webhook receiver on a free port: every delivery (its kind and body), in order."""

    def __init__(self) -> None:
        self.got: list[dict[str, Any]] = []
        self.url = ""

    async def handle(self, request: web.Request) -> web.Response:
        self.got.append(json.loads(await request.read()))
        return web.Response(status=204)

    def of(self, kind: str, event_id: str | None = None) -> list[dict[str, Any]]:
        return [g for g in self.got if g["type"] == kind and (event_id is None or g["after"]["id"] == event_id)]


@asynccontextmanager
async def receiving() -> AsyncIterator[Receiver]:
    rx = Receiver()
    app = web.Application()
    app.router.add_post("/hook", rx.handle)
    runner = web.AppRunner(app)
    await runner.setup()
    site = web.TCPSite(runner, "127.0.0.1", 0)
    await site.start()
    rx.url = f"http://127.0.0.1:{site._server.sockets[0].getsockname()[1]}/hook"  # type: ignore[union-attr]
    try:
        yield rx
    finally:
        await runner.cleanup()


@asynccontextmanager
async def _stopping(sub: Subscriber) -> AsyncIterator[Subscriber]:
    try:
        yield sub
    finally:
        sub.stop()


def _config(app_config: Callable[..., AppConfig], tmp_path: Path, b: Broker, hook: str) -> Path:
    """The demo camera holding its first image for 66 s: one state, one event that goes on until the app stops."""
    cfg = app_config(demo={"enabled": True, "fps": 15.0, "hold_frames": 1000},
                     events={"path": str(tmp_path / "events"), "min_s": 0.5, "min_confidence": 0.0, "labels": ["*"]},
                     mqtt={"enabled": True, "port": b.port, "prefix": "edge", "client_id": "edge-stop-test"},
                     server={"ice_host_addresses": ["127.0.0.1"], "shutdown_timeout_s": 5.0})
    path = cfg.base_dir / "config.toml"
    path.write_text(path.read_text() + f'\n[[webhooks]]\nurl = "{hook}"\nevents = ["new", "update", "end"]\n')
    return path


def _start(config: Path, port: int, log: Path) -> subprocess.Popen[bytes]:
    with log.open("ab") as out:
        return subprocess.Popen([sys.executable, "-m", "edge_app", "serve", "--config", str(config), "--port",
                                 str(port)], cwd=REPO, stdout=out, stderr=subprocess.STDOUT)


async def _until(predicate: Callable[[], object], timeout_s: float, what: str) -> None:
    deadline = time.monotonic() + timeout_s
    while not predicate():
        if time.monotonic() > deadline:
            raise AssertionError(f"no {what} within {timeout_s:.0f} s")
        await asyncio.sleep(0.1)


def _row(tmp_path: Path, event_id: str) -> dict[str, Any]:
    with sqlite3.connect(tmp_path / "events" / "events.db") as conn:
        conn.row_factory = sqlite3.Row
        row = conn.execute("SELECT * FROM events WHERE id = ?", (event_id,)).fetchone()
    return dict(row)


async def _get_when_up(url: str) -> Any:
    """GET ``url`` once the server listens (it tells the listeners what it closed before it listens)."""
    async with aiohttp.ClientSession() as http:
        for _ in range(300):
            try:
                async with http.get(url) as r:
                    return await r.json()
            except aiohttp.ClientConnectionError:
                await asyncio.sleep(0.2)
    raise AssertionError(f"{url}: the server never listened")


async def _read_live(url: str, blocks: list[str]) -> None:
    async with aiohttp.ClientSession() as http, http.get(url, timeout=aiohttp.ClientTimeout(total=60)) as r:
        buf = ""
        async for chunk in r.content.iter_any():
            buf += chunk.decode()
            while "\n\n" in buf:
                block, buf = buf.split("\n\n", 1)
                blocks.append(block)


async def test_a_clean_stop_ends_the_event_for_every_listener_before_offline(
        app_config: Callable[..., AppConfig], tmp_path: Path) -> None:
    port = free_port()
    with broker(tmp_path / "broker") as b:
        sub = Subscriber(b, ["edge/#"], client_id="edge-stop-sub").start()
        async with receiving() as rx, _stopping(sub):
            app = _start(_config(app_config, tmp_path, b, rx.url), port, tmp_path / "app.log")
            try:
                await _until(lambda: rx.of("new"), 90, "event at the webhook")
                event = rx.of("new")[0]["after"]
                live: list[str] = []
                reader = asyncio.create_task(_read_live(f"http://127.0.0.1:{port}/api/events/live", live))
                await _until(lambda: live, 10, "live stream")
                t0 = time.monotonic()
                app.send_signal(signal.SIGTERM)
                code = await asyncio.to_thread(app.wait, 20)
                took = time.monotonic() - t0
                await asyncio.wait_for(reader, 10)  # the stream ended with the server
                await asyncio.to_thread(sub.wait_for, "edge/available", b"offline", 10.0)
            finally:
                if app.poll() is None:
                    app.kill()
    label_topic = f"edge/demo/{event['label']}"
    order = [(m.topic, m.payload) for m in sub.messages if m.topic in (label_topic, "edge/available")]
    ended = [e for e in rx.of("end") if e["after"]["id"] == event["id"]]
    row = _row(tmp_path, event["id"])
    print(f"clean stop in {took:.2f} s (exit {code}): webhook {[g['type'] for g in rx.got]}; live "
          f"{[blk.splitlines()[0] for blk in live]}; MQTT {order[-4:]}; store {row}")
    assert code == 0 and took < 5.0 + 3.0
    assert len(ended) == 1, f"the webhook got the end: {[g['type'] for g in rx.got]}"
    assert order[-2:] == [(label_topic, b"OFF"), ("edge/available", b"offline")], order
    assert any(blk.startswith("event: end") and event["id"] in blk for blk in live), live
    assert row["end"] is not None and row.get("ended_by") == "stop", row
    assert ended[0]["after"]["end_s"] == row["end"] and ended[0]["after"]["ended_by"] == "stop"


async def test_after_a_crash_the_next_start_ends_the_event_left_open_and_tells_the_listeners(
        app_config: Callable[..., AppConfig], tmp_path: Path) -> None:
    port = free_port()
    with broker(tmp_path / "broker") as b:
        sub = Subscriber(b, ["edge/#"], client_id="edge-crash-sub").start()
        async with receiving() as rx, _stopping(sub):
            config = _config(app_config, tmp_path, b, rx.url)
            app = _start(config, port, tmp_path / "app.log")
            try:
                await _until(lambda: rx.of("new"), 90, "event at the webhook")
                event = rx.of("new")[0]["after"]
                await asyncio.sleep(3.0)  # the event goes on; the store hears of the camera meanwhile
                app.send_signal(signal.SIGKILL)
                await asyncio.to_thread(app.wait, 10)
                killed = time.time()
                left = _row(tmp_path, event["id"])
                app = _start(config, port, tmp_path / "app.log")
                await _until(lambda: rx.of("end", event["id"]), 90, "end of the crashed run's event")
                shown = await _get_when_up(f"http://127.0.0.1:{port}/api/events/{event['id']}")
                await _until(lambda: any(json.loads(m.payload).get("type") == "end" for m in sub.on("edge/events")),
                             10, "end on MQTT")
            finally:
                app.send_signal(signal.SIGTERM)
                try:
                    await asyncio.to_thread(app.wait, 20)
                except subprocess.TimeoutExpired:
                    app.kill()
    told = rx.of("end", event["id"])[0]["after"]
    mqtt_end = [json.loads(m.payload) for m in sub.on("edge/events") if json.loads(m.payload).get("type") == "end"]
    print(f"crash: left open {left['end']}; after restart {shown}; killed at {killed:.2f}; webhook end {told}")
    assert left["end"] is None, "SIGKILL left it open"
    assert shown["end"] is not None and shown["ended_by"] == "restart"
    assert killed - 4.0 <= shown["end"] <= killed, "it ended about when the store last heard of the camera"
    assert shown["end"] >= event["start_s"]
    assert told["end_s"] == shown["end"] and told["ended_by"] == "restart"
    assert any(e["after"]["id"] == event["id"] for e in mqtt_end), mqtt_end
