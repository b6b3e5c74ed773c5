"""When a peer session ends, and why.

A session that has not connected ``connect_timeout_s`` after its offer is closed (``connect-timeout``); ICE
failing closes it at once (``ice-failed``), DTLS failing too (``dtls-failed``); a peer that stops answering is
closed after ``peer_timeout_s`` (``peer-gone``): nothing at all arrived from it, no data-channel message, no RTCP,
no video frame (a slow path whose pongs come back late is not a vanished peer); a peer that closes is
``closed``; the server stopping is ``shutdown``. The reason goes to the session's ``close`` once, whoever asks
first.
"""

from __future__ import annotations

import asyncio
import logging
import time
from collections.abc import Callable, Coroutine
from typing import Any

log = logging.getLogger(__name__)

CLOSE_REASONS = ("connect-timeout", "ice-failed", "dtls-failed", "peer-gone", "closed", "shutdown")
CONNECT_HINT = ("no network path between the browser and this box: for a browser on the same machine set [server] "
                "ice_host_addresses = [\"127.0.0.1\"]; for other machines serve HTTPS (tls_cert, tls_key) on an "
                "address they reach, or add a TURN server to [server] ice_servers")


class Lifecycle:
    def __init__(self, sid: str, pc: Any, connect_timeout_s: float, peer_timeout_s: float,
                 close: Callable[[str], Coroutine[Any, Any, None]]) -> None:
        self.id = sid
        self.pc = pc
        self.connect_timeout_s = connect_timeout_s
        self.peer_timeout_s = peer_timeout_s
        self.created_s = time.monotonic()
        self.connected_after_s: float | None = None
        self.timed_out = False
        self.closing = False
        self._close = close
        self._closer: asyncio.Task[None] | None = None
        self._last_heard: float | None = None  # last time anything arrived from the peer (message, RTCP, frame)

    @property
    def connected(self) -> bool:
        return self.connected_after_s is not None

    def heard(self) -> None:
        """Something arrived from the peer (a data-channel message, an RTCP packet, a video frame)."""
        self._last_heard = time.monotonic()

    def on_connection_state(self) -> None:
        """The peer connection's state changed: note when it connected; close it when it failed or closed."""
        state = self.pc.connectionState
        if state == "connected" and self.connected_after_s is None:
            self.connected_after_s = time.monotonic() - self.created_s
        elif state in ("failed", "closed"):
            reason = "closed" if state == "closed" else (
                "ice-failed" if self.pc.iceConnectionState == "failed" else "dtls-failed")
            self.close_soon(reason)

    def on_ice_state(self) -> None:
        if self.pc.iceConnectionState == "failed":
            self.close_soon("ice-failed")

    def close_soon(self, reason: str) -> None:
        if self._closer is None and not self.closing:
            self._closer = asyncio.create_task(self._close(reason), name=f"close-{self.id}")

    async def watch_connect(self) -> None:
        await asyncio.sleep(self.connect_timeout_s)
        if self.connected_after_s is None and not self.closing:
            log.warning("session %s: not connected %.0f s after its offer (ICE %s, connection %s): closing it. "
                        "Likely %s", self.id, self.connect_timeout_s, self.pc.iceConnectionState,
                        self.pc.connectionState, CONNECT_HINT)
            self.close_soon("connect-timeout")

    def alive(self, now: float) -> bool:
        """False (and the session closing as ``peer-gone``) once nothing came from a connected peer for
        ``peer_timeout_s``; the clock starts once connected."""
        if self.connected_after_s is None:
            return True
        if self._last_heard is None:
            self._last_heard = now
        elif now - self._last_heard > self.peer_timeout_s:
            log.warning("session %s: nothing from the peer for %.0f s (no message, RTCP or video): it is gone, "
                        "closing", self.id, now - self._last_heard)
            self.timed_out = True
            self.close_soon("peer-gone")
            return False
        return True
