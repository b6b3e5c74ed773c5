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
* ``UplinkController``: what the browser should send us, from how late its frames arrive (``late_ms``: transit above
  the path's floor, read from each frame's RTP timestamp): cut the bitrate cap (and the resolution, not below
  what the model needs) while frames queue on the way in, raise it again after a calm spell.
"""

from __future__ import annotations

import math
from collections import deque
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


@dataclass(frozen=True)
class UplinkRequest:
    max_bitrate_bps: int | None  # None: no cap (the browser's own congestion control decides)
    scale_down: float  # RTCRtpEncodingParameters.scaleResolutionDownBy
    max_fps: float

    def message(self) -> dict[str, object]:
        return {"type": "uplink", "max_bitrate_bps": self.max_bitrate_bps, "scale_down": self.scale_down,
                "max_fps": self.max_fps}


class UplinkController:
    """AIMD on what the browser may send: while its frames arrive late (a queue on the way in), cut the cap to
    60 % of what it is every ``CUT_EVERY_S``; after ``CALM_S`` of
    frames on time, raise it by a quarter every ``CALM_S``, and lift it altogether above ``MAX_BPS``.  Under
    400 kbit/s ask for half the resolution, under 200 for a quarter (never under ``min_height`` lines: the
    model still needs its input size), under ``LOW_FPS_BPS`` for 15 fps: fewer frames, each still readable
    (the browser keeps the frame rate it is asked for: the page sets ``maintain-framerate``).

    ``max_height``: a session that only wants results asks for no more lines than the analysis uses (the browser
    scales its camera down before it encodes; the server then decodes a fraction of the pixels), and no more bits
    than such a picture needs (``UPLINK_BPP``), from its first frame on; every later request keeps to both. Left
    to itself a browser sends a small picture at its full rate: under a sudden cap that is a queue of seconds."""

    LATE_MS = 60.0
    CALM_MS = 20.0
    CUT_EVERY_S = 0.5
    GROWING_MS = 30.0
    SUSTAIN_S = 0.8  # late this long before the first cut: a step in delay is read by the RTT estimate within ~1 s
    CALM_S = 3.0
    START_BPS = 800_000.0
    MAX_BPS = 2_000_000.0
    MIN_BPS = 120_000.0  # lower, and a keyframe takes seconds to cross the link: lateness, not less of it
    WARMUP_S = 5.0  # the first seconds of a session are late anyway (connecting, the encoder ramping up)
    RAMP_MS = 15.0  # transit up this much in each half of the last second: a queue filling, not a step
    UPLINK_SHARE = 0.75  # the frames' extra transit is at least this share of the RTT's rise: a queue on the way in
    LOW_FPS_BPS = 150_000.0  # under this cap, 15 fps: at 30, a 320x240 frame gets ~500 bytes and is unreadable
    UPLINK_BPP = 0.15  # bits per pixel at 30 fps a results-only picture is given: 221 kbit/s at 256x192

    def __init__(self, min_height: int = 240, max_height: int | None = None) -> None:
        self.min_height = min_height
        self.max_height = max_height
        self.cap_bps: float | None = None  # None: no limit asked for
        self._first_s: float | None = None
        self._full_height = 0  # the tallest frame seen: the camera's own height, before any scaling
        self._scale = 1.0
        self._late_start_ms = 0.0
        self._late_since: float | None = None
        self._calm_since: float | None = None
        self._changed_s = -1e9
        self._fps = 30.0  # the frame rate last asked for
        self._arrivals: deque[tuple[float, float]] = deque()

    @property
    def level(self) -> int:
        """0 while no limit is asked for; else how many halvings below the start the cap is (for /status)."""
        return 0 if self.cap_bps is None else 1 + max(0, round(math.log2(self.START_BPS / self.cap_bps)))

    def uplink_share(self, arrival_ms: float, rtt_rise_ms: float | None) -> bool:
        """Whether most of the RTT's rise is the way in: a standing queue there. A step in the path's delay
        raises both ways alike, so the frames' transit is then about half the RTT's rise (and the SUSTAIN_S
        wait covers the RTT estimate catching up with a step)."""
        if rtt_rise_ms is None or arrival_ms < self.LATE_MS:
            return False
        return arrival_ms >= self.UPLINK_SHARE * rtt_rise_ms

    def queue_growing(self, now_s: float, arrival_ms: float) -> bool:
        """Whether the frames' whole transit (``arrival_ms``, above the path's floor) has kept growing for the last
        second: a queue filling on the way in. A step in the path's delay raises it once and then stays; and
        ``late_ms``, which discounts what the RTT shows, misses an uplink queue when a queue on the way back
        raises the RTT as much."""
        hist = self._arrivals
        hist.append((now_s, arrival_ms))
        while hist and hist[0][0] < now_s - 1.2:
            hist.popleft()
        if arrival_ms < self.LATE_MS or hist[0][0] > now_s - 0.9:
            return False
        mid = min(hist, key=lambda h: abs(h[0] - (now_s - 0.5)))[1]
        return mid >= hist[0][1] + self.RAMP_MS and arrival_ms >= mid + self.RAMP_MS

    def update(self, now_s: float, late_ms: float, frame_height: int = 480,
               incoming_bps: float | None = None, arrival_ms: float | None = None,
               rtt_rise_ms: float | None = None) -> UplinkRequest | None:
        """A frame arrived ``late_ms`` late (its transit above the floor, less what the RTT already shows;
        ``arrival_ms``: not less it; ``rtt_rise_ms``: the RTT above its floor): the new request when the cap
        changes, else None."""
        first = self._first_s is None
        self._first_s = now_s if self._first_s is None else self._first_s
        self._full_height = max(self._full_height, frame_height)
        if first and self.base_scale > 1.0:
            return self._set(now_s, None)  # only the lines the analysis uses, from the start
        if now_s - self._first_s < self.WARMUP_S:
            return None
        if arrival_ms is not None and (self.queue_growing(now_s, arrival_ms) or self.uplink_share(arrival_ms,
                                                                                                   rtt_rise_ms)):
            late_ms = max(late_ms, arrival_ms)
        if self.cap_bps is not None or self.ceiling_bps is not None:
            # under our own cap the browser's pacer spreads each frame over up to a frame interval: its last packet
            # is that much later than its first, and that is the cap working, not a queue (else a low cap keeps
            # itself low: a cellular run never raised 120 kbit/s at 15 fps, ~40 ms late a frame)
            late_ms = max(0.0, late_ms - 1000.0 / self._fps)
        if late_ms >= self.LATE_MS:
            self._calm_since = None
            if self._late_since is None:
                self._late_since, self._late_start_ms = now_s, late_ms
            if now_s - self._late_since >= self.SUSTAIN_S and now_s - self._changed_s >= self.CUT_EVERY_S:
                base = self.cap_bps or min(self.START_BPS, self.ceiling_bps or self.START_BPS)
                # lateness that keeps growing is a queue filling faster than the path drains it: cut to what gets
                # through at once. A step in delay is a constant offset instead, and aiortc's receive estimate reads
                # it as congestion: then cut gently, from the cap alone.
                if incoming_bps and late_ms - self._late_start_ms >= self.GROWING_MS:
                    base = min(base, max(incoming_bps, self.MIN_BPS / 0.6))
                cap = max(self.MIN_BPS, 0.6 * base)
                return None if cap == self.cap_bps else self._set(now_s, cap)
        elif late_ms <= self.CALM_MS:
            self._late_since = None
            self._calm_since = now_s if self._calm_since is None else self._calm_since
            if self.cap_bps is not None and now_s - self._calm_since >= self.CALM_S \
                    and now_s - self._changed_s >= self.CALM_S:
                raised = self.cap_bps * 1.25
                return self._set(now_s, None if raised > (self.ceiling_bps or self.MAX_BPS) else raised)
        return None

    @property
    def ceiling_bps(self) -> float | None:
        """The most bits a results-only session is asked for (None: no ceiling)."""
        if self.max_height is None or self.base_scale <= 1.0:
            return None
        return self.ceiling_for(self.max_height)

    @classmethod
    def ceiling_for(cls, lines: int) -> float:
        """The bits a 4:3 picture of ``lines`` lines is given at 30 fps."""
        return cls.UPLINK_BPP * lines ** 2 * 4 / 3 * 30

    @property
    def base_scale(self) -> float:
        """The least scale-down asked for: the camera's height over ``max_height`` (1: no ceiling)."""
        if self.max_height is None or self._full_height <= self.max_height:
            return 1.0
        return self._full_height / self.max_height

    def _set(self, now_s: float, cap: float | None) -> UplinkRequest:
        self.cap_bps = cap
        self._changed_s = now_s
        base = self.base_scale
        if cap is None:
            ceiling = self.ceiling_bps
            self._fps = 30.0
            return UplinkRequest(None if ceiling is None else int(ceiling), base, 30.0)
        # half resolution under 400 kbit/s (full again only from 600: a keyframe at full size is a burst of its
        # own), a quarter under 200 (not under min_height); fewer frames only under LOW_FPS_BPS, where 30 a second
        # get too few bits each to stay readable (the model's detail, a probe's stamp): asked for, and counted
        halve = cap < 400_000 or (self._scale > 1.0 and cap < 600_000)
        scale = 1.0
        for s in ((4.0,) if cap < 200_000 else ()) + ((2.0,) if halve else ()):
            if self._full_height / s >= self.min_height:
                scale = s
                break
        self._scale = scale
        self._fps = 15.0 if cap < self.LOW_FPS_BPS else 30.0
        return UplinkRequest(int(cap), max(base, scale), self._fps)
