"""Send less when the path gets worse: pure rate decisions, no asyncio, tested synchronously.

* ``VideoRateController``: the target bitrate of annotated video we send back, from what the viewer's receiver
  reports say about the path (RTCP: loss, RTT rising above its floor, a REMB under what we send): cut by 30 % at once
  when the path shows congestion (at most every 0.5 s, so one burst of reports is one cut), raise by 8 % a second
  while it is clean, and frame rate and size with the bitrate (``max_fps``, ``scale_down``), so that a narrow path
  gets fewer, smaller frames rather than a queue. Reports come from RTCP (about one a second) and from the
  data channel's pongs (four a second, through the same queue as the video). Only evidence that holds up on a
  loaded box counts: one late RTT sample may be our own event loop running late, so a queue takes two in a row; a
  REMB is a browser's receive estimate, which starts low and grows only to about 1.5 times what arrives (an easy
  picture the encoder sends under its target keeps it low), so it is a ceiling only while it says less arrives
  than we send (its estimator saw overuse) while our own evidence (loss, or a queue in two samples in a row)
  shows congestion too, never by itself: else an uncongested loopback path ratchets down to a thumbnail.

What the browser should send us is ``streams.uplink.UplinkController``.
"""

from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True)
class VideoRate:
    target_bps: int
    max_fps: float
    scale_down: float = 1.0  # send the annotated frames at 1/scale_down of their width and height


