"""Slow is not gone: a peer whose pongs come back late (a congested path) is kept while anything at all arrives
from it (its video, its RTCP); a peer from which nothing arrives is closed after ``peer_timeout_s``."""

from __future__ import annotations

import asyncio
import json
import time
from collections.abc import Callable
from typing import Any

import aiohttp
import numpy as np
import pytest
from aiortc import RTCPeerConnection
from test_live_session import VideoFileTrack, connect

from edge_app.bench.testvideo import LabelledVideo
from edge_app.config import AppConfig

pytestmark = [pytest.mark.slow, pytest.mark.live]


async def _sessions(http: aiohttp.ClientSession, base: str) -> list[dict[str, Any]]:
    async with http.get(f"{base}/status") as r:
        out: list[dict[str, Any]] = (await r.json())["sessions"]
        return out


def delayed_pongs(pc: RTCPeerConnection, delay_s: float, results: list[dict[str, Any]]) -> Any:
    """A results channel whose pongs leave ``delay_s`` late (None: never)."""
    channel = pc.createDataChannel("results", ordered=False, maxRetransmits=0)

    @channel.on("message")
    def on_message(message: str) -> None:
        msg = json.loads(message)
        if msg["type"] == "ping" and delay_s is not None:
            loop = asyncio.get_running_loop()
            loop.call_later(delay_s, lambda: channel.readyState == "open" and channel.send(
                json.dumps({"type": "pong", "id": msg["id"]})))
        elif msg["type"] == "result":
            results.append(msg)

    return channel


async def test_late_pongs_keep_the_session_silence_closes_it(app_config: Callable[..., AppConfig], serve: Any,
                                                             demo_test_split: tuple[np.ndarray, np.ndarray]) -> None:
    images, labels = demo_test_split
    cfg = app_config(server={"peer_timeout_s": 3.0},  # a camera that is down: its viewer gets nothing to answer
                     cameras=[{"name": "down", "url": "rtsp://127.0.0.1:9/cam", "open_timeout_s": 1.0}])
    async with serve(cfg) as base, aiohttp.ClientSession() as http:
        slow, silent = RTCPeerConnection(), RTCPeerConnection()
        slow_results: list[dict[str, Any]] = []
        try:
            slow.addTrack(VideoFileTrack(LabelledVideo(images[:20], labels[:20], hold=3)))
            delayed_pongs(slow, 8.0, slow_results)  # every pong 8 s late: longer than peer_timeout_s
            slow_answer = await connect(base, slow)
            silent.addTransceiver("video", direction="recvonly")  # sends no video, answers no ping
            delayed_pongs(silent, None, [])  # type: ignore[arg-type]
            silent_answer = await connect(base, silent, camera="down")
            t0 = time.monotonic()
            while time.monotonic() - t0 < 12:
                ids = {s["id"] for s in await _sessions(http, base)}
                if silent_answer["session"] not in ids and time.monotonic() - t0 > 9:
                    break
                await asyncio.sleep(0.25)
            sessions = {s["id"]: s for s in await _sessions(http, base)}
            async with http.get(f"{base}/status") as r:
                closed = (await r.json())["sessions_closed"]
        finally:
            await slow.close()
            await silent.close()
    assert slow_answer["session"] in sessions, "a peer that keeps sending video is not gone, however late its pongs"
    assert sessions[slow_answer["session"]]["state"] == "connected" and len(slow_results) > 100
    assert silent_answer["session"] not in sessions and closed.get("peer-gone") == 1, (sessions.keys(), closed)
