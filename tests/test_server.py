"""A real server on a free port: page, health, status."""

from __future__ import annotations

from collections.abc import AsyncIterator
from pathlib import Path

import aiohttp
import pytest
from support.live import running_app

from edge_app.config import load_config

REPO = Path(__file__).resolve().parents[1]


@pytest.fixture
async def base_url() -> AsyncIterator[str]:
    async with running_app(load_config(REPO / "config.toml")) as url:
        yield url


@pytest.mark.live
async def test_page_health_and_status(base_url: str) -> None:
    async with aiohttp.ClientSession() as http:
        async with http.get(f"{base_url}/") as r:
            assert r.status == 200 and "edge-app" in await r.text()
        async with http.get(f"{base_url}/static/app.js") as r:
            assert r.status == 200
        async with http.get(f"{base_url}/healthz") as r:
            assert (await r.json()) == {"ok": True, "sessions": 0}
        async with http.get(f"{base_url}/status") as r:
            s = await r.json()
    assert s["model"]["providers"][-1] == "CPUExecutionProvider"
    assert [e["name"] for e in s["model"]["exits"]] == ["exit1", "exit2", "exit3"]
    assert len(s["model"]["classes"]) == 11
