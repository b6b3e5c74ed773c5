"""Clients this project did not write, against the real server over loopback.

1. aiortc's own example page (``examples/server/index.html`` + ``client.js`` from the aiortc 1.16.0 sdist, fetched
   with ``pip download``), served same-origin and driven in headless Chromium as a user would (tick "Use video",
   press Start): it posts ``{"sdp", "type", "video_transform"}``, offers audio too, opens a reliable "chat" data
   channel and sends "ping <ms>" on it.  Its video element plays our annotated video, its data-channel log shows
   our per-frame results and the "pong" answers.
2. GStreamer's webrtcbin (system Python + gi, ``tests/support/webrtcbin_peer.py``) sending VP8 and H.264: it offers
   ``a=setup:actpass`` and has an RSA certificate, so the server must answer as the DTLS server; it decodes the
   annotated video coming back and counts the results on its data channel.
"""

from __future__ import annotations

import asyncio
import json
import subprocess
import sys
import tarfile
from collections.abc import Callable
from pathlib import Path
from typing import Any

import numpy as np
import pytest
from support.live import REPO, running_app, skip_or_fail
from support.pagewatch import watch_of

from edge_app.bench.testvideo import LabelledVideo, write_y4m
from edge_app.config import AppConfig

pytestmark = [pytest.mark.slow, pytest.mark.live]

AIORTC_SDIST = "aiortc==1.16.0"
CACHE = REPO / "data" / "cache"
ARTIFACTS = REPO / "artifacts" / "test-interop"
SYSTEM_PYTHON = "/usr/bin/python3"
WEBRTCBIN_PEER = REPO / "tests" / "support" / "webrtcbin_peer.py"


