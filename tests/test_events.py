"""Events from states, kept in SQLite: the state machine (flicker makes none), the store (restart, retention by age
and size, a damaged file moved aside, paging), and the app end to end on the demo camera."""

from __future__ import annotations

import asyncio
import sqlite3
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import aiohttp
import pytest
from support.live import running_app

from edge_app.config import AppConfig
from edge_app.events.detector import Event, EventChange, StateChange, StateTracker
from edge_app.events.query import Query
from edge_app.events.store import EventStore, EventStoreError


def run(tracker: StateTracker, answers: list[tuple[float, str, float]]) -> list[StateChange | EventChange]:
    out: list[StateChange | EventChange] = []
    for t, label, conf in answers:
        out += tracker.feed(t, label, conf)
    return out


def frames(start: float, seconds: float, label: str, conf: float = 0.9, fps: float = 10.0) -> list[tuple]:
    return [(start + k / fps, label, conf) for k in range(int(seconds * fps))]


def test_a_held_state_starts_an_event_that_is_updated_and_ends_when_another_holds() -> None:
    t = StateTracker("gate", frozenset({"open"}), min_s=2.0, min_confidence=0.6)
    out = run(t, frames(0, 3, "closed") + frames(3, 2.5, "open", 0.7) + frames(5.5, 1.5, "open", 0.95)
              + frames(7, 2.5, "closed"))
    kinds = [c.kind if isinstance(c, EventChange) else f"state:{c.label}" for c in out]
    assert kinds == ["state:closed", "state:open", "new", "update", "end", "state:closed"], kinds
    new = next(c for c in out if isinstance(c, EventChange) and c.kind == "new")
    end = next(c for c in out if isinstance(c, EventChange) and c.kind == "end")
    assert new.after.start_s == 3.0 and new.after.label == "open" and new.after.id.endswith("-gate-open")
    assert end.after.end_s == 7.0, "it ended when the other state began"
    assert end.after.best_confidence == 0.95 and end.after.id == new.after.id


