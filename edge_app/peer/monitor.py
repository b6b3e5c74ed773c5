"""A peer's network, as the session measures it, published to whoever budgets for it when it changes.

RTT samples come from each RTCP receiver report on the video we send back (about one a second) and from
data-channel ping/pong (four a second, so a step in the path's delay is seen within half a second), into one
``RttEstimator``; the bitrate from the video sender's target. Until the first sample the configured priors
are used. ``subscribe`` gives the view at once and again whenever it moves: a pipeline is pushed its viewers'
views, it never pulls them per frame.
"""

from __future__ import annotations

import time
from collections.abc import Callable

from edge_app.config import BudgetConfig
from edge_app.decision.budget import expected_frame_bytes
from edge_app.protocol import Ping
from edge_app.results import NetworkView
from streams.netstats import BitrateEstimator, RttEstimator, snapshot

PING_S = 0.25  # data-channel ping interval: RTT samples between receiver reports (about one a second)
JSON_RESULT_BYTES = 600.0  # what one result costs on the wire (compact, with SCTP), for data-channel-only viewers
MOVED = 0.02  # a view is published again when its RTT, bitrate or frame bytes moved this much (or RTT 1 ms)

Listener = Callable[[NetworkView], None]


class NetworkMonitor:
    def __init__(self, budget: BudgetConfig) -> None:
        self.rtt = RttEstimator(budget.rtt_prior_ms)
        self.bitrate = BitrateEstimator(budget.bitrate_prior_kbps * 1e3)
        self.sources: set[str] = set()  # what has given RTT samples: "rtcp", "datachannel"
        self.receive_estimate_bps: int | None = None  # what our receiver estimates the peer's uplink carries
        self.sends_video = False  # annotated video goes back: a frame costs its share of the path
        self.fps = 0.0  # video frames sent per second (smoothed)
        self.last_rtcp_rtt_ms: float | None = None
        self.pings: dict[int, float] = {}  # id -> monotonic send time, unanswered
        self._ping_id = 0
        self._last_ping_s = 0.0
        self._listeners: list[Listener] = []
        self._published: NetworkView | None = None

    @property
    def rtt_source(self) -> str:
        """"rtcp", "datachannel", both joined by "+", or "prior" before the first sample."""
        return "+".join(sorted(self.sources, reverse=True)) or "prior"

    def view(self) -> NetworkView:
        est = snapshot(self.rtt, self.bitrate)
        # an annotated frame's share of the path per result interval: at a lower frame rate (a narrow path) the
        # frames are bigger but fewer, and a result never waits for one, so never count more than 1/30 s of it
        frame_bytes = (expected_frame_bytes(est.bitrate_bps, max(self.fps, 30.0)) if self.sends_video
                       else JSON_RESULT_BYTES)
        return NetworkView(est, frame_bytes)

    # --- publishing ----------------------------------------------------------------------------------------

    def subscribe(self, listener: Listener) -> None:
        self._listeners.append(listener)
        listener(self._published or self.view())

    def unsubscribe(self, listener: Listener) -> None:
        if listener in self._listeners:
            self._listeners.remove(listener)

    def publish(self) -> None:
        """Tell the listeners, if the view moved since they were last told."""
        view = self.view()
        last = self._published
        if last is not None and not _moved(last, view):
            return
        self._published = view
        for listener in list(self._listeners):
            listener(view)

    # --- samples -------------------------------------------------------------------------------------------

    def rtt_sample(self, rtt_ms: float, source: str) -> None:
        self.rtt.add(time.monotonic(), rtt_ms)
        self.sources.add(source)
        if source == "rtcp":
            self.last_rtcp_rtt_ms = rtt_ms
        self.publish()

    def target_bitrate(self, bps: int) -> None:
        self.bitrate.add(bps)

    def frames_sent(self, fps: float) -> None:
        self.fps = fps if self.fps == 0 else 0.7 * self.fps + 0.3 * fps

    def next_ping(self, now: float) -> Ping | None:
        """A ping to send, if one is due (lost ones are forgotten after 10 s)."""
        if now - self._last_ping_s < PING_S:
            return None
        self._last_ping_s = now
        self._ping_id += 1
        self.pings = {k: v for k, v in self.pings.items() if now - v < 10}
        self.pings[self._ping_id] = now
        return Ping(self._ping_id, round(time.time() * 1e3, 1))  # our clock: the page lines up frames with it

    def pong(self, ping_id: int | None) -> tuple[float, float] | None:
        """(RTT ms, when the ping was sent) for the pong of ``ping_id``; None for one not ours or too old."""
        sent = None if ping_id is None else self.pings.pop(ping_id, None)
        if ping_id is not None:  # the channel is ordered: pings older than this pong will not be answered any more
            self.pings = {k: v for k, v in self.pings.items() if k > ping_id}
        if sent is None:
            return None
        rtt_ms = (time.monotonic() - sent) * 1e3
        self.rtt_sample(rtt_ms, "datachannel")
        return rtt_ms, sent

    def oldest_unanswered(self) -> float | None:
        """When the oldest ping still unanswered was sent: a lower bound on the RTT that grows with a queue."""
        return min(self.pings.values()) if self.pings else None

    def status(self) -> dict[str, object]:
        est = snapshot(self.rtt, self.bitrate)
        return {"rtt_ms": round(est.rtt_ms, 2), "rtt_source": self.rtt_source, "bitrate_bps": round(est.bitrate_bps),
                "receive_estimate_bps": self.receive_estimate_bps}


def _moved(a: NetworkView, b: NetworkView) -> bool:
    ea, eb = a.estimate, b.estimate
    return (abs(ea.rtt_ms - eb.rtt_ms) > max(1.0, MOVED * ea.rtt_ms)
            or abs(ea.bitrate_bps - eb.bitrate_bps) > MOVED * ea.bitrate_bps
            or abs(a.frame_bytes - b.frame_bytes) > MOVED * a.frame_bytes
            or ea.rtt_from_prior != eb.rtt_from_prior or abs(ea.rtt_low_ms - eb.rtt_low_ms) > 1.0)
