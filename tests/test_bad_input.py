"""Bad input gets a specific 4xx (or an error message on the data channel) and the server stays up.

Offers: wrong content type, not JSON, oversized, not an offer, SDP that is not SDP, SDP
with no video, a video m-line with no codec the server takes, an unknown camera.  A hypothesis fuzz
run throws 1500 random bodies and content types at ``POST /offer`` and checks every answer is a 4xx
and the server still answers afterwards.  Data channel: messages that are not what the page sends
get ``{"type": "error", ...}`` back and the session keeps sending results.
"""

from __future__ import annotations

import asyncio
import json
import re
import threading
from collections.abc import Callable, Iterator
from typing import Any

import aiohttp
import numpy as np
import pytest
from aiortc import RTCPeerConnection
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from support.live import running_app
from test_live_session import VideoFileTrack, collect, connect

from edge_app.bench.testvideo import LabelledVideo
from edge_app.config import AppConfig


async def _offer_sdp(video: bool = True, channel: bool = True) -> str:
    pc = RTCPeerConnection()
    if video:
        pc.addTransceiver("video", direction="sendrecv")
    if channel:
        pc.createDataChannel("results")
    await pc.setLocalDescription(await pc.createOffer())
    sdp = pc.localDescription.sdp
    await pc.close()
    return sdp


def _only_h265(sdp: str) -> str:
    """The same offer with H.265 as the only video codec (aiortc takes VP8 and H.264)."""
    out, in_video = [], False
    for line in sdp.split("\r\n"):
        if line.startswith("m="):
            in_video = line.startswith("m=video")
            if in_video:
                line = re.sub(r"^(m=video \d+ \S+) .*$", r"\1 120", line)
                out.append(line)
                out.append("a=rtpmap:120 H265/90000")
                continue
        if in_video and line.startswith(("a=rtpmap", "a=fmtp", "a=rtcp-fb")):
            continue
        out.append(line)
    return "\r\n".join(out)


@pytest.mark.live
async def test_each_kind_of_bad_offer_gets_its_own_reason(app_config: Callable[..., AppConfig]) -> None:
    good = await _offer_sdp()
    no_video = await _offer_sdp(video=False)
    async with running_app(app_config()) as base, aiohttp.ClientSession() as http:
        async def post(data: Any = None, *, body: bytes | None = None, ctype: str = "application/json"
                       ) -> tuple[int, str]:
            payload = body if body is not None else json.dumps(data).encode()
            async with http.post(f"{base}/offer", data=payload, headers={"Content-Type": ctype}) as r:
                return r.status, await r.text()

        cases = [
            (await post({"sdp": good, "type": "offer"}, ctype="text/plain"), 415, "Content-Type must be"),
            (await post(body=b"{not json"), 400, "body is not JSON"),
            (await post(body=b"x" * 300_000), 413, "request body over 256 KiB"),
            (await post({"sdp": "v=0" + "x" * 70_000, "type": "offer"}), 400, "at most 65536 characters"),
            (await post({"sdp": good, "type": "answer"}), 400, "String should match pattern"),
            (await post([1, 2]), 400, "invalid offer"),
            (await post({"sdp": "hello", "type": "offer"}), 400, "has no m= section"),
            (await post({"sdp": good[:200], "type": "offer"}), 400, "cannot use this SDP offer"),
            (await post({"sdp": no_video, "type": "offer"}), 400, "sends no video track"),
            (await post({"sdp": _only_h265(good), "type": "offer"}), 400, "cannot use this SDP offer"),
            (await post({"sdp": good, "type": "offer", "camera": "../../etc/passwd"}), 404, "no camera named"),
            (await post({"sdp": good, "type": "offer", "camera": "rtsp://evil/x"}), 404, "no camera named"),
        ]
        async with http.get(f"{base}/nope") as r:
            cases.append(((r.status, await r.text()), 404, '"error"'))
        async with http.get(f"{base}/offer") as r:
            cases.append(((r.status, await r.text()), 405, '"error"'))
        async with http.get(f"{base}/status") as r:
            status = await r.json()
    for (got, text), want, reason in cases:
        assert got == want and reason in text, (want, reason, got, text[:300])
    assert status["sessions"] == [], "no bad offer left a session behind"


