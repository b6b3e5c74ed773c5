"""Headless Chromium (Debian's, driven by Playwright) against the real app over loopback WebRTC.

Chromium's fake camera plays a generated y4m of labelled, stamped demo-data
frames; the page connects, gets annotated video and per-frame JSON back,
and the results are checked against the video's labels.  A screenshot of
the page is written to artifacts/test-browser/.
"""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path
from typing import Any

import numpy as np
import pytest

from edge_app.bench.testvideo import LabelledVideo, write_y4m

REPO = Path(__file__).resolve().parents[1]
ARTIFACTS = REPO / "artifacts" / "test-browser"
pytestmark = [pytest.mark.browser, pytest.mark.slow, pytest.mark.live]


@pytest.fixture(scope="module")
def fake_camera(demo_test_split: tuple[np.ndarray, np.ndarray], tmp_path_factory: pytest.TempPathFactory
                ) -> tuple[Path, LabelledVideo]:
    images, labels = demo_test_split
    video = LabelledVideo(images[:80], labels[:80], hold=2)
    return write_y4m(tmp_path_factory.mktemp("camera") / "camera.y4m", video), video


async def test_browser_camera_round_trip(app_config: Callable[..., Any], serve: Any, browser: Any,
                                         fake_camera: tuple[Path, LabelledVideo]) -> None:
    video = fake_camera[1]
    async with browser(fake_camera[0]) as page, serve(app_config()) as base:
        await page.goto(f"{base}/?probe=1&video=1")  # annotated video back: its display latency is measured too
        await page.click("#connect")
        await page.wait_for_function(
            "() => window.edge.error || (window.edge.results >= 300 && window.edge.probeLatencies().results >= 300"
            " && window.edge.lastResult.rtt_source.split('+').includes('rtcp')"
            " && window.edge.framesDecoded > 60 && window.edge.browserRttMs !== null)", timeout=60_000)
        edge = await page.evaluate("() => ({error: edge.error, state: edge.state, recent: edge.recent, "
                                   "framesDecoded: edge.framesDecoded, browserRttMs: edge.browserRttMs, "
                                   "sources: edge.recent.map((r) => r.stamp === null ? null : "
                                   "(edge.probe.sent[r.stamp] || [null, null])[1]), "
                                   "latency: edge.probeLatencies(), probeErrors: edge.probe.errors})")
        await page.wait_for_timeout(500)  # let the charts draw the last points
        ARTIFACTS.mkdir(parents=True, exist_ok=True)
        await page.screenshot(path=str(ARTIFACTS / "page.png"), full_page=True)
    assert edge["error"] is None, edge["error"]
    assert edge["state"] == "connected"
    # probe mode: the page re-stamps each camera frame with its own counter and remembers the y4m's stamp
    results = edge["recent"][-240:]  # after the first seconds, in which the browser's encoder ramps up
    sources = edge["sources"][-240:]
    stamped = [(r, s) for r, s in zip(results, sources, strict=True) if s is not None and s < video.num_frames]
    assert len(stamped) >= 0.9 * len(results), "both frame counters should survive the browser's VP8"
    accuracy = float(np.mean([r["raw"]["class"] == video.label_of_stamp(s) for r, s in stamped]))
    lat = edge["latency"]
    assert edge["probeErrors"] == [], edge["probeErrors"]
    assert lat["results"] >= 300 and lat["displays"] >= 60, lat
    assert 0 < lat["result_p50"] <= lat["result_p95"] < 1000, lat
    assert 0 < lat["display_p50"] <= lat["display_p95"] < 1000, lat
    print(f"glass to glass on loopback: result p50 {lat['result_p50']:.1f} ms p95 {lat['result_p95']:.1f} ms, "
          f"display p50 {lat['display_p50']:.1f} ms p95 {lat['display_p95']:.1f} ms")
    last = results[-1]
    print(f"browser: {len(results)} results, raw accuracy {accuracy:.3f}, server RTT {last['network']['rtt_ms']:.2f} "
          f"ms, browser RTT {edge['browserRttMs']:.2f} ms, bitrate {last['network']['bitrate_bps']:.0f}, "
          f"frames decoded {edge['framesDecoded']}; screenshot {ARTIFACTS / 'page.png'}")
    # the served policy answers about 87 % of VP8 frames right; 240 correlated results wander by a few points
    assert accuracy >= 0.75, f"results should agree with the labels at about the model's accuracy ({accuracy:.3f})"
    # RTCP-derived estimates are plausible on loopback
    assert 0 < last["network"]["rtt_ms"] < 50, last["network"]
    assert 0 < edge["browserRttMs"] < 50
    assert 60_000 <= last["network"]["bitrate_bps"] <= 1_500_000, "within the rate controller's range"
    assert edge["framesDecoded"] > 60, "the annotated video should play in the page"


