"""WHIP (RFC 9725) and WHEP, the standard doors, with clients we did not write.

1. medooze's WHIP client (npm ``whip-whep@1.2.0``, ``whip.js``, unchanged), served same-origin to headless Chromium:
   it publishes the fake camera to ``/whip`` (its trickle PATCHes get 405, which it accepts), ``/status`` shows the
   session analysing, the data channel the page opened gets results, and its ``stop()`` (``DELETE``) ends it.
2. GStreamer's webrtcbin as a WHIP sender (``tests/support/webrtcbin_peer.py --whip``), VP8 and H.264: results on
   its data channel, ``DELETE`` on the ``Location`` ends the session.
3. The same package's WHEP client (``whep.js``) plays the demo camera in Chromium.
4. Every refusal: 415, 400 with a reason, 404, 503, 405 for PATCH, 401 without the token, 404 for an unknown
   session; and ``DELETE`` on a known one closes it.
"""

from __future__ import annotations

import asyncio
import json
import subprocess
from collections.abc import Callable
from pathlib import Path
from typing import Any

import aiohttp
import pytest
from aiortc import RTCPeerConnection
from support.live import REPO, chromium_page, running_app, skip_or_fail
from support.npm import npm_package
from support.pagewatch import watch_of

from edge_app.config import AppConfig

pytestmark = [pytest.mark.slow, pytest.mark.live]

SYSTEM_PYTHON = "/usr/bin/python3"
WEBRTCBIN_PEER = REPO / "tests" / "support" / "webrtcbin_peer.py"
WHIP_WHEP = "whip-whep@1.2.0"
TOKEN = "whip-test-token-0123456789"


@pytest.fixture(scope="module")
def whip_whep() -> Path:
    got = npm_package(WHIP_WHEP)
    if isinstance(got, str):
        skip_or_fail(got)
    assert isinstance(got, Path)
    return got


async def _offer(kind: str = "video", direction: str = "sendonly") -> tuple[RTCPeerConnection, str]:
    pc = RTCPeerConnection()
    pc.addTransceiver(kind, direction=direction)
    await pc.setLocalDescription(await pc.createOffer())
    return pc, pc.localDescription.sdp


async def _status(http: aiohttp.ClientSession, base: str, headers: dict[str, str] | None = None) -> dict[str, Any]:
    async with http.get(base + "/status", headers=headers) as r:
        return dict(await r.json())


# --- the refusals ----------------------------------------------------------------------------------------------

async def test_whip_and_whep_refuse_what_they_cannot_use(app_config: Callable[..., AppConfig]) -> None:
    cfg = app_config(server={"max_sessions": 1})
    async with running_app(cfg) as base, aiohttp.ClientSession() as http:
        pc, sdp = await _offer()
        audio_pc, audio_only = await _offer("audio")
        try:
            async with http.post(base + "/whip", data=sdp, headers={"Content-Type": "application/json"}) as r:
                assert r.status == 415 and "application/sdp" in (await r.json())["error"]
            async with http.post(base + "/whip", data="v=0\r\nnonsense", headers={"Content-Type": "application/sdp"}
                                 ) as r:
                assert r.status == 400 and "cannot use this SDP offer" in (await r.json())["error"]
            async with http.post(base + "/whip", data=audio_only, headers={"Content-Type": "application/sdp"}) as r:
                assert r.status == 400 and "sends no video track" in (await r.json())["error"]
            async with http.post(base + "/whep/nowhere", data=sdp, headers={"Content-Type": "application/sdp"}) as r:
                assert r.status == 404 and "no camera named 'nowhere'" in (await r.json())["error"]
            async with http.post(base + "/whip", data=sdp, headers={"Content-Type": "application/sdp"}) as r:
                assert r.status == 201 and r.content_type == "application/sdp", await r.text()
                location = r.headers["Location"]
                assert (await r.text()).startswith("v=0")
            async with http.post(base + "/whip", data=sdp, headers={"Content-Type": "application/sdp"}) as r:
                assert r.status == 503 and r.headers.get("Retry-After") and "at capacity" in (await r.json())["error"]
            async with http.patch(base + location, data="a=end-of-candidates",
                                  headers={"Content-Type": "application/trickle-ice-sdpfrag"}) as r:
                assert r.status == 405 and r.headers.get("Allow") == "DELETE"
            async with http.delete(base + "/sessions/000000000000") as r:
                assert r.status == 404
            async with http.delete(base + location) as r:
                assert r.status == 200
            status = await _status(http, base)
            assert status["sessions"] == [] and status["sessions_closed"].get("closed") == 1, status
        finally:
            await pc.close()
            await audio_pc.close()


