"""``serve --workers 2`` when processes die, for real:

- the worker holding a browser's session is SIGKILLed: the page notices its silent data channel, says so, and
  offers again by itself; the control process places the new session on a live worker, and results flow again. A
  WHEP session on that worker is ended: its URL says so (404), and ``/status`` counts it;
- the control process is SIGKILLed: its workers die with it, and a new ``serve`` on the same ports starts at once;
- a page that had the events timeline open goes: the control process stops relaying its stream (the workers' live
  clients drop to none), and a clean stop does not wait for it.
"""

from __future__ import annotations

import asyncio
import os
import signal
import subprocess
import sys
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import aiohttp
import numpy as np
import pytest
from aiortc import RTCPeerConnection, RTCSessionDescription
from support.live import REPO, results_channel
from support.mqtt import free_port
from support.pagewatch import watch_of

from edge_app.bench.testvideo import LabelledVideo, write_y4m
from edge_app.config import AppConfig

pytestmark = [pytest.mark.slow, pytest.mark.live]


class Box:
    """``edge-app serve --workers 2`` on free ports."""

    def __init__(self, config: Path, log: Path, port: int | None = None, base_port: int | None = None) -> None:
        self.config, self.log = config, log
        self.port, self.base_port = port or free_port(), base_port or free_port()
        self.base = f"http://127.0.0.1:{self.port}"
        self.proc: subprocess.Popen[bytes] | None = None

    def start(self) -> Box:
        with self.log.open("ab") as out:
            self.proc = subprocess.Popen([sys.executable, "-m", "edge_app", "serve", "--config", str(self.config),
                                          "--workers", "2", "--port", str(self.port)], cwd=REPO, stdout=out,
                                         stderr=subprocess.STDOUT,
                                         env={**os.environ, "EDGE_APP_WORKER_BASE_PORT": str(self.base_port)})
        return self

    async def ready(self, timeout_s: float = 120) -> float:
        t0 = time.monotonic()
        async with aiohttp.ClientSession() as http:
            while time.monotonic() - t0 < timeout_s:
                try:
                    async with http.get(self.base + "/healthz", timeout=aiohttp.ClientTimeout(total=2)) as r:
                        if r.status == 200:
                            return time.monotonic() - t0
                except (aiohttp.ClientError, TimeoutError):
                    pass
                assert self.proc is not None and self.proc.poll() is None, self.log.read_text()[-3000:]
                await asyncio.sleep(0.3)
        raise AssertionError(f"not ready in {timeout_s} s: {self.log.read_text()[-3000:]}")

    async def status(self) -> dict[str, Any]:
        async with aiohttp.ClientSession() as http, http.get(self.base + "/status") as r:
            assert r.status == 200, await r.text()
            return await r.json()  # type: ignore[no-any-return]

    def stop(self) -> float:
        t0 = time.monotonic()
        if self.proc is not None and self.proc.poll() is None:
            self.proc.send_signal(signal.SIGTERM)
            try:
                self.proc.wait(30)
            except subprocess.TimeoutExpired:
                self.proc.kill()
        return time.monotonic() - t0


def _workers_of(base_port: int) -> list[int]:
    found = subprocess.run(["pgrep", "-f", "--", f"--worker ./2 --port ({base_port}|{base_port + 1})"],
                           capture_output=True, text=True)  # "--": the pattern starts with a dash
    assert found.returncode in (0, 1), found.stderr  # 1: none
    return [int(p) for p in found.stdout.split()]


def _config(app_config: Callable[..., AppConfig], **sections: dict[str, object]) -> Path:
    cfg = app_config(server={"ice_host_addresses": ["127.0.0.1"]}, **sections)
    return cfg.base_dir / "config.toml"


async def _whep(base: str, camera: str) -> tuple[RTCPeerConnection, str, list[dict[str, Any]]]:
    """An aiortc player through the control process's WHEP door (the camera's results on a data channel)."""
    pc = RTCPeerConnection()
    pc.addTransceiver("video", direction="recvonly")
    results: list[dict[str, Any]] = []
    results_channel(pc, results.append)
    await pc.setLocalDescription(await pc.createOffer())
    async with aiohttp.ClientSession() as http, http.post(
            f"{base}/whep/{camera}", data=pc.localDescription.sdp, headers={"Content-Type": "application/sdp"}) as r:
        assert r.status == 201, await r.text()
        answer, location = await r.text(), r.headers["Location"]
    await pc.setRemoteDescription(RTCSessionDescription(answer, "answer"))
    return pc, location, results


