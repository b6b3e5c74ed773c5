"""What the browser should send us: pure decisions, no asyncio, tested synchronously.

``UplinkController``: from how late the browser's frames arrive (``late_ms``: transit above the path's floor, read
from each frame's RTP timestamp), cut the bitrate cap (and the resolution, not below what the model needs) while
frames queue on the way in, raise it again after a calm spell.
"""

from __future__ import annotations

import math
from collections import deque
from dataclasses import dataclass


@dataclass(frozen=True)
class UplinkRequest:
    max_bitrate_bps: int | None  # None: no cap (the browser's own congestion control decides)
    scale_down: float  # RTCRtpEncodingParameters.scaleResolutionDownBy
    max_fps: float


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