def test_flicker_makes_no_state_and_no_event() -> None:
    t = StateTracker("demo", frozenset({"1", "2"}), min_s=2.0)
    flips = [(k / 15, "1" if (k // 15) % 2 else "2", 0.9) for k in range(15 * 60)]  # a new label every second
    assert run(t, flips) == [] and t.state is None


def test_an_unsure_answer_restarts_the_hold() -> None:
    t = StateTracker("gate", frozenset({"open"}), min_s=2.0, min_confidence=0.6)
    answers = [*frames(0, 1.5, "open"), (1.55, "open", 0.3), *frames(1.6, 1.5, "open")]
    assert run(t, answers) == [], "never 2 s in a row at confidence 0.6"
    assert [c.kind for c in run(t, frames(3.1, 1.0, "open")) if isinstance(c, EventChange)] == ["new"]


def event(k: int, start: float, end: float | None = None, label: str = "open", source: str = "gate") -> Event:
    return Event(source, label, start, 0.9, start, end, id=f"e{k:06d}")


def test_events_survive_a_restart_and_page_with_a_cursor(tmp_path: Path) -> None:
    store = EventStore(tmp_path)
    store.open()
    for k in range(120):
        store.put(event(k, 1000.0 + k, 1000.5 + k, "open" if k % 2 else "parcel", "gate" if k % 3 else "step"),
                  "m1")
    store.put_snapshot("e000007", b"\xff\xd8jpeg")
    assert store.flush()
    store.close()
    again = EventStore(tmp_path)
    again.open()
    seen, cursor = [], None
    while True:
        page = again.query(Query(label="open", limit=25, cursor=cursor))
        seen += page["events"]
        cursor = page["next"]
        if cursor is None:
            break
    assert len(seen) == 60 and [e["start"] for e in seen] == sorted((e["start"] for e in seen), reverse=True)
    assert {e["label"] for e in seen} == {"open"}
    assert again.get("e000007")["has_snapshot"] and again.snapshot_path("e000007").read_bytes() == b"\xff\xd8jpeg"
    assert again.query(Query(camera="step", after=1100.0))["events"][0]["camera"] == "step"
    with pytest.raises(ValueError, match="cursor"):
        again.query(Query(cursor="nonsense"))
    again.close()


def test_retention_deletes_by_age_and_then_by_size(tmp_path: Path) -> None:
    now = time.time()
    store = EventStore(tmp_path, retention_days=1.0, max_bytes=10**12)
    store.open()
    store.put(event(1, now - 3 * 86400, now - 3 * 86400 + 5), "m")  # ended 3 days ago: goes
    store.put(event(2, now - 60, None), "m")  # going on: stays
    store.enforce_retention(now)
    assert store.flush()
    assert [e["id"] for e in store.query(Query())["events"]] == ["e000002"]
    for k in range(10, 30):
        store.put(event(k, now - 1000 + k, now - 999 + k), "m")
        store.put_snapshot(f"e{k:06d}", b"x" * 50_000)
    assert store.flush()
    store.max_bytes = store.size_bytes() - 300_000  # about six snapshots too many
    store.enforce_retention(now)
    assert store.flush()
    left = [e["id"] for e in store.query(Query(limit=100))["events"]]
    assert store.size_bytes() <= store.max_bytes and "e000010" not in left and "e000029" in left, left
    assert not store.snapshot_path("e000010").exists()
    store.close()


def test_a_damaged_database_is_moved_aside_and_a_fresh_one_made(tmp_path: Path, caplog: Any) -> None:
    (tmp_path / "events.db").write_bytes(b"this is not a database" * 100)
    store = EventStore(tmp_path)
    store.open()
    assert store.moved_aside is not None and store.moved_aside.read_bytes().startswith(b"this is not")
    assert str(tmp_path / "events.db") in caplog.text and "moved it aside" in caplog.text
    store.put(event(1, 1.0, 2.0), "m")
    assert store.flush() and store.query(Query())["events"][0]["id"] == "e000001"
    assert store.status()["moved_aside"] == str(store.moved_aside)
    store.close()


def test_a_locked_database_is_one_clear_error(tmp_path: Path) -> None:
    first = EventStore(tmp_path)
    first.open()
    holder = sqlite3.connect(tmp_path / "events.db", isolation_level=None)
    holder.execute("BEGIN EXCLUSIVE")
    try:
        with pytest.raises(EventStoreError, match="locked by another process"):
            EventStore(tmp_path).open()
    finally:
        holder.execute("ROLLBACK")
        holder.close()
        first.close()


@pytest.mark.live
@pytest.mark.slow
async def test_the_demo_camera_makes_events_that_the_api_returns_and_a_restart_keeps(
        app_config: Callable[..., AppConfig], tmp_path: Path) -> None:
    """Each demo image held 3 s (past min_s = 1.5) is a state, and each is an event of its label; at the default
    hold (1 s per image) the frame-by-frame flips make none."""
    events_dir = tmp_path / "events"
    cfg = app_config(demo={"enabled": True, "fps": 15.0, "hold_frames": 45},
                     events={"path": str(events_dir), "min_s": 1.5, "min_confidence": 0.3, "labels": ["*"]})
    async with running_app(cfg) as base, aiohttp.ClientSession() as http:
        await asyncio.sleep(8.0)
        async with http.get(base + "/api/events?camera=demo&limit=10") as r:
            page = await r.json()
        async with http.get(base + "/status") as r:
            status = (await r.json())["events"]
        first = page["events"][-1]
        async with http.get(f"{base}/api/events/{first['id']}/snapshot.jpg") as r:
            jpeg = await r.read() if r.status == 200 else b""
    print(f"events: {[(e['label'], e['start'], e['end']) for e in page['events']]}; status {status}")
    assert len(page["events"]) >= 1 and jpeg[:2] == b"\xff\xd8"
    async with running_app(cfg) as base, aiohttp.ClientSession() as http, \
            http.get(f"{base}/api/events/{first['id']}") as r:
        assert r.status == 200 and (await r.json())["label"] == first["label"], "kept across a restart"
    flicker = app_config(demo={"enabled": True, "fps": 15.0, "hold_frames": 15},
                         events={"path": str(tmp_path / "flicker"), "min_s": 1.5, "labels": ["*"]})
    async with running_app(flicker) as base, aiohttp.ClientSession() as http:
        await asyncio.sleep(6.0)
        async with http.get(base + "/api/events") as r:
            assert (await r.json())["events"] == [], "images held 1 s each never hold 1.5 s"


@pytest.mark.live
@pytest.mark.slow
async def test_webhooks_are_signed_retried_and_counted_and_never_stall_the_pipeline(
        app_config: Callable[..., AppConfig], tmp_path: Path) -> None:
    import hashlib
    import hmac
    import json
    import socket

    from aiohttp import web

    secret = "webhook-secret-0123456789"
    got: list[tuple[str, bool, dict[str, Any]]] = []

    async def receive(request: web.Request) -> web.Response:
        body = await request.read()
        good = "sha256=" + hmac.new(secret.encode(), body, hashlib.sha256).hexdigest()
        got.append((request.headers["X-Edge-Event"], hmac.compare_digest(good, request.headers.get(
            "X-Edge-Signature-256", "")), json.loads(body)))
        return web.Response(status=204)

    receiver = web.Application()
    receiver.router.add_post("/hook", receive)
    runner = web.AppRunner(receiver)
    await runner.setup()
    site = web.TCPSite(runner, "127.0.0.1", 0)
    await site.start()
    port = site._server.sockets[0].getsockname()[1]  # type: ignore[union-attr]
    with socket.socket() as s:  # a port nobody listens on: the receiver that is down
        s.bind(("127.0.0.1", 0))
        down = s.getsockname()[1]
    cfg = app_config(demo={"enabled": True, "fps": 15.0, "hold_frames": 45},
                     events={"path": str(tmp_path / "events"), "min_s": 1.5, "min_confidence": 0.3, "labels": ["*"]},
                     )
    text = (cfg.base_dir / "config.toml").read_text() + (
        f'[[webhooks]]\nurl = "http://127.0.0.1:{port}/hook"\nevents = ["new", "update", "end"]\n'
        f'secret = "{secret}"\n[[webhooks]]\nurl = "http://127.0.0.1:{down}/hook"\nretries = 1\ntimeout_s = 0.5\n')
    (cfg.base_dir / "config.toml").write_text(text)
    from edge_app.config import load_config

    cfg = load_config(cfg.base_dir / "config.toml")
    try:
        async with running_app(cfg) as base, aiohttp.ClientSession() as http:
            await asyncio.sleep(9.0)
            async with http.get(base + "/status") as r:
                status = await r.json()
            # the receiver's count as /status is read: a delivery may be between the receiver and the sender's count
            # (the test compared /status with the count after the stop, which now also delivers the event the stop
            # ends: it was the test that was wrong, not the product)
            received = len(got)
    finally:
        await runner.cleanup()
    hooks = status["events"]["webhooks"]
    demo = next(c for c in status["cameras"] if c["name"] == "demo")
    print(f"webhooks: {len(got)} delivered {[k for k, _, _ in got]}; status {hooks}; demo analysed "
          f"{demo['frames_analysed']}")
    assert got and all(ok for _, ok, _ in got), "every delivery carries a good signature"
    assert {"new", "end"} <= {k for k, _, _ in got} and got[0][2]["after"]["source"] == "demo"
    assert received - 1 <= hooks[0]["sent"] <= received and hooks[0]["failed"] == 0, (received, hooks[0])
    assert got[-1][0] == "end" and got[-1][2]["after"]["ended_by"] == "stop", "the stop ended the event going on"
    assert hooks[1]["failed"] >= 1 and hooks[1]["retries"] >= 1 and hooks[1]["sent"] == 0, hooks[1]
    assert demo["frames_analysed"] >= 15 * 7, "the pipeline never waited on the receiver that was down"
    assert secret not in json.dumps(status)
