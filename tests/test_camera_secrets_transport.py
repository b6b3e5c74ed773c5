"""Cameras as users configure them: credentials in the URL, a transport the camera refuses, a camera that is down.

* A password (and a token in the query) in a camera URL, and the server's bearer token, appear nowhere: not in the
  log (the real ``edge-app serve`` process, every connect and failure), ``/status``, ``/metrics``, nor in the
  ``source`` messages a viewer of the down camera gets on its data channel.
* ``transport = "auto"`` (the default) streams from a camera that takes only UDP (one log line for the fallback)
  and one that takes only TCP; ``transport = "udp"`` against a TCP-only camera says what to change.
"""

from __future__ import annotations

import asyncio
import json
import logging
import signal
import subprocess
import sys
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import aiohttp
import pytest
from aiortc import RTCPeerConnection, RTCSessionDescription
from support.live import REPO

from edge_app.bench.rtsp_camera import RtspServer, free_port
from edge_app.config import AppConfig

pytestmark = [pytest.mark.slow, pytest.mark.live]

PASSWORD = "hunter2-Pa55"
URL_TOKEN = "camt0ken-77"
TOKEN = "server-token-" + "x" * 20


async def _wait_serving(log: Path, proc: subprocess.Popen[bytes], timeout_s: float = 60) -> None:
    t_end = time.monotonic() + timeout_s
    while time.monotonic() < t_end:
        if "serving on" in log.read_text(errors="replace"):
            return
        assert proc.poll() is None, log.read_text()
        await asyncio.sleep(0.2)
    raise AssertionError(f"the server did not start: {log.read_text()}")


async def test_camera_credentials_and_the_token_never_leave_the_server(tmp_path: Path) -> None:
    dead_port = free_port()  # nothing listens: every connect fails, and is logged
    cfg = tmp_path / "config.toml"
    cfg.write_text(f'[server]\ntoken = "{TOKEN}"\nice_host_addresses = ["127.0.0.1"]\n'
                   f'[model]\npath = "{REPO / "models" / "default"}"\nwarmup_runs = 0\n'
                   f'[[cameras]]\nname = "door"\n'
                   f'url = "rtsp://admin:{PASSWORD}@127.0.0.1:{dead_port}/cam?token={URL_TOKEN}"\n'
                   f'open_timeout_s = 1.0\nbackoff_initial_s = 0.2\nbackoff_max_s = 0.5\n')
    port = free_port()
    log = tmp_path / "serve.log"
    with log.open("wb") as out:
        proc = subprocess.Popen([sys.executable, "-m", "edge_app", "-v", "serve", "--config", str(cfg), "--port",
                                 str(port)], stdout=out, stderr=subprocess.STDOUT, cwd=tmp_path)
    base = f"http://127.0.0.1:{port}"
    auth = {"Authorization": f"Bearer {TOKEN}"}
    messages: list[dict[str, Any]] = []
    pc = RTCPeerConnection()
    try:
        await _wait_serving(log, proc)
        pc.addTransceiver("video", direction="recvonly")
        channel = pc.createDataChannel("results", ordered=False, maxRetransmits=0)

        @channel.on("message")
        def on_message(m: str) -> None:
            msg = json.loads(m)
            if msg["type"] == "ping":
                channel.send(json.dumps({"type": "pong", "id": msg["id"]}))
            messages.append(msg)

        await pc.setLocalDescription(await pc.createOffer())
        async with aiohttp.ClientSession(headers=auth) as http:
            body = {"sdp": pc.localDescription.sdp, "type": "offer", "camera": "door"}
            async with http.post(f"{base}/offer", json=body) as r:
                answer = await r.json()
                assert r.status == 200, answer
            await pc.setRemoteDescription(RTCSessionDescription(answer["sdp"], answer["type"]))
            for _ in range(100):
                if any(m["type"] == "source" for m in messages):
                    break
                await asyncio.sleep(0.1)
            await asyncio.sleep(2.0)  # a few more failed connects in the log
            async with http.get(f"{base}/status") as r:
                status_text = await r.text()
            async with http.get(f"{base}/metrics") as r:
                metrics_text = await r.text()
        async with aiohttp.ClientSession() as anon, anon.get(f"{base}/status") as r:
            anonymous = r.status, await r.text()
    finally:
        await pc.close()
        proc.send_signal(signal.SIGTERM)
        proc.wait(30)
    log_text = log.read_text(errors="replace")
    source = [m for m in messages if m["type"] == "source"]
    camera = json.loads(status_text)["cameras"][0]
    print(f"camera status: {camera['state']}, url {camera['url']}, last error {camera['last_error']!r}; "
          f"viewer got {source[:1]}")
    assert source and source[0]["state"] == "reconnecting" and source[0]["reason"], source
    assert camera["url"] == f"rtsp://admin:***@127.0.0.1:{dead_port}/cam?token=***"
    assert log_text.count("connecting to rtsp://admin:***@") >= 2, log_text[-2000:]
    assert anonymous[0] == 401 and TOKEN not in anonymous[1]
    for where, text in (("log", log_text), ("/status", status_text), ("/metrics", metrics_text),
                        ("data channel", json.dumps(messages))):
        for secret in (PASSWORD, URL_TOKEN, TOKEN):
            assert secret not in text, f"{secret!r} appears in the {where}"


