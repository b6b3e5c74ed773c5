"""A peer's data channel: results out (compact, with every field once a second or on request), the protocol's
other messages both ways (``edge_app.protocol``), and what a full channel costs: a result that cannot go is
counted, never queued behind the others."""

from __future__ import annotations

import logging
import time
from collections.abc import Callable

from aiortc import RTCDataChannel

from edge_app import protocol
from edge_app.peer.monitor import NetworkMonitor
from edge_app.results import AnalysedFrame

log = logging.getLogger(__name__)

# results beyond this much waiting in the data channel are dropped (and counted), not queued: ~1 s of compact results
# at 30 fps, half a second at 250 kbit/s. A late result is no use, and a long queue keeps every later one late too
MAX_BUFFERED_BYTES = 16 * 1024
DETAIL_EVERY_S = 1.0  # a full result (every field) this often; the others are compact


class ResultChannel:
    def __init__(self, sid: str, monitor: NetworkMonitor, class_names: list[str], full_results: bool,
                 on_result_dropped: Callable[[], None], heard: Callable[[], None]) -> None:
        self.id = sid
        self.monitor = monitor
        self.class_names = class_names
        self.full_results = full_results  # every field on every result (the offer asked: "results": "full")
        self.channel: RTCDataChannel | None = None  # once the peer opened one
        self.results_sent = 0
        self.results_not_sent = 0  # the data channel was not open or its buffer was full
        self.bad_messages = 0
        self.send_errors = 0
        self.on_pong: Callable[[float, float], None] | None = None  # (RTT ms, ping sent at): the video's rate
        self._on_result_dropped = on_result_dropped
        self._heard = heard
        self._detail_sent_s = 0.0
        self._reported: dict[str, protocol.Message] = {}  # the last source/video state told, by type

    def attach(self, channel: RTCDataChannel) -> None:
        self.channel = channel
        channel.on("message", self._on_message)

    @property
    def open(self) -> bool:
        return self.channel is not None and self.channel.readyState == "open"

    @property
    def state(self) -> str | None:
        return None if self.channel is None else self.channel.readyState

    def on_output(self, af: AnalysedFrame) -> None:
        """One analysed frame: its result, if the channel has room for it now."""
        if self.channel is None:
            return
        if not self.open or self.channel.bufferedAmount > MAX_BUFFERED_BYTES:
            self._not_sent()
            return
        now = time.monotonic()
        detail = self.full_results or now - self._detail_sent_s >= DETAIL_EVERY_S
        extra: dict[str, object] = {"rtt_source": self.monitor.rtt_source}
        if detail:
            self._detail_sent_s = now
            extra.update(session=self.id, receive_estimate_bps=self.monitor.receive_estimate_bps)
        if self.send(protocol.result(af.result, af.classes or self.class_names, detail, **extra)):
            self.results_sent += 1
        else:
            self._not_sent()

    def _not_sent(self) -> None:
        self.results_not_sent += 1
        self._on_result_dropped()

    def _on_message(self, message: object) -> None:
        self._heard()
        try:
            msg = protocol.parse_from_peer(message)
        except protocol.ProtocolError as exc:
            self.bad_messages += 1
            log.info("session %s: bad data-channel message: %s", self.id, exc)
            self.send(protocol.Error(str(exc)))
            return
        if isinstance(msg, protocol.TextPing):
            self._send_text(msg.answer())
        elif isinstance(msg, protocol.Ping):
            self.send(protocol.Pong(msg.id))
        else:
            answered = self.monitor.pong(msg.id)
            if answered is not None and self.on_pong is not None:
                self.on_pong(*answered)

    def model_changed(self, class_names: list[str], num_exits: int, name: str) -> None:
        """The server swapped its model: results now carry these classes (the page redraws its legend and charts)."""
        self.class_names = class_names
        self.send(protocol.Model(name, tuple(class_names), num_exits))

    def report(self, msg: protocol.Source | protocol.Video) -> None:
        """Tell the peer a state (a camera's, what the video shows) when it changed since it was last told."""
        if self.open and self._reported.get(msg.TYPE) != msg and self.send(msg):
            self._reported[msg.TYPE] = msg

    def send(self, msg: protocol.Message) -> bool:
        return self._send_text(msg.encode())

    def _send_text(self, text: str) -> bool:
        """Send if the channel is open; False (and one log line per session) when the peer refuses it."""
        if self.channel is None or not self.open:
            return False
        try:
            self.channel.send(text)
        except ValueError as exc:  # over the peer's a=max-message-size
            self.send_errors += 1
            if self.send_errors == 1:
                log.warning("session %s: the peer refuses a %d-byte message (%s); such messages are dropped",
                            self.id, len(text.encode()), exc)
            return False
        return True

    def status(self) -> dict[str, object]:
        return {"data_channel": self.state, "results_sent": self.results_sent,
                "results_not_sent": self.results_not_sent, "bad_messages": self.bad_messages,
                "send_errors": self.send_errors}
