"""A camera's annotated video is encoded once, whoever watches: a second viewer adds packetisation, not an encode,
gets a keyframe to start from, and decodes the same stream; when the last viewer leaves, nothing is rendered or
encoded for nobody."""

from __future__ import annotations

import asyncio
from collections.abc import Callable
from typing import Any

import aiohttp
import pytest

from edge_app.bench.viewers import Viewer

pytestmark = [pytest.mark.slow, pytest.mark.live]


async def _camera(http: aiohttp.ClientSession, base: str) -> dict[str, Any]:
    async with http.get(f"{base}/status") as r:
        st = await r.json()
    return next(c for c in st["cameras"] if c["name"] == "demo")


async def test_a_second_viewer_costs_no_second_encode(app_config: Callable[..., Any], serve: Any) -> None:
    cfg = app_config(demo={"enabled": True, "fps": 15.0})
    async with serve(cfg) as base, aiohttp.ClientSession() as http:
        a, b = Viewer(), Viewer()
        await a.join(http, base, "demo")
        await asyncio.sleep(3.0)
        one = await _camera(http, base)
        await b.join(http, base, "demo")
        await asyncio.sleep(4.0)
        two = await _camera(http, base)
        rendered = two["frames_rendered"]
        await a.pc.close()
        await b.pc.close()
        await asyncio.sleep(1.5)
        after = await _camera(http, base)
        await asyncio.sleep(1.0)
        later = await _camera(http, base)
    enc = two["encoders"]
    print(f"one viewer: {one['encoders']}; two: {enc}; decoded frames a {a.frames}, b {b.frames}; "
          f"rendered {rendered}")
    assert len(enc) == 1 and enc[0]["viewers"] == 2, enc
    assert enc[0]["frames_encoded"] <= rendered + 1, "each rendered frame is encoded once, not once per viewer"
    assert a.frames >= 60 and b.frames >= 30, (a.frames, b.frames)
    assert enc[0]["keyframes_requested"] >= 2, "the second viewer started from a keyframe"
    assert after["encoders"] == [] and later["frames_rendered"] == after["frames_rendered"], \
        "no viewer: nothing rendered or encoded"
