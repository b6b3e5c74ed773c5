"""Headless Chromium with the probe client: connects, runs until a wall-clock time, writes what it saw.

``python -m edge_app.bench.netbench.driver --url http://HOST:PORT/?probe=1 --camera F.y4m --until EPOCH --out F.json``
(the benchmark runs it inside the client namespace).  The JSON holds the page's probe records
(``edge_app/static/probe.js``): for every counter it stamped the wall-clock stamping time and the
camera's own stamp, every result message with its arrival time, and the display times of annotated
frames; the page's error, if any; and what the page raised meanwhile (``page_errors``: uncaught exceptions and
``console.error`` lines) with its health pill at the end (``health``: class and text).
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import json
import shutil
import time
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any
from urllib.parse import urlsplit

CHROMIUM = "/usr/bin/chromium"
CHROMIUM_ARGS = [
    "--no-sandbox", "--disable-gpu", "--disable-dev-shm-usage",  # as root, no GPU, small /dev/shm in containers
    "--disable-background-networking", "--disable-component-update", "--disable-sync", "--no-first-run",
    "--allow-loopback-in-peer-connection", "--disable-features=WebRtcHideLocalIpsWithMdns",
    "--use-fake-ui-for-media-stream", "--use-fake-device-for-media-stream",
    "--autoplay-policy=no-user-gesture-required",
]

COLLECT = """() => ({
  error: edge.error, state: edge.state, session: edge.session, probeErrors: edge.probe ? edge.probe.errors : null,
  sent: edge.probe ? edge.probe.log : [], stats: edge.probe ? edge.probe.stats : [],
  results: edge.probe ? edge.probe.results : [], displays: edge.probe ? edge.probe.displays : [],
  latency: edge.probeLatencies(),
  health: document.getElementById("health") ? [document.getElementById("health").className,
                                               document.getElementById("health").textContent] : null,
})"""


def chromium_args(fake_camera: Path | None = None, insecure_origin: str | None = None) -> list[str]:
    args = list(CHROMIUM_ARGS)
    if fake_camera is not None:
        args.append(f"--use-file-for-fake-video-capture={fake_camera}")
    if insecure_origin is not None:  # camera access and insertable streams need a secure origin
        args.append(f"--unsafely-treat-insecure-origin-as-secure={insecure_origin}")
    return args


@contextlib.asynccontextmanager
async def chromium_page(fake_camera: Path | None = None, insecure_origin: str | None = None,
                        echo_console: bool = True, extra_args: list[str] | None = None) -> AsyncIterator[Any]:
    """A page in Debian's headless Chromium (Playwright's own browser download does not work here)."""
    if shutil.which(CHROMIUM) is None:
        raise FileNotFoundError(f"{CHROMIUM} not found: apt-get install chromium")
    from playwright.async_api import async_playwright

    async with async_playwright() as p:
        browser = await p.chromium.launch(executable_path=CHROMIUM, headless=True,
                                          args=chromium_args(fake_camera, insecure_origin) + (extra_args or []))
        try:
            page = await browser.new_page(viewport={"width": 1280, "height": 900})
            if echo_console:
                page.on("console", lambda m: print(f"[browser] {m.type}: {m.text}", flush=True))
            yield page
        finally:
            await browser.close()


async def drive(url: str, camera: Path, until: float, screenshot: Path | None = None) -> dict[str, Any]:
    parts = urlsplit(url)
    origin = f"{parts.scheme}://{parts.netloc}"
    async with chromium_page(camera, origin if parts.hostname not in ("127.0.0.1", "localhost") else None) as page:
        raised: list[str] = []
        page.on("pageerror", lambda exc: raised.append(f"uncaught: {exc}"))
        page.on("console", lambda m: raised.append(f"console.error: {m.text}") if m.type == "error" else None)
        for attempt in range(40):  # the server may still be starting
            try:
                await page.goto(url, timeout=5_000)
                break
            except Exception:
                if attempt == 39:
                    raise
                await asyncio.sleep(0.5)
        await page.click("#connect")
        await page.wait_for_function("() => edge.error || edge.state === 'connected'", timeout=30_000)
        while time.time() < until:
            if await page.evaluate("() => edge.error"):
                break
            await asyncio.sleep(min(1.0, max(0.0, until - time.time())))
        if screenshot is not None:
            await page.screenshot(path=str(screenshot), full_page=True)
        out: dict[str, Any] = await page.evaluate(COLLECT)
        out["page_errors"] = raised
    return out


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog="python -m edge_app.bench.netbench.driver", description=__doc__.split("\n\n")[0])
    p.add_argument("--url", required=True)
    p.add_argument("--camera", type=Path, required=True, help="y4m file for Chromium's fake camera")
    p.add_argument("--until", type=float, required=True, help="wall-clock time (time.time()) to stop at")
    p.add_argument("--out", type=Path, required=True)
    p.add_argument("--screenshot", type=Path, default=None)
    args = p.parse_args(argv)
    out = asyncio.run(drive(args.url, args.camera, args.until, args.screenshot))
    args.out.write_text(json.dumps(out))
    print(f"driver: {len(out['results'])} results, {len(out['sent'])} frames stamped, "
          f"{len(out['displays'])} displayed, error {out['error']!r}", flush=True)
    return 0 if out["error"] is None else 1


if __name__ == "__main__":
    raise SystemExit(main())
