"""Signed webhooks: each event change a ``[[webhooks]]`` entry asks for is POSTed to its URL as JSON, signed as
GitHub signs its deliveries: ``X-Edge-Signature-256: sha256=HEX``, the HMAC-SHA256 of the body with the hook's
secret. Only configured URLs are called.

Each hook has its own bounded queue and one sender task: a change is queued at once (a full queue drops it and
counts it), so no pipeline ever waits on a receiver. A delivery that fails (no answer within ``timeout_s``, a
refused connection, a 5xx) is retried ``retries`` times with backoff (0.5 s, 1 s, 2 s...), then counted as
failed; a 4xx is not retried.

At a clean stop (``drain``) what is queued is still sent, within a bound: what is left after it is counted as
``not_sent_at_stop`` and said in one line.
"""

from __future__ import annotations

import asyncio
import hashlib
import hmac
import logging
import uuid
from typing import Any

import aiohttp

from edge_app.config.outputs import WebhookConfig
from edge_app.events.detector import EventChange, StateChange
from edge_app.events.topics import event_payload
from streams.redact import redact_url

log = logging.getLogger(__name__)

QUEUE = 1000
SIGNATURE_HEADER = "X-Edge-Signature-256"


def signature(secret: str, body: bytes) -> str:
    return "sha256=" + hmac.new(secret.encode(), body, hashlib.sha256).hexdigest()


class Hook:
    def __init__(self, cfg: WebhookConfig) -> None:
        self.cfg = cfg
        self.safe_url = redact_url(cfg.url)
        self.queue: asyncio.Queue[EventChange] = asyncio.Queue(QUEUE)
        self.counts = {"sent": 0, "retries": 0, "failed": 0, "dropped": 0, "not_sent_at_stop": 0}

    def offer(self, change: EventChange) -> None:
        if change.kind not in self.cfg.events:
            return
        try:
            self.queue.put_nowait(change)
        except asyncio.QueueFull:
            self.counts["dropped"] += 1

    async def run(self, http: aiohttp.ClientSession) -> None:
        while True:
            change = await self.queue.get()
            try:
                await self._deliver(http, change)
            finally:
                self.queue.task_done()

    async def drain(self, timeout_s: float) -> None:
        """Wait until every change queued so far is delivered (or given up), at most ``timeout_s``."""
        try:
            await asyncio.wait_for(self.queue.join(), timeout_s)
        except TimeoutError:
            left = self.queue.qsize() + 1  # those queued, and the one being sent
            self.counts["not_sent_at_stop"] += left
            log.warning("webhook %s: %d change(s) not delivered at stop (the receiver did not take them within "
                        "%.1f s)", self.safe_url, left, timeout_s)

    async def _deliver(self, http: aiohttp.ClientSession, change: EventChange) -> None:
        body = event_payload(change)
        headers = {"Content-Type": "application/json", "X-Edge-Event": change.kind,
                   "X-Edge-Delivery": uuid.uuid4().hex}
        if self.cfg.secret:
            headers[SIGNATURE_HEADER] = signature(self.cfg.secret, body)
        why = ""
        for attempt in range(self.cfg.retries + 1):
            if attempt:
                self.counts["retries"] += 1
                await asyncio.sleep(0.5 * 2 ** (attempt - 1))
            try:
                async with http.post(self.cfg.url, data=body, headers=headers,
                                     timeout=aiohttp.ClientTimeout(total=self.cfg.timeout_s)) as r:
                    if r.status < 300:
                        self.counts["sent"] += 1
                        return
                    why = f"HTTP {r.status}"
                    if r.status < 500:
                        break  # the receiver refuses it: sending it again will not help
            except (aiohttp.ClientError, TimeoutError) as exc:
                why = type(exc).__name__
        self.counts["failed"] += 1
        if self.counts["failed"] == 1 or self.counts["failed"] % 100 == 0:
            log.warning("webhook %s: %s of event %s not delivered (%s); %d failed so far", self.safe_url,
                        change.kind, change.after.id, why, self.counts["failed"])

    def status(self) -> dict[str, Any]:
        return {"url": self.safe_url, "events": list(self.cfg.events), "queued": self.queue.qsize(), **self.counts}


class Webhooks:
    """The listener ``EventsOutput`` calls; ``run`` sends (one task per hook) until cancelled."""

    def __init__(self, hooks: list[WebhookConfig]) -> None:
        self.hooks = [Hook(h) for h in hooks]

    def __call__(self, change: StateChange | EventChange) -> None:
        if isinstance(change, EventChange):
            for hook in self.hooks:
                hook.offer(change)

    async def run(self) -> None:
        async with aiohttp.ClientSession() as http:
            await asyncio.gather(*(h.run(http) for h in self.hooks))

    async def drain(self, timeout_s: float) -> None:
        await asyncio.gather(*(h.drain(timeout_s) for h in self.hooks))

    def status(self) -> list[dict[str, Any]]:
        return [h.status() for h in self.hooks]