async def test_whip_takes_the_bearer_token_as_the_rfc_says(app_config: Callable[..., AppConfig]) -> None:
    async with running_app(app_config(server={"token": TOKEN})) as base, aiohttp.ClientSession() as http:
        pc, sdp = await _offer()
        try:
            async with http.post(base + "/whip", data=sdp, headers={"Content-Type": "application/sdp"}) as r:
                assert r.status == 401 and r.headers.get("WWW-Authenticate", "").startswith("Bearer")
            async with http.post(base + "/whip", data=sdp, headers={"Content-Type": "application/sdp",
                                                                    "Authorization": f"Bearer {TOKEN}"}) as r:
                assert r.status == 201
                location = r.headers["Location"]
            async with http.delete(base + location) as r:
                assert r.status == 401
            async with http.delete(base + location, headers={"Authorization": f"Bearer {TOKEN}"}) as r:
                assert r.status == 200
        finally:
            await pc.close()


# --- clients we did not write ------------------------------------------------------------------------------------

WHIP_PAGE = """async ([token]) => {
  const { WHIPClient } = await import("/whip-whep/whip.js");
  const stream = await navigator.mediaDevices.getUserMedia({ video: { width: 640, height: 480 } });
  const pc = new RTCPeerConnection();
  pc.addTransceiver(stream.getVideoTracks()[0], { direction: "sendonly" });
  const channel = pc.createDataChannel("results");
  window.seen = { results: 0, types: {}, last: null };
  channel.onmessage = (e) => {
    const m = JSON.parse(e.data);
    window.seen.types[m.type] = (window.seen.types[m.type] || 0) + 1;
    if (m.type === "ping") channel.send(JSON.stringify({ type: "pong", id: m.id }));
    if (m.type === "result") { window.seen.results += 1; window.seen.last = m; }
  };
  const whip = window.whip = new WHIPClient();
  await whip.publish(pc, location.origin + "/whip", token);
  return whip.resourceURL.pathname;
}"""


@pytest.mark.browser
async def test_a_whip_client_we_did_not_write_sends_its_camera(app_config: Callable[..., AppConfig],
                                                               whip_whep: Path) -> None:
    headers: dict[str, str] = {}  # (the token is tested above: the client's module is served behind no token here)
    async with running_app(app_config(), static={"/whip-whep/": whip_whep}) as base, \
            aiohttp.ClientSession() as http, chromium_page() as page:
        await page.goto(base + "/")
        _expected_refusals(page)
        resource = await page.evaluate(WHIP_PAGE, [None])
        seen: dict[str, Any] = {}
        session: dict[str, Any] = {}
        for _ in range(60):
            await asyncio.sleep(0.5)
            seen = await page.evaluate("window.seen")
            sessions = (await _status(http, base, headers))["sessions"]
            session = sessions[0] if sessions else {}
            if seen["results"] >= 60 and (session.get("frames_analysed") or 0) >= 60:
                break
        await page.evaluate("window.whip.stop()")
        await asyncio.sleep(1.0)
        after = await _status(http, base, headers)
    print(f"whip.js: resource {resource}; page saw {seen['results']} results, {seen['types']}; session {session}")
    assert resource.startswith("/sessions/") and session.get("sends_video") is True
    assert session["state"] == "connected" and session["frames_analysed"] >= 60, session
    assert seen["results"] >= 60 and seen["last"]["smoothed"]["label"], seen
    assert after["sessions"] == [] and after["sessions_closed"].get("closed") == 1, after