@pytest.fixture(scope="module")
def background_server(tmp_path_factory: pytest.TempPathFactory) -> Iterator[tuple[str, asyncio.AbstractEventLoop]]:
    """The app on its own event loop in a thread, so that a synchronous hypothesis test can call it."""
    from edge_app.config import load_config

    folder = tmp_path_factory.mktemp("fuzz")
    from support.live import DEFAULT_MODEL

    (folder / "config.toml").write_text(f'[model]\npath = "{DEFAULT_MODEL}"\nwarmup_runs = 0\n\n[server]\n'
                                        'max_offers_per_minute = 100000\nice_host_addresses = ["127.0.0.1"]\n')
    cfg = load_config(folder / "config.toml")
    loop = asyncio.new_event_loop()
    ready: list[str] = []
    stop = asyncio.Event()

    async def serve() -> None:
        async with running_app(cfg) as base:
            ready.append(base)
            await stop.wait()

    thread = threading.Thread(target=loop.run_until_complete, args=(serve(),), daemon=True)
    thread.start()
    for _ in range(300):
        if ready:
            break
        threading.Event().wait(0.05)
    assert ready, "the server did not start"
    yield ready[0], loop
    loop.call_soon_threadsafe(stop.set)
    thread.join(15)


json_values = st.recursive(st.none() | st.booleans() | st.integers() | st.floats(allow_nan=False) | st.text(),
                           lambda inner: st.lists(inner, max_size=4) | st.dictionaries(st.text(), inner, max_size=4),
                           max_leaves=12)
offer_like = st.fixed_dictionaries({}, optional={
    "sdp": st.one_of(st.text(), st.just("v=0\r\n"), st.text(alphabet="v=0aoimt\r\n -:").map(lambda s: "v=0\r\n" + s)),
    "type": st.one_of(st.just("offer"), st.text()), "camera": st.one_of(st.none(), st.text(max_size=80)),
    "probe": json_values, "extra": json_values})
bodies = st.one_of(st.binary(max_size=3000), json_values.map(lambda v: json.dumps(v).encode()),
                   offer_like.map(lambda v: json.dumps(v).encode()))
content_types = st.sampled_from(["application/json", "text/plain", "", "application/x-www-form-urlencoded",
                                 "multipart/form-data; boundary=x", "application/json; charset=latin-1"])


@pytest.mark.slow
@settings(max_examples=1500, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture,
                                                                     HealthCheck.too_slow])
@given(body=bodies, ctype=content_types)
@pytest.mark.live
def test_fuzzed_offers_get_4xx_and_the_server_keeps_serving(background_server: tuple[str, Any], body: bytes,
                                                            ctype: str) -> None:
    base, loop = background_server

    async def post() -> int:
        async with aiohttp.ClientSession() as http, http.post(f"{base}/offer", data=body,
                                                               headers={"Content-Type": ctype}) as r:
            await r.read()
            return r.status

    status = asyncio.run_coroutine_threadsafe(post(), loop).result(30)
    assert 400 <= status < 500, (status, ctype, body[:200])


@pytest.mark.live
def test_after_the_fuzz_the_server_still_serves(background_server: tuple[str, Any]) -> None:
    base, loop = background_server

    async def check() -> tuple[int, dict[str, Any]]:
        async with aiohttp.ClientSession() as http, http.get(f"{base}/status") as r:
            return r.status, await r.json()

    status, body = asyncio.run_coroutine_threadsafe(check(), loop).result(30)
    assert status == 200 and body["sessions"] == []


@pytest.mark.slow
@pytest.mark.live
async def test_bad_data_channel_messages_get_an_error_and_the_session_goes_on(
        app_config: Callable[..., AppConfig], serve: Any, demo_test_split: tuple[np.ndarray, np.ndarray]) -> None:
    images, labels = demo_test_split
    video = LabelledVideo(images[:40], labels[:40], hold=3)
    results: list[dict[str, Any]] = []
    errors: list[dict[str, Any]] = []
    async with serve(app_config()) as base:
        pc = RTCPeerConnection()
        tasks: list[asyncio.Task[None]] = []
        try:
            pc.addTrack(VideoFileTrack(video))
            channel = collect(pc, results, [], tasks)

            @channel.on("message")
            def on_error(message: str) -> None:
                msg = json.loads(message)
                if msg.get("type") == "error":
                    errors.append(msg)

            await connect(base, pc)
            for _ in range(200):
                if channel.readyState == "open" and results:
                    break
                await asyncio.sleep(0.1)
            sent_before = len(results)
            for bad in ("not json", json.dumps({"type": "launch", "url": "file:///etc/passwd"}), "[1, 2]",
                        json.dumps({"type": "pong", "id": "x" * 5000}), b"\x00\x01binary"):
                channel.send(bad)
            for _ in range(100):
                if len(errors) >= 5 and len(results) > sent_before + 30:
                    break
                await asyncio.sleep(0.1)
            async with aiohttp.ClientSession() as http, http.get(f"{base}/status") as r:
                status = await r.json()
        finally:
            for t in tasks:
                t.cancel()
            await pc.close()
    reasons = [e["reason"] for e in errors]
    assert len(reasons) == 5, reasons
    assert "not JSON" in reasons[0] and "unknown message type 'launch'" in reasons[1]
    assert any("under 4 KiB" in r for r in reasons), reasons
    assert len(results) > sent_before + 30, "results keep coming after the bad messages"
    assert status["sessions"][0]["bad_messages"] == 5
