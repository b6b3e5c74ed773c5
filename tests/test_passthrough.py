"""A camera's own H.264 goes to the viewers who draw the analysis themselves, with no decode-encode: nothing is
rendered or encoded for them, they decode the camera's picture at its own size, and the results still flow. A
camera that sends B-frames is refused (with the reason in /status), and its viewers get annotated video."""

from __future__ import annotations

import asyncio
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import aiohttp
import pytest
from support.live import skip_or_fail

from edge_app.bench.rtsp_camera import RtspServer, free_port
from edge_app.bench.viewers import Viewer, first_camera

pytestmark = [pytest.mark.slow, pytest.mark.live]
ARTIFACTS = Path(__file__).resolve().parents[1] / "artifacts" / "test-passthrough"


@pytest.fixture
def rtsp_camera(camera_frames: Path) -> Iterator[RtspServer]:
    server = RtspServer(camera_frames, free_port(), size="640x480")
    server.start()
    yield server
    server.stop()


async def _until(http: aiohttp.ClientSession, base: str, pred: Callable[[dict[str, Any]], bool],
                 timeout_s: float = 20.0) -> dict[str, Any]:
    t_end = time.monotonic() + timeout_s
    while True:
        cam = await first_camera(http, base)
        if pred(cam):
            return cam
        if time.monotonic() > t_end:
            raise AssertionError(f"camera never got there: {cam}")
        await asyncio.sleep(0.2)


async def test_the_cameras_own_h264_reaches_viewers_without_a_transcode(app_config: Callable[..., Any], serve: Any,
                                                                      rtsp_camera: RtspServer) -> None:
    cfg = app_config(cameras=[{"name": "cam", "url": rtsp_camera.url, "transport": "tcp"}])
    async with serve(cfg) as base, aiohttp.ClientSession() as http:
        await _until(http, base, lambda c: c["passthrough"]["possible"])
        a, b = Viewer("camera"), Viewer("camera")
        await a.join(http, base)
        await b.join(http, base)
        await asyncio.sleep(5.0)
        both = await first_camera(http, base)
        c = Viewer()  # a viewer that wants the analysis drawn in gets it from the one encoder, as before
        await c.join(http, base)
        await asyncio.sleep(3.0)
        mixed = await first_camera(http, base)
        for v in (a, b, c):
            await v.pc.close()
        await asyncio.sleep(1.5)
        after = await first_camera(http, base)
    pt = both["passthrough"]
    print(f"two passthrough viewers: {pt}, rendered {both['frames_rendered']}, encoders {both['encoders']}; "
          f"decoded a {a.frames} b {b.frames} c {c.frames} at {a.sizes} / {c.sizes}; results a {a.results}; "
          f"then {mixed['passthrough']} and {mixed['encoders']}")
    assert pt["viewers"] == 2 and pt["frames_forwarded"] >= 100, pt
    assert both["encoders"] == [] and both["frames_rendered"] == 0, "nothing rendered or encoded for them"
    assert a.pictures == ["camera"] and c.pictures == ["annotated"], (a.pictures, c.pictures)
    assert a.frames >= 90 and b.frames >= 90, (a.frames, b.frames)
    assert a.sizes == {(640, 480)} == b.sizes, "the camera's own picture, at its own size"
    assert a.results >= 90 and b.results >= 90, "the results still flow"
    assert 1.0e6 < pt["bitrate_bps"] < 4.0e6, "the camera's 2 Mbit/s, as it is"
    assert mixed["passthrough"]["viewers"] == 2 and len(mixed["encoders"]) == 1 and c.frames >= 30
    assert after["passthrough"] == {"possible": True, "reason": None, "viewers": 0}


