"""What a newcomer sees first: the shipped ``config.toml`` (the demo camera on) served, the page opened, nothing
pressed. The page lists the cameras and says the server is healthy; it never shows a crash. Its reading of
``/status`` rests on what every source kind reports (``streams.source.STATUS_KEYS``)."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest
from support.live import DEFAULT_MODEL, REPO, running_app

from edge_app.config import load_config
from edge_app.sources import DEMO_FRAMES
from streams.demo import DemoCamera
from streams.filecam import FileCamera
from streams.rtsp import RtspCamera
from streams.source import STATUS_KEYS, CameraSource


def test_every_source_kind_reports_the_keys_the_page_reads(tmp_path: Path) -> None:
    kinds: list[CameraSource] = [RtspCamera("door", "rtsp://user:pw-Zq8v3@192.0.2.10:554/s"),
                                 FileCamera("porch", tmp_path / "porch.mp4"), DemoCamera("demo", DEMO_FRAMES)]
    for source in kinds:
        status = source.status()
        missing = [k for k in STATUS_KEYS if k not in status]
        assert not missing, f"{source.kind}: /status lacks {missing}"
        assert isinstance(status["transport_in_use"], str) and status["transport_in_use"], status
        assert "pw-Zq8v3" not in str(status)


def _shipped_config(tmp_path: Path) -> Any:
    """The repository's config.toml as a newcomer runs it, its model found from elsewhere and its files in tmp."""
    text = (REPO / "config.toml").read_text().replace('path = "models/default"', f'path = "{DEFAULT_MODEL}"')
    path = tmp_path / "config.toml"
    path.write_text(text + '\n[events]\npath = "events"\n')
    return load_config(path)


@pytest.mark.browser
@pytest.mark.slow
@pytest.mark.live
async def test_the_first_view_lists_the_demo_camera_and_a_healthy_server(tmp_path: Path, browser: Any) -> None:
    cfg = _shipped_config(tmp_path)
    assert cfg.demo.enabled, "the shipped config turns the demo camera on"
    async with browser() as page, running_app(cfg) as base:
        await page.goto(f"{base}/")
        await page.wait_for_function("() => document.querySelector('#cameras li') && "
                                     "document.querySelector('#cameras li').textContent.startsWith('demo: streaming')",
                                     timeout=20_000)
        await page.wait_for_timeout(4_500)  # two more refreshes of /status
        seen = await page.evaluate("() => ({cameras: [...document.querySelectorAll('#cameras li')].map((li) => "
                                   "li.textContent), health: [document.getElementById('health').className, "
                                   "document.getElementById('health').textContent], "
                                   "sources: [...document.getElementById('source').options].map((o) => o.text)})")
    print(f"first view: {seen}")
    assert seen["health"][0] == "pill ok", seen["health"]
    assert seen["cameras"][0].startswith("demo: streaming over DEMO"), seen["cameras"]
    assert any(s.startswith("demo: labelled demo frames") for s in seen["sources"]), seen["sources"]