@pytest.fixture(scope="session")
def aiortc_example(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """index.html and client.js of aiortc's examples/server, unchanged, from the sdist on PyPI (cached)."""
    sdists = sorted(CACHE.glob("aiortc-1.16.0.tar.gz"))
    if not sdists:
        CACHE.mkdir(parents=True, exist_ok=True)
        proc = subprocess.run([sys.executable, "-m", "pip", "download", "--no-binary", ":all:", "--no-deps",
                               AIORTC_SDIST, "-d", str(CACHE)], capture_output=True, text=True, timeout=300)
        sdists = sorted(CACHE.glob("aiortc-1.16.0.tar.gz"))
        if not sdists:
            skip_or_fail(f"cannot download the {AIORTC_SDIST} sdist: {proc.stderr[-500:]}")
    out = tmp_path_factory.mktemp("aiortc-example")
    with tarfile.open(sdists[0]) as tar:
        for name in ("index.html", "client.js"):
            member = tar.getmember(f"aiortc-1.16.0/examples/server/{name}")
            extracted = tar.extractfile(member)
            assert extracted is not None
            (out / name).write_bytes(extracted.read())
    return out


@pytest.mark.browser
async def test_aiortc_example_page_in_chromium(app_config: Callable[..., AppConfig], browser: Any,
                                               aiortc_example: Path, demo_test_split: tuple[np.ndarray, np.ndarray],
                                               tmp_path: Path) -> None:
    images, labels = demo_test_split
    camera = write_y4m(tmp_path / "camera.y4m", LabelledVideo(images[:40], labels[:40], hold=3))
    async with browser(camera) as page, running_app(app_config(), {"/aiortc-example/": aiortc_example}) as base:
        page.on("dialog", lambda d: asyncio.ensure_future(d.dismiss()))  # client.js alert()s its errors
        watch_of(page).allow(r"404 .*/favicon\.ico\)$")  # their page names no icon: the browser asks for one
        await page.goto(f"{base}/aiortc-example/index.html")
        await page.check("#use-video")
        await page.click("#start")
        await page.wait_for_function(
            "() => (document.getElementById('data-channel').textContent.match(/\"type\":\"result\"/g) || [])"
            ".length >= 60 && /RTT [0-9]+ ms/.test(document.getElementById('data-channel').textContent)"
            " && document.getElementById('video').getVideoPlaybackQuality().totalVideoFrames >= 30",
            timeout=60_000)
        seen = await page.evaluate("""() => {
            const log = document.getElementById('data-channel').textContent;
            const v = document.getElementById('video');
            return {log: log.slice(-60000), count: (log.match(/"type":"result"/g) || []).length,
                    pongs: (log.match(/RTT [0-9]+ ms/g) || []).length, width: v.videoWidth, height: v.videoHeight,
                    frames: v.getVideoPlaybackQuality().totalVideoFrames,
                    ice: document.getElementById('ice-connection-state').textContent,
                    answer: document.getElementById('answer-sdp').textContent};
        }""")
        ARTIFACTS.mkdir(parents=True, exist_ok=True)
        await page.screenshot(path=str(ARTIFACTS / "aiortc-example.png"), full_page=True)
    results = [json.loads(line[2:]) for line in seen["log"].splitlines()
               if line.startswith('< {"type":"result"')]
    print(f"aiortc's example page: {seen['count']} results and {seen['pongs']} pongs in its log, video "
          f"{seen['width']}x{seen['height']} ({seen['frames']} frames), ICE {seen['ice']}")
    assert seen["width"] > 0 and seen["frames"] >= 30, "the annotated video plays in the example's <video>"
    assert seen["count"] >= 60 and seen["pongs"] >= 1
    assert results and all(r["source"] == results[0]["source"] for r in results)
    assert sum(r.get("detail", False) for r in results) < len(results) / 5, "compact results, a full one a second"
    assert "m=audio" in seen["answer"] and "a=inactive" in seen["answer"], "its audio is answered inactive"


def _webrtcbin_available() -> bool:
    probe = subprocess.run([SYSTEM_PYTHON, "-c", "import gi; gi.require_version('GstWebRTC', '1.0'); "
                            "gi.require_version('Nice', '0.1'); from gi.repository import Gst, GstWebRTC, Nice; "
                            "Gst.init(None); assert all(Gst.ElementFactory.find(e) for e in ('webrtcbin', "
                            "'vp8enc', 'x264enc', 'vp8dec', 'avdec_h264', 'nicesrc'))"],
                           capture_output=True, check=False)
    return probe.returncode == 0


@pytest.mark.parametrize("codec", ["vp8", "h264"])
async def test_gstreamer_webrtcbin_sends_and_receives(app_config: Callable[..., AppConfig], serve: Any,
                                                      codec: str, tmp_path: Path) -> None:
    if not _webrtcbin_available():
        skip_or_fail("needs GStreamer's webrtcbin for the system Python (gstreamer1.0-plugins-bad, "
                     "gstreamer1.0-nice, gir1.2-gst-plugins-bad-1.0, gir1.2-nice-0.1, gstreamer1.0-libav)")
    out = tmp_path / "peer.json"
    async with serve(app_config()) as base:
        proc = await asyncio.create_subprocess_exec(
            SYSTEM_PYTHON, str(WEBRTCBIN_PEER), "--url", base, "--codec", codec, "--seconds", "8", "--out", str(out),
            stdout=asyncio.subprocess.PIPE, stderr=asyncio.subprocess.STDOUT)
        stdout, _ = await asyncio.wait_for(proc.communicate(), 60)
    assert out.is_file(), stdout.decode(errors="replace")[-3000:]
    seen = json.loads(out.read_text())
    print(f"webrtcbin {codec}: {seen}")
    assert seen["error"] is None, seen["error"]
    assert seen["state"] == "connected" and seen["answer_setup"] == "a=setup:passive"
    assert seen["codec_back"] == codec.upper(), "the annotated video comes back in the peer's codec"
    assert seen["frames_back"] >= 60 and seen["results"] >= 60, seen