@pytest.fixture
def servers(camera_frames: Path) -> Iterator[dict[str, RtspServer]]:
    started = {p: RtspServer(camera_frames, free_port(), protocols=p) for p in ("udp", "tcp")}
    try:
        for s in started.values():
            s.start()
        yield started
    finally:
        for s in started.values():
            s.stop()


async def test_transport_auto_falls_back_and_udp_against_tcp_only_says_what_to_do(
        app_config: Callable[..., AppConfig], serve: Any, servers: dict[str, RtspServer],
        caplog: pytest.LogCaptureFixture) -> None:
    quick = {"open_timeout_s": 3.0, "backoff_initial_s": 0.3, "backoff_max_s": 1.0}
    cfg = app_config(cameras=[{"name": "udp-only", "url": servers["udp"].url, **quick},
                              {"name": "tcp-only", "url": servers["tcp"].url, **quick},
                              {"name": "forced-udp", "url": servers["tcp"].url, "transport": "udp", **quick}])
    with caplog.at_level(logging.INFO, logger="streams.rtsp"):
        async with serve(cfg) as base, aiohttp.ClientSession() as http:
            cams: dict[str, Any] = {}
            t_end = time.monotonic() + 40
            while time.monotonic() < t_end:
                async with http.get(f"{base}/status") as r:
                    cams = {c["name"]: c for c in (await r.json())["cameras"]}
                if (cams["udp-only"]["frames"] > 10 and cams["tcp-only"]["frames"] > 10
                        and cams["forced-udp"]["last_error"]):
                    break
                await asyncio.sleep(0.25)
    fallbacks = [r.getMessage() for r in caplog.records if "does not take RTSP over" in r.getMessage()]
    print({n: (c["state"], c["transport_in_use"], c["frames"], c["last_error"]) for n, c in cams.items()})
    assert cams["udp-only"]["frames"] > 10 and cams["udp-only"]["transport_in_use"] == "udp"
    assert cams["tcp-only"]["frames"] > 10 and cams["tcp-only"]["transport_in_use"] == "tcp"
    assert cams["forced-udp"]["frames"] == 0 and cams["forced-udp"]["transport"] == "udp"
    assert cams["forced-udp"]["last_error"] == 'the camera refuses RTSP over UDP (set transport = "tcp" or "auto")'
    assert fallbacks == ["camera udp-only: the camera does not take RTSP over TCP; trying UDP"], fallbacks


def test_redaction_covers_urls_text_and_registered_secrets() -> None:
    from streams.redact import RedactingFilter, add_secret, add_url_secrets, redact, redact_url

    add_url_secrets("rtsp://u:p%40ss-w0rd@cam/x")
    add_secret("turn-credential-1")
    assert redact_url("rtsp://u:p%40ss-w0rd@cam:554/x?ch=1&auth=zz9") == "rtsp://u:***@cam:554/x?ch=1&auth=***"
    assert redact_url("rtsp://cam/x") == "rtsp://cam/x"
    assert redact("open rtsp://u:p%40ss-w0rd@cam/x failed: p@ss-w0rd") == "open rtsp://u:***@cam/x failed: ***"
    record = logging.LogRecord("x", logging.INFO, __file__, 1, "TURN %s at %s", ("turn-credential-1", "h"), None)
    assert RedactingFilter().filter(record) and record.getMessage() == "TURN *** at h"
