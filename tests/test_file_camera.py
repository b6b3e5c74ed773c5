"""A recorded clip as a camera (``[[cameras]] kind = "file"``): PyAV opens it, it plays at its own frame rate and
loops, it is analysed and watched like any camera, and the page lists it."""

from __future__ import annotations

import asyncio
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import aiohttp
import numpy as np
import pytest
from aiortc import RTCPeerConnection, RTCSessionDescription
from support.clips import FPS, write_clip
from support.live import chromium_page, results_channel, running_app

from edge_app.config import AppConfig, ConfigError

pytestmark = [pytest.mark.slow, pytest.mark.live]



async def test_a_file_camera_plays_loops_and_is_analysed(app_config: Callable[..., AppConfig],
                                                         demo_test_split: tuple[np.ndarray, np.ndarray],
                                                         tmp_path: Path) -> None:
    clip = write_clip(tmp_path / "porch.mp4", demo_test_split[0][:30])
    cfg = app_config(cameras=[{"name": "porch", "kind": "file", "path": str(clip)}])
    results: list[dict[str, Any]] = []
    async with running_app(cfg) as base, aiohttp.ClientSession() as http:
        pc = RTCPeerConnection()
        results_channel(pc, results.append)
        await pc.setLocalDescription(await pc.createOffer())
        body = {"sdp": pc.localDescription.sdp, "type": "offer", "camera": "porch"}
        async with http.post(base + "/offer", json=body) as r:
            answer = await r.json()
            assert r.status == 200, answer
        await pc.setRemoteDescription(RTCSessionDescription(answer["sdp"], answer["type"]))
        t0 = time.monotonic()
        await asyncio.sleep(5.5)
        async with http.get(base + "/status") as r:
            cam = (await r.json())["cameras"][0]
        wall = time.monotonic() - t0
        await pc.close()
        async with chromium_page() as page:
            await page.goto(base + "/")
            await page.wait_for_function("() => [...document.getElementById('source').options].some("
                                         "(o) => o.value === 'porch')", timeout=10_000)
            label = await page.evaluate("[...document.getElementById('source').options].find("
                                        "(o) => o.value === 'porch').textContent")
    print(f"file camera: {cam['frames']} frames in {wall:.1f} s, loops {cam['loops']}, state {cam['state']}, "
          f"{len(results)} results; the page lists it as {label!r}")
    assert cam["kind"] == "file" and cam["url"] == "file:porch.mp4" and cam["state"] == "streaming"
    assert cam["loops"] >= 2 and cam["resolution"] == [320, 240], cam
    assert FPS * 4 <= cam["frames_analysed"] <= FPS * 8, "played at its own frame rate, not as fast as it decodes"
    assert len(results) >= FPS * 3 and all(r["source"] == "porch" for r in results)
    assert "video file porch.mp4" in label


def test_a_file_camera_must_name_a_path(app_config: Callable[..., AppConfig], tmp_path: Path) -> None:
    with pytest.raises(ConfigError, match=r"\[cameras\[0\]\]\.path: Field required"):
        app_config(cameras=[{"name": "porch", "kind": "file"}])
    with pytest.raises(ConfigError, match=r'kind = \\"file\\"|kind = "file"'):
        app_config(cameras=[{"name": "porch", "url": "/videos/porch.mp4"}])