async def test_the_page_says_when_it_cannot_connect_and_what_to_do(app_config: Callable[..., Any], serve: Any,
                                                                   browser: Any) -> None:
    """A browser with no usable ICE path (here: UDP disabled by policy, so it gathers no candidate) no longer sits at
    "connecting": within connect_timeout_s the page says it failed and names the fix, and the server frees the slot."""
    import aiohttp

    cfg = app_config(server={"connect_timeout_s": 2.0, "max_sessions": 1})
    async with browser(None, ["--webrtc-ip-handling-policy=disable_non_proxied_udp"]) as page, serve(cfg) as base:
        await page.goto(f"{base}/")
        await page.click("#connect")
        await page.wait_for_function("() => window.edge.state === 'failed'", timeout=10_000)
        shown = await page.text_content("#conn")
        for _ in range(50):
            async with aiohttp.ClientSession() as http, http.get(f"{base}/status") as r:
                status = await r.json()
            if not status["sessions"]:
                break
            await page.wait_for_timeout(100)
        ARTIFACTS.mkdir(parents=True, exist_ok=True)
        await page.screenshot(path=str(ARTIFACTS / "not-connected.png"))
    print(f"page: {shown}")
    assert shown is not None and "not connected after 2 s" in shown and 'ice_host_addresses = ["127.0.0.1"]' in shown
    assert status["sessions"] == [] and status["sessions_closed"] == {"connect-timeout": 1}, status


async def test_results_first_the_page_draws_over_its_own_camera(app_config: Callable[..., Any], serve: Any,
                                                                 browser: Any, fake_camera: tuple[Path, LabelledVideo]
                                                                 ) -> None:
    """By default the page shows its own camera at once and draws the analysis from the results over it: the
    offer is sendonly, so the server neither renders nor encodes anything for this session. Each result is drawn
    over the frame it belongs to: with ?probe=1 the page knows when each analysed frame was stamped, and the frame
    the overlay picked must be that one (within a frame interval)."""
    import aiohttp

    async with browser(fake_camera[0]) as page, serve(app_config()) as base:
        await page.goto(f"{base}/?probe=1")
        assert not await page.is_checked("#video-back")
        await page.click("#connect")
        await page.wait_for_function("() => window.edge.error || (window.edge.results >= 120"
                                     " && window.edge.overlayDrawn >= 60 && edge.matcher.errorsFrames.length >= 60)",
                                     timeout=60_000)
        seen = await page.evaluate("() => { const e = edge.matcher.errorsFrames;"
                                   " return {error: edge.error, local: document.getElementById('video').videoWidth,"
                                   " mine: document.getElementById('video').srcObject !== null,"
                                   " drawn: edge.overlayDrawn, results: edge.results, matched: edge.matcher.matched,"
                                   " unmatched: edge.matcher.unmatched, checked: e.length,"
                                   " exact: e.filter((d) => d === 0).length,"
                                   " within_one: e.filter((d) => Math.abs(d) <= 1).length,"
                                   " sent: edge.recent.slice(-30).filter((r) => r.detail).map((r) => r.frame_size),"
                                   " off_by: e.reduce((h, d) => { h[d] = (h[d] || 0) + 1; return h; }, {})}; }")
        async with aiohttp.ClientSession() as http, http.get(f"{base}/status") as r:
            session = (await r.json())["sessions"][0]
        ARTIFACTS.mkdir(parents=True, exist_ok=True)
        await page.screenshot(path=str(ARTIFACTS / "results-first.png"))
    print(f"results first: {seen}, server: receives_video {session['receives_video']}, "
          f"rendered {session['frames_rendered']} of {session['frames_analysed']}")
    assert seen["error"] is None and seen["local"] > 0 and seen["mine"], seen
    assert seen["matched"] >= 0.8 * (seen["matched"] + seen["unmatched"]), f"most results found their frame: {seen}"
    # the counter in the frame the overlay was drawn on, against the analysed frame's
    # exact: 75-80 % on a quiet box, 61-63 % in two loaded CI runs (the rest one frame off, never more)
    assert seen["exact"] >= 0.55 * seen["checked"] and seen["within_one"] >= 0.95 * seen["checked"], \
        f"each result is drawn over the frame it belongs to: {seen}"
    assert session["receives_video"] is False and session["frames_rendered"] == 0 and session["frames_analysed"] > 100
    assert seen["sent"] and all(size[1] == 192 for size in seen["sent"]), \
        f"the browser sends only the lines the analysis uses (twice the model's 96: 192 of 480): {seen['sent']}"
