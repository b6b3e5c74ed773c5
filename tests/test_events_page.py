"""The events timeline in Chromium, on the demo camera's real events: a viewer sees the timeline and the cards
with their snapshots, live as events happen, and a click shows one; the viewer sees no teaching and no delete; an
operator deletes one from the page."""

from __future__ import annotations

import json
from collections.abc import Callable
from pathlib import Path
from typing import Any

import aiohttp
import pytest

from edge_app.config import AppConfig

OPERATOR = "operator-token-for-page-0123456789"
VIEWER = "viewer-token-for-page-9876543210"


@pytest.mark.browser
@pytest.mark.slow
@pytest.mark.live
async def test_the_timeline_shows_events_live_with_snapshots_and_roles(
        app_config: Callable[..., AppConfig], serve: Any, browser: Any, tmp_path: Path) -> None:
    cfg = app_config(server={"token": OPERATOR, "viewer_token": VIEWER, "ice_host_addresses": ["127.0.0.1"]},
                     demo={"enabled": True, "fps": 15.0, "hold_frames": 45},
                     events={"path": str(tmp_path / "events"), "min_s": 1.5, "min_confidence": 0.3, "labels": ["*"]})
    async with browser() as page, serve(cfg) as base:
        await page.goto(f"{base}/#token={VIEWER}")
        # the page opened before any event: every card it shows came down the live stream
        await page.wait_for_function("() => window.edge.events && window.edge.events.live === 'on'", timeout=20_000)
        await page.wait_for_function("() => document.querySelectorAll('#ev-list .ev-card img[src^=blob]').length >= 2"
                                     " && document.querySelectorAll('.ev-block').length >= 2", timeout=30_000)
        state = json.loads(await page.evaluate(
            "() => JSON.stringify({changes: edge.events.changes, role: edge.role, n: edge.events.byId.size,"
            " teach: getComputedStyle(document.querySelector('section.teach')).display,"
            " del: getComputedStyle(document.querySelector('#ev-delete')).display,"
            " rows: [...document.querySelectorAll('.ev-row span')].map((s) => s.textContent)})"))
        await page.click("#ev-list .ev-card")
        await page.wait_for_function("() => !document.querySelector('#ev-detail').hidden"
                                     " && document.querySelector('#ev-snap').src.startsWith('blob:')", timeout=10_000)
        facts = await page.inner_text("#ev-facts")
        picked = await page.evaluate("() => edge.events.selected")
        async with aiohttp.ClientSession(headers={"Authorization": f"Bearer {VIEWER}"}) as http, \
                http.get(f"{base}/api/events/{picked}") as r:
            kept = await r.json()

        await page.goto(f"{base}/?as=operator#token={OPERATOR}")
        await page.wait_for_function("() => window.edge.events && edge.events.byId.size >= 1", timeout=20_000)
        victim = await page.evaluate("() => document.querySelector('#ev-list .ev-card').dataset.id")
        await page.click(f"#ev-list .ev-card[data-id='{victim}']")
        await page.click("#ev-delete")
        await page.wait_for_function(f"() => !edge.events.byId.has('{victim}')", timeout=10_000)
        teach_shown = await page.evaluate("() => getComputedStyle(document.querySelector('section.teach')).display")
        async with aiohttp.ClientSession(headers={"Authorization": f"Bearer {OPERATOR}"}) as http, \
                http.get(f"{base}/api/events/{victim}") as r:
            gone = r.status
    print(f"page: {state}; details {facts!r}")
    assert state["role"] == "viewer" and state["teach"] == "none" and state["del"] == "none"
    assert state["changes"] >= 2 and state["rows"] == ["demo"]
    assert kept["id"] == picked and kept["label"] in facts and "demo" in facts
    assert teach_shown != "none" and gone == 404