@pytest.mark.browser
async def test_a_dead_workers_page_offers_again_and_its_whep_session_is_ended(
        app_config: Callable[..., AppConfig], demo_test_split: tuple[np.ndarray, np.ndarray], tmp_path: Path,
        browser: Any) -> None:
    """The page's own camera is placed on worker 0 (both idle: the first), and so is a WHEP player of the demo
    camera (worker 0's); worker 0 is SIGKILLed."""
    box = Box(_config(app_config, demo={"enabled": True, "fps": 10.0}), tmp_path / "control.log").start()
    camera = write_y4m(tmp_path / "camera.y4m", LabelledVideo(demo_test_split[0][:60], demo_test_split[1][:60], 2))
    pc: RTCPeerConnection | None = None
    try:
        await box.ready()
        async with browser(camera) as page:
            watch_of(page).allow(r"status of 503 .*/offer\)$")  # an offer while the worker restarts: retried
            await page.goto(f"{box.base}/")
            await page.click("#connect")
            await page.wait_for_function("() => edge.error || edge.results >= 30", timeout=40_000)
            pc, location, played = await _whep(box.base, "demo")
            await asyncio.sleep(2.0)
            placed = await box.status()
            where = {s["id"]: s["worker"] for s in placed["sessions"]}
            results_before, page_session = await page.evaluate("() => [edge.results, edge.session]")
            victim = next(w["pid"] for w in placed["workers"] if w["index"] == 0)
            os.kill(victim, signal.SIGKILL)
            killed = time.monotonic()
            await page.wait_for_function("() => edge.silences >= 1", timeout=15_000)
            noticed_s = time.monotonic() - killed
            said = await page.evaluate("() => document.getElementById('conn').textContent")
            await page.wait_for_function(f"() => edge.state === 'connected' && edge.results >= {results_before + 30}",
                                         timeout=60_000)
            back_s = time.monotonic() - killed
            new_session = await page.evaluate("() => edge.session")
            after = await box.status()
        async with aiohttp.ClientSession() as http, http.delete(box.base + location) as r:
            deleted = (r.status, await r.json())
        final = await box.status()
    finally:
        if pc is not None:
            await pc.close()
        box.stop()
    print(f"worker 0 killed: the page noticed in {noticed_s:.2f} s ({said!r}), results again after {back_s:.1f} s "
          f"(session on worker {[s['worker'] for s in after['sessions'] if s['id'] == new_session]}); WHEP player "
          f"({len(played)} results): DELETE {deleted}; closed {final['sessions_closed']}")
    assert where.get(page_session) == 0 and sum(1 for w in where.values() if w == 0) == 2, where
    assert noticed_s < 10, "the page noticed the silence (SILENT_MS + PING_MS after the last message, by its clock)"
    assert "went silent" in said and "offering again" in said, said
    assert new_session != page_session and any(s["id"] == new_session for s in after["sessions"])
    assert deleted[0] == 404 and "ended" in deleted[1]["error"], deleted
    assert final["sessions_closed"].get("worker_exit") == 2, final["sessions_closed"]


async def test_workers_die_with_a_killed_control_process_and_a_new_serve_starts_at_once(
        app_config: Callable[..., AppConfig], tmp_path: Path) -> None:
    config = _config(app_config, demo={"enabled": True, "fps": 10.0})
    box = Box(config, tmp_path / "first.log").start()
    second: Box | None = None
    try:
        await box.ready()
        workers = _workers_of(box.base_port)
        assert len(workers) == 2, workers
        assert box.proc is not None
        box.proc.send_signal(signal.SIGKILL)
        box.proc.wait(10)
        t0 = time.monotonic()
        while _workers_of(box.base_port) and time.monotonic() - t0 < 20:
            await asyncio.sleep(0.1)
        gone_s = time.monotonic() - t0
        left = _workers_of(box.base_port)
        second = Box(config, tmp_path / "second.log", box.port, box.base_port).start()
        ready_s = await second.ready()
        st = await second.status()
    finally:
        if box.proc is not None and box.proc.poll() is None:
            box.proc.kill()
        if second is not None:
            second.stop()
        for pid in _workers_of(box.base_port):  # none, unless the test failed
            os.kill(pid, signal.SIGKILL)
    print(f"control SIGKILLed: its workers gone in {gone_s:.2f} s; a new serve ready in {ready_s:.1f} s, workers "
          f"{[(w['index'], w['alive'], w['restarts']) for w in st['workers']]}")
    assert left == [], f"workers outlived their control process: {left}"
    assert all(w["alive"] for w in st["workers"]) and len(st["cameras"]) == 1


async def test_a_gone_pages_live_events_stop_being_relayed_and_a_stop_does_not_wait_for_them(
        app_config: Callable[..., AppConfig], tmp_path: Path) -> None:
    box = Box(_config(app_config, demo={"enabled": True, "fps": 10.0}), tmp_path / "control.log").start()
    try:
        await box.ready()
        async with aiohttp.ClientSession() as http:
            resp = await http.get(box.base + "/api/events/live", timeout=aiohttp.ClientTimeout(total=None))
            await resp.content.readline()  # the stream is open
            open_clients = [w["events"]["live"]["clients"] for w in await _worker_statuses(box)]
            resp.close()  # the page goes, without a word
        t0 = time.monotonic()
        while sum(w["events"]["live"]["clients"] for w in await _worker_statuses(box)) and time.monotonic() - t0 < 15:
            await asyncio.sleep(0.2)
        dropped_s = time.monotonic() - t0
        left = [w["events"]["live"]["clients"] for w in await _worker_statuses(box)]
    finally:
        took = box.stop()
    print(f"live events: workers' clients {open_clients} with the page, {left} {dropped_s:.1f} s after it went; "
          f"SIGTERM took {took:.2f} s")
    assert open_clients == [1, 1], "one relayed stream from each worker"
    assert left == [0, 0], "the relay ended when its client went"
    assert box.proc is not None and box.proc.returncode == 0
    assert took < 5.0, "nothing waited out the 5 s shutdown timeout"


async def _worker_statuses(box: Box) -> list[dict[str, Any]]:
    """Each worker's own /status (the control process merges sessions and cameras, not events)."""
    out = []
    async with aiohttp.ClientSession() as http:
        for port in (box.base_port, box.base_port + 1):
            async with http.get(f"http://127.0.0.1:{port}/status") as r:
                out.append(await r.json())
    return out