def _expected_refusals(page: Any) -> None:
    """What the client's browser logs of our documented answers: 405 to its trickle PATCH (every candidate is in the
    answer), and 404 to a request about its session after it ended it."""
    watch_of(page).allow(r"status of 405 .*/sessions/[0-9a-f]+\)$")
    watch_of(page).allow(r"status of 404 .*/sessions/[0-9a-f]+\)$")


WHEP_PAGE = """async ([camera]) => {
  const { WHEPClient } = await import("/whip-whep/whep.js");
  const pc = new RTCPeerConnection();
  pc.addTransceiver("video", { direction: "recvonly" });
  const video = document.createElement("video");
  video.muted = true; video.autoplay = true; video.playsInline = true;
  document.body.append(video);
  pc.ontrack = (e) => { video.srcObject = e.streams[0] || new MediaStream([e.track]); video.play(); };
  window.video = video;
  const whep = window.whep = new WHEPClient();
  await whep.view(pc, location.origin + "/whep/" + camera, null);
  return whep.resourceURL.pathname;
}"""


@pytest.mark.browser
async def test_a_whep_player_we_did_not_write_plays_a_camera(app_config: Callable[..., AppConfig],
                                                            whip_whep: Path) -> None:
    cfg = app_config(demo={"enabled": True, "fps": 15.0})
    async with running_app(cfg, static={"/whip-whep/": whip_whep}) as base, aiohttp.ClientSession() as http, \
            chromium_page() as page:
        await page.goto(base + "/")
        _expected_refusals(page)
        resource = await page.evaluate(WHEP_PAGE, ["demo"])
        await page.wait_for_function("() => window.video.videoWidth > 0 && "
                                     "window.video.getVideoPlaybackQuality().totalVideoFrames >= 45", timeout=30_000)
        played = await page.evaluate("({width: video.videoWidth, frames: "
                                     "video.getVideoPlaybackQuality().totalVideoFrames})")
        status = await _status(http, base)
        await page.evaluate("window.whep.stop()")
    viewer = status["sessions"][0]
    print(f"whep.js: {resource}, played {played}; session {viewer}")
    assert resource.startswith("/sessions/") and played["width"] == 384
    assert viewer["camera"] == "demo" and viewer["receives_video"] and viewer["picture"] == "annotated"


def _webrtcbin_available() -> bool:
    probe = subprocess.run([SYSTEM_PYTHON, "-c", "import gi; gi.require_version('GstWebRTC', '1.0'); "
                            "gi.require_version('Nice', '0.1'); from gi.repository import Gst, GstWebRTC, Nice; "
                            "Gst.init(None); assert all(Gst.ElementFactory.find(e) for e in ('webrtcbin', "
                            "'vp8enc', 'x264enc', 'nicesrc'))"], capture_output=True, check=False)
    return probe.returncode == 0


@pytest.mark.parametrize("codec", ["vp8", "h264"])
async def test_gstreamer_webrtcbin_as_a_whip_sender_gets_results(app_config: Callable[..., AppConfig],
                                                                 codec: str, tmp_path: Path) -> None:
    if not _webrtcbin_available():
        skip_or_fail("needs GStreamer's webrtcbin for the system Python (.ci/test installs it)")
    out = tmp_path / "peer.json"
    async with running_app(app_config()) as base, aiohttp.ClientSession() as http:
        proc = await asyncio.create_subprocess_exec(
            SYSTEM_PYTHON, str(WEBRTCBIN_PEER), "--url", base, "--codec", codec, "--seconds", "8", "--out", str(out),
            "--whip", stdout=asyncio.subprocess.PIPE, stderr=asyncio.subprocess.STDOUT)
        stdout, _ = await asyncio.wait_for(proc.communicate(), 60)
        await asyncio.sleep(0.5)
        after = await _status(http, base)
    assert out.is_file(), stdout.decode(errors="replace")[-3000:]
    seen = json.loads(out.read_text())
    print(f"webrtcbin WHIP {codec}: {seen}")
    assert seen["error"] is None, seen["error"]
    assert seen["state"] == "connected" and seen["location"].startswith("/sessions/") and seen["deleted"] == 200
    assert seen["results"] >= 60 and seen["frames_back"] == 0, "results on its data channel, no video back"
    assert after["sessions"] == [] and after["sessions_closed"].get("closed") == 1, after
