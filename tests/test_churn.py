"""Connect and disconnect sessions in a loop: no leak of sessions, tasks, threads, file descriptors or memory.

Server and aiortc clients share this process, so the counts cover both sides.  The first cycles warm
everything up (codecs, thread pools, caches); the baseline is taken after them.  Resident memory
rises by some 20 MB over the first few hundred cycles and then stays flat (``EDGE_APP_CHURN_CYCLES=700
pytest tests/test_churn.py -s`` prints the counts every 100 cycles: 261 MB after 100, 278 MB after
500 and after 700 in one run; tracemalloc showed no Python-heap growth), which is native allocators
settling, not a leak; the bound below allows for it.
"""

from __future__ import annotations

import asyncio
import gc
import os
import resource
import threading
import time
from collections.abc import Callable
from typing import Any

import aiohttp
import numpy as np
import pytest
from aiortc import RTCPeerConnection
from test_live_session import VideoFileTrack, collect, connect

from edge_app.bench.testvideo import LabelledVideo
from edge_app.config import AppConfig

pytestmark = [pytest.mark.slow, pytest.mark.live]
WARMUP, CYCLES = 10, int(os.environ.get("EDGE_APP_CHURN_CYCLES", "300"))


def _rss_mib() -> float:
    with open("/proc/self/statm") as f:
        return int(f.read().split()[1]) * resource.getpagesize() / 2**20


def _counts() -> dict[str, float]:
    gc.collect()
    return {"tasks": len(asyncio.all_tasks()), "threads": threading.active_count(),
            "fds": len(os.listdir("/proc/self/fd")), "rss_mib": _rss_mib()}


async def _cycle(base: str, video: LabelledVideo, http: aiohttp.ClientSession) -> None:
    pc = RTCPeerConnection()
    tasks: list[asyncio.Task[None]] = []
    try:
        pc.addTrack(VideoFileTrack(video))
        collect(pc, [], [], tasks)
        await connect(base, pc)
        for _ in range(100):
            if pc.connectionState == "connected":
                break
            await asyncio.sleep(0.05)
        assert pc.connectionState == "connected", pc.connectionState
    finally:
        for t in tasks:
            t.cancel()
        await pc.close()


async def _sessions(base: str, http: aiohttp.ClientSession) -> int:
    async with http.get(f"{base}/status") as r:
        return len((await r.json())["sessions"])


async def test_hundreds_of_sessions_leak_nothing(app_config: Callable[..., AppConfig], serve: Any,
                                                 demo_test_split: tuple[np.ndarray, np.ndarray]) -> None:
    images, labels = demo_test_split
    video = LabelledVideo(images[:10], labels[:10], hold=3)
    async with serve(app_config(server={"max_offers_per_minute": 100_000})) as base, \
            aiohttp.ClientSession() as http:
        for _ in range(WARMUP):
            await _cycle(base, video, http)
        for _ in range(100):
            if await _sessions(base, http) == 0:
                break
            await asyncio.sleep(0.1)
        await asyncio.sleep(1.0)
        before = _counts()
        t0 = time.monotonic()
        for i in range(CYCLES):
            await _cycle(base, video, http)
            if (i + 1) % 100 == 0:
                print(f"churn: after {i + 1} cycles {_counts()}", flush=True)
        took = time.monotonic() - t0
        for _ in range(100):
            if await _sessions(base, http) == 0:
                break
            await asyncio.sleep(0.1)
        left = await _sessions(base, http)
        await asyncio.sleep(1.0)
        after = _counts()
    print(f"churn: {CYCLES} connect/disconnect cycles in {took:.1f} s; before {before}, after {after}")
    assert left == 0, "every closed peer's session is gone"
    assert after["tasks"] <= before["tasks"] + 2, (before, after)
    assert after["threads"] <= before["threads"] + 2, (before, after)
    assert after["fds"] <= before["fds"] + 4, (before, after)
    assert after["rss_mib"] - before["rss_mib"] < 60, (before, after)
