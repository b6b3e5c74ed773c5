"""Our page in Debian's Firefox ESR (headless, WebDriver BiDi, its fake camera): a second browser engine.

Firefox's WebRTC stack differs from Chromium's (its own ICE, DTLS with its own certificate, a different VP8
encoder and RTCP): the page connects, the annotated video plays, results arrive, and the server gets an RTT
from the RTCP Firefox sends.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import pytest
from support.live import REPO, skip_or_fail

pytestmark = [pytest.mark.browser, pytest.mark.slow, pytest.mark.live]


async def test_page_in_firefox(app_config: Callable[..., Any], serve: Any) -> None:
    from support.firefox_bidi import available, firefox_page

    if not available():
        skip_or_fail("needs Debian's firefox-esr (apt-get install firefox-esr; .ci/test does)")
    async with serve(app_config()) as base, firefox_page() as page:
        await page.goto(f"{base}/?video=1")  # annotated video back
        await page.evaluate("document.getElementById('connect').click()")
        seen = await page.wait_for(
            "edge.error ? {error: edge.error} : (edge.results >= 150 && edge.framesDecoded >= 60"
            " && edge.lastResult.rtt_source.split('+').includes('rtcp')) && {state: edge.state, "
            "results: edge.results, decoded: edge.framesDecoded, last: edge.lastResult}", timeout_s=60)
        await page.evaluate("document.getElementById('disconnect').click()")
        await page.goto(f"{base}/")  # the default: results only, drawn over Firefox's own camera
        await page.evaluate("document.getElementById('connect').click()")
        first = await page.wait_for(
            "edge.error ? {error: edge.error} : edge.results >= 60 && edge.overlayDrawn >= 30 && "
            "{results: edge.results, drawn: edge.overlayDrawn, local: document.getElementById('video').videoWidth}",
            timeout_s=60)
        out = REPO / "artifacts" / "test-browser"
        out.mkdir(parents=True, exist_ok=True)
        await page.screenshot(out / "firefox.png")
    print(f"Firefox: {seen.get('results')} results, {seen.get('decoded')} frames decoded, RTT "
          f"{seen.get('last', {}).get('network', {}).get('rtt_ms')} ms ({seen.get('last', {}).get('rtt_source')})")
    print(f"Firefox, results first: {first}")
    assert "error" not in seen, seen
    assert "error" not in first and first["local"] > 0, first
    assert seen["state"] == "connected" and seen["last"]["deadline_met"] in (True, False)
    assert 0 < seen["last"]["network"]["rtt_ms"] < 50