async def test_a_camera_with_b_frames_is_transcoded(app_config: Callable[..., Any], serve: Any,
                                                    camera_frames: Path) -> None:
    server = RtspServer(camera_frames, free_port(), size="640x480", bframes=2)
    server.start()
    try:
        cfg = app_config(cameras=[{"name": "cam", "url": server.url, "transport": "tcp"}])
        async with serve(cfg) as base, aiohttp.ClientSession() as http:
            cam = await _until(http, base, lambda c: c["state"] == "streaming" and c["frames"] >= 60)
            v = Viewer("camera")
            await v.join(http, base)
            await asyncio.sleep(4.0)
            watched = await first_camera(http, base)
            await v.pc.close()
    finally:
        server.stop()
    print(f"B-frames: {cam['passthrough']}; viewer got {v.pictures}, {v.frames} frames; {watched['encoders']}")
    assert not cam["passthrough"]["possible"] and "B-frames" in cam["passthrough"]["reason"], cam["passthrough"]
    assert v.pictures == ["annotated"] and v.frames >= 30 and len(watched["encoders"]) == 1


@pytest.mark.browser
async def test_the_page_draws_the_analysis_over_the_cameras_own_picture(app_config: Callable[..., Any], serve: Any,
                                                                       browser: Any, rtsp_camera: RtspServer
                                                                       ) -> None:
    """Chromium watches the camera: it gets the camera's own H.264 and draws each result over the frame it belongs
    to (matched by when its packets came; with ?probe=1 the counter in the picked frame is checked)."""
    cfg = app_config(cameras=[{"name": "cam", "url": rtsp_camera.url, "transport": "tcp", "probe": True}])
    async with serve(cfg) as base, browser() as page, aiohttp.ClientSession() as http:
        await _until(http, base, lambda c: c["passthrough"]["possible"])
        await page.goto(f"{base}/?camera=cam&probe=1")
        await page.click("#connect")
        await page.wait_for_function("() => edge.error || (edge.results >= 120 && edge.framesDecoded >= 60"
                                     " && edge.matcher && edge.matcher.errorsFrames.length >= 60)", timeout=60_000)
        seen = await page.evaluate("() => { const e = edge.matcher.errorsFrames, v = document.getElementById('video');"
                                   " return {error: edge.error, picture: edge.picture, width: v.videoWidth,"
                                   " decoded: edge.framesDecoded, drawn: edge.overlayDrawn, results: edge.results,"
                                   " matched: edge.matcher.matched, unmatched: edge.matcher.unmatched,"
                                   " checked: e.length, exact: e.filter((d) => d === 0).length,"
                                   " within_one: e.filter((d) => Math.abs(d) <= 1).length,"
                                   " off_by: e.reduce((h, d) => { h[d] = (h[d] || 0) + 1; return h; }, {})}; }")
        page.on("console", lambda m: print("console:", m.text))
        cam = await first_camera(http, base)
        ARTIFACTS.mkdir(parents=True, exist_ok=True)
        await page.screenshot(path=str(ARTIFACTS / "camera-own-picture.png"))
    print(f"camera's own picture in Chromium: {seen}; server: {cam['passthrough']}, rendered {cam['frames_rendered']}")
    assert seen["error"] is None and seen["picture"] == "camera" and seen["width"] == 640, seen
    assert cam["passthrough"]["viewers"] == 1 and cam["frames_rendered"] == 0 and cam["encoders"] == []
    assert seen["matched"] >= 0.8 * (seen["matched"] + seen["unmatched"]), f"most results found their frame: {seen}"
    assert seen["exact"] >= 0.7 * seen["checked"] and seen["within_one"] >= 0.95 * seen["checked"], \
        f"each result is drawn over the frame it belongs to: {seen}"


