"""Debian's Firefox ESR, headless, driven over WebDriver BiDi (no geckodriver, no Playwright: neither works with
Debian's build offline).

``async with firefox_page() as page: await page.goto(url); await page.evaluate("1 + 1")``

The profile keeps it on this machine: every HTTP(S) request but localhost's goes to a dead local proxy, ICE uses
the loopback interface only (``media.peerconnection.ice.force_interface``), and the camera is Firefox's fake
device with no permission prompt.  (The Remote Agent also applies its recommended preferences, which switch off
updates, telemetry and the other background services.)
"""

from __future__ import annotations

import asyncio
import contextlib
import itertools
import json
import re
import shutil
import tempfile
from collections.abc import AsyncIterator, Callable
from pathlib import Path
from typing import Any

import aiohttp

from support.pagewatch import PageWatch

FIREFOX = "/usr/bin/firefox-esr"
PREFS = {
    "media.navigator.streams.fake": True,
    "media.navigator.permission.disabled": True,
    "media.peerconnection.ice.loopback": True,
    "media.peerconnection.ice.force_interface": "lo",
    "media.peerconnection.ice.obfuscate_host_addresses": False,
    "network.proxy.type": 1,
    "network.proxy.http": "127.0.0.1",
    "network.proxy.http_port": 9,
    "network.proxy.ssl": "127.0.0.1",
    "network.proxy.ssl_port": 9,
    "network.proxy.no_proxies_on": "localhost, 127.0.0.1",
    "network.proxy.allow_hijacking_localhost": False,
    "network.captive-portal-service.enabled": False,
    "network.connectivity-service.enabled": False,
    "network.dns.disablePrefetch": True,
    "app.update.disabledForTesting": True,
    "toolkit.telemetry.enabled": False,
    "datareporting.policy.dataSubmissionEnabled": False,
    "browser.safebrowsing.malware.enabled": False,
    "browser.safebrowsing.phishing.enabled": False,
    "services.settings.server": "http://127.0.0.1:9/",
}


def available() -> bool:
    return shutil.which(FIREFOX) is not None


class BidiPage:
    """One browsing context. The page's JavaScript errors and ``console.error`` lines (BiDi ``log.entryAdded``) go
    to its ``PageWatch`` as they are read, between commands."""

    def __init__(self, ws: aiohttp.ClientWebSocketResponse, context: str) -> None:
        self._ws = ws
        self.context = context
        self._ids = itertools.count(100)
        self.watch = PageWatch(self, self.evaluate)

    async def command(self, method: str, params: dict[str, Any], timeout_s: float = 30) -> dict[str, Any]:
        return await _command(self._ws, self._ids, method, params, timeout_s, self._event)

    def _event(self, msg: dict[str, Any]) -> None:
        if msg.get("method") != "log.entryAdded":
            return
        entry = msg.get("params", {})
        if entry.get("type") == "javascript" or entry.get("level") == "error":
            self.watch.error(f"{entry.get('type')} {entry.get('level')}: {entry.get('text')}")

    async def goto(self, url: str) -> None:
        await self.command("browsingContext.navigate", {"context": self.context, "url": url, "wait": "complete"})

    async def evaluate(self, expression: str) -> Any:
        """The value of a JavaScript expression (awaited if a promise), JSON-round-tripped."""
        res = await self.command("script.evaluate", {
            "expression": f"(async () => JSON.stringify(await ({expression})))()",
            "target": {"context": self.context}, "awaitPromise": True})
        if res.get("type") != "success":
            raise RuntimeError(f"script error: {res.get('exceptionDetails', res)}")
        value = res["result"].get("value")
        return None if value is None else json.loads(value)

    async def screenshot(self, path: Path) -> None:
        import base64

        res = await self.command("browsingContext.captureScreenshot", {"context": self.context, "origin": "document"})
        path.write_bytes(base64.b64decode(res["data"]))

    async def wait_for(self, expression: str, timeout_s: float) -> Any:
        t_end = asyncio.get_running_loop().time() + timeout_s
        while True:
            value = await self.evaluate(expression)
            if value:
                return value
            if asyncio.get_running_loop().time() > t_end:
                raise TimeoutError(f"{expression!r} still falsy after {timeout_s} s")
            await asyncio.sleep(0.25)


async def _command(ws: aiohttp.ClientWebSocketResponse, ids: itertools.count[int], method: str,
                   params: dict[str, Any], timeout_s: float = 30,
                   on_event: Callable[[dict[str, Any]], None] | None = None) -> dict[str, Any]:
    cid = next(ids)
    await ws.send_json({"id": cid, "method": method, "params": params})
    async with asyncio.timeout(timeout_s):
        while True:
            msg = await ws.receive_json()
            if msg.get("id") != cid:
                if on_event is not None and "method" in msg:
                    on_event(msg)
                continue  # events
            if msg.get("type") == "error":
                raise RuntimeError(f"{method}: {msg.get('error')}: {msg.get('message')}")
            result: dict[str, Any] = msg["result"]
            return result


@contextlib.asynccontextmanager
async def firefox_page() -> AsyncIterator[BidiPage]:
    with tempfile.TemporaryDirectory(prefix="ff-profile-") as profile:
        Path(profile, "user.js").write_text("".join(f"user_pref({json.dumps(k)}, {json.dumps(v)});\n"
                                                    for k, v in PREFS.items()))
        proc = await asyncio.create_subprocess_exec(
            FIREFOX, "--headless", "--no-remote", "--profile", profile, "--remote-debugging-port", "0",
            stdout=asyncio.subprocess.DEVNULL, stderr=asyncio.subprocess.PIPE)
        try:
            assert proc.stderr is not None
            url = None
            async with asyncio.timeout(60):
                while url is None:
                    line = (await proc.stderr.readline()).decode(errors="replace")
                    if not line:
                        raise RuntimeError("Firefox exited before its WebDriver BiDi endpoint was up")
                    m = re.search(r"WebDriver BiDi listening on (ws://\S+)", line)
                    url = m.group(1) if m else None
            drain = asyncio.create_task(_drain(proc.stderr))
            async with aiohttp.ClientSession() as http, http.ws_connect(f"{url}/session", max_msg_size=0) as ws:
                ids = itertools.count(1)
                await _command(ws, ids, "session.new", {"capabilities": {}})
                tree = await _command(ws, ids, "browsingContext.getTree", {})
                await _command(ws, ids, "session.subscribe", {"events": ["log.entryAdded"]})
                page = BidiPage(ws, tree["contexts"][0]["context"])
                try:
                    yield page
                    if not page.watch.checked:
                        await page.watch.check()
                finally:
                    page.watch.close()
                with contextlib.suppress(Exception):
                    await _command(ws, ids, "session.end", {}, timeout_s=5)
            drain.cancel()
        finally:
            if proc.returncode is None:
                proc.terminate()
                try:
                    await asyncio.wait_for(proc.wait(), 10)
                except TimeoutError:
                    proc.kill()
                    await proc.wait()


async def _drain(stream: asyncio.StreamReader) -> None:
    while await stream.readline():
        pass
