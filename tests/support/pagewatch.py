"""What a browser test asserts of our page whatever else it checks: it raised no error (uncaught exceptions,
rejected promises, ``console.error``) and its health pill is not in the bad state.

``chromium_page`` (``support.live``) and ``firefox_page`` (``support.firefox_bidi``) attach a ``PageWatch`` to each
page they open. ``running_app`` checks every open page before it stops the server (a page whose server has gone
says so, rightly); a page closed while its server is up (opened inside ``running_app``, or with a server of the
test's own) is checked as it closes, unless it was checked already. A test that provokes an error on purpose
names it: ``watch_of(page).allow("regex")``.
"""

from __future__ import annotations

import re
from collections.abc import Awaitable, Callable
from typing import Any

# the pill's class and text, or None where the page is not ours (aiortc's example page, a WHIP client's page)
PILL = "() => { const h = document.getElementById('health'); return h ? [h.className, h.textContent] : null; }"

_open: dict[int, PageWatch] = {}


class PageWatch:
    def __init__(self, page: Any, evaluate: Callable[[str], Awaitable[Any]]) -> None:
        self.page = page
        self.errors: list[str] = []
        self.allowed: list[re.Pattern[str]] = []
        self.checked = False  # by running_app while its server was up (the page outlives it)
        self._evaluate = evaluate
        _open[id(page)] = self

    def error(self, text: str) -> None:
        self.errors.append(text)

    def allow(self, pattern: str) -> None:
        self.allowed.append(re.compile(pattern))

    def close(self) -> None:
        _open.pop(id(self.page), None)

    def unexpected(self) -> list[str]:
        return [e for e in self.errors if not any(p.search(e) for p in self.allowed)]

    async def check(self) -> None:
        """Assert no unexpected error so far and a health pill that is not bad (where the page has one). The pill is
        read first: a driver that delivers the page's log between commands has delivered it by then."""
        pill = await self._evaluate(PILL)
        self.checked = True
        errors = self.unexpected()
        assert not errors, f"the page raised {len(errors)} error(s): {errors[:5]}"
        assert pill is None or "bad" not in str(pill[0]).split(), f"the page's health pill is bad: {pill[1]!r}"


def watch_of(page: Any) -> PageWatch:
    return _open[id(page)]


def watch_chromium(page: Any) -> PageWatch:
    """Playwright's page events: ``pageerror`` (uncaught) and console messages of type ``error``."""
    w = PageWatch(page, page.evaluate)
    page.on("pageerror", lambda exc: w.error(f"uncaught: {exc}"))
    page.on("console", lambda m: w.error(f"console.error: {m.text} ({m.location.get('url')})")
            if m.type == "error" else None)
    return w


async def check(page: Any) -> None:
    await watch_of(page).check()


async def check_open_pages() -> None:
    """Every page open now (``running_app`` calls it before the server stops)."""
    for w in list(_open.values()):
        await w.check()
