"""A peer that vanishes without closing (its process killed) is cleaned up after peer_timeout_s."""

from __future__ import annotations

import asyncio
import subprocess
import sys
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import aiohttp
import pytest

from edge_app.config import AppConfig

pytestmark = [pytest.mark.slow, pytest.mark.live]

CLIENT = """
import asyncio, json, sys, urllib.request
from aiortc import RTCPeerConnection, RTCSessionDescription, VideoStreamTrack

async def main(base):
    pc = RTCPeerConnection()
    pc.addTrack(VideoStreamTrack())
    ch = pc.createDataChannel("results", ordered=False, maxRetransmits=0)

    @ch.on("message")
    def on_message(m):
        msg = json.loads(m)
        if msg["type"] == "ping":
            ch.send(json.dumps({"type": "pong", "id": msg["id"]}))

    await pc.setLocalDescription(await pc.createOffer())
    body = json.dumps({"sdp": pc.localDescription.sdp, "type": "offer"}).encode()
    req = urllib.request.Request(base + "/offer", body, {"Content-Type": "application/json"})
    answer = json.loads(await asyncio.to_thread(lambda: urllib.request.urlopen(req).read()))
    await pc.setRemoteDescription(RTCSessionDescription(answer["sdp"], answer["type"]))
    print("connected", flush=True)
    await asyncio.sleep(3600)

asyncio.run(main(sys.argv[1]))
"""


async def _sessions(http: aiohttp.ClientSession, base: str) -> list[dict[str, Any]]:
    async with http.get(f"{base}/status") as r:
        sessions: list[dict[str, Any]] = (await r.json())["sessions"]
        return sessions


async def test_a_killed_peer_is_closed_after_the_timeout(app_config: Callable[..., AppConfig], serve: Any,
                                                         tmp_path: Path) -> None:
    script = tmp_path / "client.py"
    script.write_text(CLIENT)
    async with serve(app_config(server={"peer_timeout_s": 3.0, "ice_host_addresses": ["127.0.0.1"]})) as base, \
            aiohttp.ClientSession() as http:
        client = subprocess.Popen([sys.executable, str(script), base], stdout=subprocess.PIPE, text=True)
        try:
            for _ in range(200):  # connected, and the channel has answered pings
                s = await _sessions(http, base)
                if s and s[0]["state"] == "connected" and "datachannel" in s[0]["rtt_source"]:
                    break
                await asyncio.sleep(0.1)
            assert s and s[0]["state"] == "connected", s
            await asyncio.sleep(4.0)
            assert len(await _sessions(http, base)) == 1, "a live peer that answers pings is kept"
            client.kill()  # no DTLS close, no SCTP abort: it just vanishes
            client.wait(10)
            t0 = time.monotonic()
            while await _sessions(http, base) and time.monotonic() - t0 < 20:
                await asyncio.sleep(0.2)
            took = time.monotonic() - t0
            left = await _sessions(http, base)
        finally:
            if client.poll() is None:
                client.kill()
    print(f"vanished peer: session closed {took:.1f} s after the kill (peer_timeout_s = 3)")
    assert left == [], left
    assert took < 3.0 + 2.0, "closed by the data-channel timeout, not ICE's much later failure"