class VideoRateController:
    CUT = 0.7
    DEEP_CUT = 0.5  # a long queue already (RTT 150 ms over its floor) or heavy loss: halve at once
    DEEP_RTT_RISE_MS = 150.0
    RAISE_PER_S = 1.08
    CUT_EVERY_S = 0.5
    LOSS_CONGESTED = 0.02  # fraction lost in a receiver report
    RTT_RISE_MS = 30.0  # RTT this far above its floor (and 50 % above it) reads as a queue building up
    REMB_SHARE = 0.7  # under overuse, video takes at most this share of what the peer says it can receive
    REMB_OVERUSE = 0.95  # a REMB under this share of what we send (measured) says the receiver sees overuse
    DRAINING_MS = 10.0  # RTT this much under the last cut's: the queue drains, the cut is working, wait
    DRAIN_WAIT_S = 3.0  # ... but not for longer than this
    STARVE_AFTER_S = 1.0
    STARVE_CLEAR_S = 3.0
    STARVE_TEST_S = 2.0
    STARVED_BPS = 20_000
    BITS_PER_PIXEL = 0.07  # per frame at 30 fps: what a picture of this size needs to look good, and no more
    HALF_SIZE_UNDER_BPS = 300_000  # half the width and height under this; full size again only from FULL_SIZE_BPS
    FULL_SIZE_BPS = 450_000

    def __init__(self, start_bps: int = 500_000, min_bps: int = 60_000, max_bps: int = 1_500_000) -> None:
        self.min_bps, self.max_bps = min_bps, max_bps
        self.target_bps = float(start_bps)
        self._last_cut_s = -1e9
        self._rtt_at_cut: float | None = None
        self._hold_until_s = -1e9
        self._late_probes = 0
        self.starved = False  # the path cannot even hold the floor's video next to the results: a frame a second
        self._starved_at: tuple[float, float] | None = None  # when, and the RTT then
        self.floor_shift_ms = 0.0  # delay the path added that starving did not remove: not a queue of ours
        self._floor_since: float | None = None
        self._clean_since: float | None = None
        self._last_update_s: float | None = None
        self._scale = 2.0 if start_bps < self.HALF_SIZE_UNDER_BPS else 1.0
        self.picture_bps: float | None = None  # the ceiling for the picture's size (``set_picture``)
        self.cuts = 0

    def congested(self, loss_fraction: float, rtt_ms: float | None, rtt_floor_ms: float | None) -> bool:
        if loss_fraction >= self.LOSS_CONGESTED:
            return True
        if rtt_ms is None or rtt_floor_ms is None:
            return False
        floor = rtt_floor_ms + self.floor_shift_ms  # the path's own delay, once starving showed it is not ours
        return rtt_ms > floor + self.RTT_RISE_MS and rtt_ms > 1.5 * floor

    def set_picture(self, width: int, height: int) -> None:
        """The annotated frames' full size: no more bits than it needs (a 320x240 picture gains nothing from 1
        Mbit/s, and every bit over is queue when the path narrows)."""
        self.picture_bps = max(float(self.min_bps), self.BITS_PER_PIXEL * width * height * 30.0)

    def update(self, now_s: float, loss_fraction: float, rtt_ms: float | None, rtt_floor_ms: float | None,
               remb_bps: float | None = None, probe_sent_s: float | None = None, sent_bps: float | None = None
               ) -> VideoRate:
        """One receiver report, or one RTT sample of a probe sent at ``probe_sent_s`` (a data-channel ping; its
        RTT says nothing of a cut made after it was sent): the new target. ``sent_bps``: what the video sender
        actually sent over the last second (a REMB is judged against it)."""
        dt = 0.0 if self._last_update_s is None else max(0.0, now_s - self._last_update_s)
        self._last_update_s = now_s
        if rtt_ms is not None and rtt_floor_ms is not None and rtt_ms < rtt_floor_ms + self.floor_shift_ms / 2:
            self.floor_shift_ms = 0.0  # the path's delay went back down
        congested = self.congested(loss_fraction, rtt_ms, rtt_floor_ms)
        if loss_fraction < self.LOSS_CONGESTED:
            # one late sample (a probe or a receiver report) may be the server's own event loop running late (it
            # times both): a queue makes every sample late, so it takes two in a row
            self._late_probes = self._late_probes + 1 if congested else 0
            congested = congested and self._late_probes >= 2
        if probe_sent_s is not None and probe_sent_s < self._hold_until_s and loss_fraction < self.LOSS_CONGESTED:
            pass  # a probe sent before the last cut could act (it queued behind what was sent before it)
        elif congested:
            # a queue that is already draining after a cut needs time, not another cut (which would overshoot to
            # the floor): cut again on a queue only while its RTT is not falling; loss cuts regardless
            draining = (loss_fraction < self.LOSS_CONGESTED and rtt_ms is not None and self._rtt_at_cut is not None
                        and now_s - self._last_cut_s < self.DRAIN_WAIT_S
                        and rtt_ms < self._rtt_at_cut - self.DRAINING_MS)
            if now_s - self._last_cut_s >= self.CUT_EVERY_S and not draining:
                deep = loss_fraction >= 0.1 or (rtt_ms is not None and rtt_floor_ms is not None
                                                and rtt_ms > rtt_floor_ms + self.DEEP_RTT_RISE_MS)
                self.target_bps *= self.DEEP_CUT if deep else self.CUT
                self._last_cut_s = now_s
                self._rtt_at_cut = rtt_ms
                # a probe sent in the next RTT (0.5..2 s) still waits behind the queue built before the cut
                self._hold_until_s = now_s + min(2.0, max(self.CUT_EVERY_S, (rtt_ms or 0.0) / 1e3))
                self.cuts += 1
        elif now_s - self._last_cut_s >= 2.0:  # a clean spell after the last cut: probe upwards slowly
            self.target_bps *= self.RAISE_PER_S ** dt
        if remb_bps is not None and sent_bps is not None and remb_bps < self.REMB_OVERUSE * sent_bps and congested:
            # the peer's estimate says less gets through than we send, and the path shows it (a queue or loss; a
            # browser's start-up estimate alone does not): it, less room for the results, is a ceiling
            self.target_bps = min(self.target_bps, self.REMB_SHARE * float(remb_bps))
        ceiling = self.max_bps if self.picture_bps is None else min(self.max_bps, self.picture_bps)
        self.target_bps = min(float(ceiling), max(float(self.min_bps), self.target_bps))
        self._starve(now_s, congested, rtt_ms, rtt_floor_ms)
        if self.target_bps < self.HALF_SIZE_UNDER_BPS:
            self._scale = 2.0
        elif self.target_bps >= self.FULL_SIZE_BPS:
            self._scale = 1.0  # in between: as it was (a change of size is a keyframe, a burst of its own)
        return self.rate

    def _starve(self, now_s: float, congested: bool, rtt_ms: float | None, rtt_floor_ms: float | None) -> None:
        """At the floor and still congested for STARVE_AFTER_S: the path cannot hold the results and even the
        floor's video (250 kbit/s: ~150 for 30 results a second, the video's 60 on top), so the video goes to
        a frame a second at STARVED_BPS until STARVE_CLEAR_S of a clean path. If starving does not bring the
        RTT down within STARVE_TEST_S, the delay is the path's, not our queue (a step in delay): it becomes
        the floor the RTT is judged against, and the video comes back."""
        at_floor = self.target_bps <= self.min_bps * 1.01
        if self.starved and rtt_ms is not None and rtt_floor_ms is not None and self._starved_at is not None:
            since, rtt_then = self._starved_at
            if now_s - since >= self.STARVE_TEST_S and rtt_ms > 0.8 * rtt_then and congested:
                self.floor_shift_ms = max(0.0, rtt_ms - rtt_floor_ms)
                self.starved, self._starved_at, self._floor_since = False, None, None
                return
        if congested and at_floor:
            self._clean_since = None
            self._floor_since = now_s if self._floor_since is None else self._floor_since
            if now_s - self._floor_since >= self.STARVE_AFTER_S and not self.starved:
                self.starved = True
                self._starved_at = (now_s, rtt_ms if rtt_ms is not None else 0.0)
        else:
            self._floor_since = None
            if not congested:
                self._clean_since = now_s if self._clean_since is None else self._clean_since
                if self.starved and now_s - self._clean_since >= self.STARVE_CLEAR_S:
                    self.starved, self._starved_at = False, None

    @property
    def rate(self) -> VideoRate:
        if self.starved:
            return VideoRate(self.STARVED_BPS, 1.0, 2.0)
        t = self.target_bps
        return VideoRate(round(t), 30.0 if t >= 300_000 else 15.0 if t >= 150_000 else 10.0, self._scale)
