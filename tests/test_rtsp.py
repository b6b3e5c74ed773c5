"""A real RTSP camera (GStreamer's gst-rtsp-server on loopback) read by the app and watched in Chromium.

The server is stopped mid-stream and started again on the same port: the
app notices, backs off, reconnects by itself and the browser's results
resume.  The camera is also absent when the app starts, so the first
connection already goes through the backoff path.
"""

from __future__ import annotations

import asyncio
import contextlib
import shutil
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import aiohttp
import numpy as np
import pytest
from support.live import results_channel, skip_or_fail

from edge_app.bench.rtsp_camera import RtspServer, free_port, gst_rtsp_available
from edge_app.bench.testvideo import LabelledVideo, write_jpegs

REPO = Path(__file__).resolve().parents[1]
ARTIFACTS = REPO / "artifacts" / "test-rtsp"

pytestmark = [pytest.mark.slow, pytest.mark.browser, pytest.mark.live]


def _gst_rtsp_available() -> bool:
    return gst_rtsp_available() and shutil.which("chromium") is not None


@pytest.fixture
def rtsp_server(demo_test_split: tuple[np.ndarray, np.ndarray], tmp_path: Path) -> Iterator[tuple[RtspServer,
                                                                                                 LabelledVideo]]:
    if not _gst_rtsp_available():
        skip_or_fail("needs GStreamer's RTSP server for the system Python and chromium (.ci/run installs them)")
    images, labels = demo_test_split
    video = LabelledVideo(images[100:160], labels[100:160], hold=3)
    server = RtspServer(write_jpegs(tmp_path / "frames", video), free_port())
    try:
        yield server, video
    finally:
        server.stop()


async def _status(base: str) -> dict[str, Any]:
    async with aiohttp.ClientSession() as http, http.get(f"{base}/status") as r:
        return dict(await r.json())


async def _wait(pred: Callable[[], Any], timeout_s: float, what: str) -> None:
    t_end = time.monotonic() + timeout_s
    while time.monotonic() < t_end:
        if await pred():
            return
        await asyncio.sleep(0.2)
    raise AssertionError(f"timed out after {timeout_s} s waiting for {what}")


async def test_rtsp_camera_reconnects_and_browser_resumes(app_config: Callable[..., Any], serve: Any,
                                                          browser: Any, rtsp_server: tuple[RtspServer, LabelledVideo]
                                                          ) -> None:
    server, video = rtsp_server
    cfg = app_config(cameras=[{"name": "door", "url": server.url, "transport": "tcp", "probe": True,
                               "backoff_initial_s": 0.25, "backoff_max_s": 1.0, "read_timeout_s": 3.0}])
    async with serve(cfg) as base, browser() as page:
        # the camera is not there yet: the app keeps trying
        await _wait(lambda: _camera_has(base, lambda c: c["reconnects"] >= 1), 10, "a reconnect attempt")
        server.start()
        await _wait(lambda: _camera_has(base, lambda c: c["state"] == "streaming"), 20, "the camera to stream")
        await page.goto(f"{base}/?camera=door")
        await page.click("#connect")
        await page.wait_for_function("() => edge.error || (edge.results >= 60 && edge.framesDecoded > 30)",
                                     timeout=30_000)
        assert await page.evaluate("edge.error") is None
        before = await page.evaluate("edge.recent")

        server.stop()  # the camera drops mid-stream
        await _wait(lambda: _camera_has(base, lambda c: c["state"] != "streaming"), 10, "the drop to be noticed")
        await page.wait_for_function("() => edge.sourceState && edge.sourceState.state === 'reconnecting'",
                                     timeout=5_000)  # the viewer is told on its data channel, the page shows it
        shown_down = await page.text_content("#source-state")
        dropped_at = await page.evaluate("edge.results")
        await asyncio.sleep(1.5)
        with contextlib.suppress(Exception):
            server.start()
        await _wait(lambda: _camera_has(base, lambda c: c["state"] == "streaming" and c["connects"] == 2), 30,
                    "the app to reconnect by itself")
        await page.wait_for_function(f"() => edge.results >= {dropped_at} + 60", timeout=30_000)
        await page.wait_for_function("() => edge.sourceState.state === 'streaming'", timeout=5_000)
        assert await page.is_hidden("#source-state")
        # a second viewer, data channel only (no video m-line): results for the same, once-analysed frames
        dc_results = await _data_channel_watcher(base, "door", 30)
        await _wait(lambda: _camera_has(base, lambda c: c["viewers"] == 1), 15, "the closed viewer to be cleaned up")
        status = await _status(base)
        async with aiohttp.ClientSession() as http, http.get(f"{base}/metrics") as r:
            metrics = await r.text()
        ARTIFACTS.mkdir(parents=True, exist_ok=True)
        await page.screenshot(path=str(ARTIFACTS / "page.png"), full_page=True)
        after = await page.evaluate("edge.recent")
    cam = status["cameras"][0]
    assert shown_down is not None and shown_down.startswith("camera door: reconnecting"), shown_down
    assert len(dc_results) >= 30 and all(r["source"] == "door" for r in dc_results)
    browser_frames = {r["frame"] for r in after}
    assert browser_frames & {r["frame"] for r in dc_results} or len(after) < 30, "both viewers see the same analyses"
    assert cam["frames_analysed"] <= cam["frames"], "each camera frame is analysed at most once, whoever watches"
    assert cam["viewers"] == 1 and cam["connects"] == 2 and cam["reconnects"] >= 2
    assert 'edge_camera_state{camera="door",state="streaming"} 1.0' in metrics
    assert 'edge_camera_reconnects_total{camera="door"}' in metrics
    results = [r for r in before + after if r["stamp"] is not None and r["stamp"] < video.num_frames]
    accuracy = float(np.mean([r["raw"]["class"] == video.label_of_stamp(r["stamp"]) for r in results]))
    print(f"RTSP: {len(results)} stamped results, raw accuracy {accuracy:.3f}, camera {cam}")
    assert len(results) >= 100
    assert accuracy >= 0.75, accuracy


async def _data_channel_watcher(base: str, camera: str, count: int) -> list[dict[str, Any]]:
    from aiortc import RTCPeerConnection, RTCSessionDescription

    pc = RTCPeerConnection()
    got: list[dict[str, Any]] = []
    done = asyncio.Event()

    def on_result(msg: dict[str, Any]) -> None:
        got.append(msg)
        if len(got) >= count:
            done.set()

    results_channel(pc, on_result)

    try:
        await pc.setLocalDescription(await pc.createOffer())
        body = {"sdp": pc.localDescription.sdp, "type": "offer", "camera": camera}
        async with aiohttp.ClientSession() as http, http.post(f"{base}/offer", json=body) as r:
            answer = await r.json()
            assert r.status == 200, answer
        await pc.setRemoteDescription(RTCSessionDescription(answer["sdp"], answer["type"]))
        await asyncio.wait_for(done.wait(), 20)
        status = await _status(base)
        assert status["cameras"][0]["viewers"] == 2
    finally:
        await pc.close()
    return got


async def _camera_has(base: str, pred: Callable[[dict[str, Any]], bool]) -> bool:
    return pred((await _status(base))["cameras"][0])