async def test_a_congested_viewer_moves_to_annotated_video(app_config: Callable[..., Any],
                                                           rtsp_camera: RtspServer) -> None:
    """The camera's bitrate cannot follow a path: when the viewer's rate controller cuts (here: receiver reports
    of 30 % loss, fed to the session as RTCP would), the viewer moves to the camera's encoder, which adapts; the
    other viewer keeps the camera's own picture, and the moved one keeps decoding."""
    from aiohttp import web

    from edge_app.appkeys import HUB_KEY
    from edge_app.doors.server import create_app
    from edge_app.factory import inference_service

    cfg = app_config(cameras=[{"name": "cam", "url": rtsp_camera.url, "transport": "tcp"}])
    app = create_app(cfg, inference_service(cfg))
    runner = web.AppRunner(app)
    await runner.setup()
    site = web.TCPSite(runner, "127.0.0.1", 0)
    await site.start()
    base = f"http://127.0.0.1:{site._server.sockets[0].getsockname()[1]}"  # type: ignore[union-attr]
    try:
        async with aiohttp.ClientSession() as http:
            await _until(http, base, lambda c: c["passthrough"]["possible"])
            a, b = Viewer("camera"), Viewer("camera")
            await a.join(http, base)
            await b.join(http, base)
            await asyncio.sleep(3.0)
            hub = app[HUB_KEY]
            congested = next(s.video for s in hub.sessions.values() if s.video is not None and s.video.passthrough)
            frames_before = {id(v): v.frames for v in (a, b)}
            congested.adapt(0.3, None)  # a receiver report of 30 % loss
            await asyncio.sleep(3.0)
            cam = await first_camera(http, base)
            moved = next(v for v in (a, b) if v.pictures[-1:] == ["annotated"])
            kept = b if moved is a else a
            for v in (a, b):
                await v.pc.close()
    finally:
        await runner.cleanup()
    print(f"after the cut: {cam['passthrough']}, {cam['encoders']}; moved viewer {moved.pictures} "
          f"{frames_before[id(moved)]} -> {moved.frames} frames at {moved.sizes}")
    assert cam["passthrough"]["viewers"] == 1 and len(cam["encoders"]) == 1 and cam["encoders"][0]["viewers"] == 1
    assert moved.pictures == ["camera", "annotated"] and kept.pictures == ["camera"]
    assert moved.frames >= frames_before[id(moved)] + 30, "the moved viewer keeps decoding"
    assert kept.frames >= frames_before[id(kept)] + 60


@pytest.mark.browser
async def test_firefox_gets_a_picture_it_can_decode(app_config: Callable[..., Any], serve: Any,
                                                    rtsp_camera: RtspServer) -> None:
    """Firefox offers H.264 only with its OpenH264 plugin, which it downloads (never, here): whichever picture the
    server picks for it, it decodes it, and the page knows which it is."""
    from support.firefox_bidi import available, firefox_page

    if not available():
        skip_or_fail("needs Debian's firefox-esr (apt-get install firefox-esr; .ci/test does)")
    cfg = app_config(cameras=[{"name": "cam", "url": rtsp_camera.url, "transport": "tcp"}])
    async with serve(cfg) as base, aiohttp.ClientSession() as http, firefox_page() as page:
        await _until(http, base, lambda c: c["passthrough"]["possible"])
        await page.goto(f"{base}/?camera=cam")
        await page.evaluate("document.getElementById('connect').click()")
        try:
            seen = await page.wait_for(
                "edge.error ? {error: edge.error} : edge.results >= 90 && edge.framesDecoded >= 60 && edge.picture "
                "&& {picture: edge.picture, decoded: edge.framesDecoded, drawn: edge.overlayDrawn, "
                "width: document.getElementById('video').videoWidth}", timeout_s=60)
        except TimeoutError:
            state = await page.wait_for("({state: edge.state, results: edge.results, decoded: edge.framesDecoded, "
                                        "picture: edge.picture, error: edge.error})", timeout_s=5)
            raise AssertionError(f"Firefox never got there: {state}; camera {await first_camera(http, base)}") from None
        cam = await first_camera(http, base)
    print(f"Firefox watching the camera: {seen}; server: {cam['passthrough']}, encoders {cam['encoders']}")
    assert "error" not in seen and seen["width"] == 640, seen
    if seen["picture"] == "camera":
        assert cam["passthrough"]["viewers"] == 1 and seen["drawn"] >= 60, (seen, cam)
    else:
        assert len(cam["encoders"]) == 1 and cam["passthrough"]["viewers"] == 0, cam
