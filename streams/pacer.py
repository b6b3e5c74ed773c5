"""What every outbound video does to a frame before it is encoded: a frame-rate gate, scaling, timestamps.

``VideoPacer`` is shared by a viewer's own track (``streams.webrtc.OutboundVideoTrack``) and a camera's one encoder
for all its viewers (``streams.shared_video.SharedEncoder``): the path's rate controller sets ``max_fps`` and
``scale_down``; ``admit`` is a token bucket of two frames (frames that come bunched, as the analysis takes longer
for some, all go out at the camera's rate, while a narrow path's lower rate still holds on average); ``stamp``
scales the frame and gives it a 90 kHz presentation time from the first frame sent.
"""

from __future__ import annotations

import fractions
import time

import av

VIDEO_CLOCK_RATE = 90_000
VIDEO_TIME_BASE = fractions.Fraction(1, VIDEO_CLOCK_RATE)


class VideoPacer:
    def __init__(self, burst: float = 2.0) -> None:
        self.burst = burst
        self._tokens = burst
        self._last_s = 0.0
        self._t0: float | None = None

    def admit(self, max_fps: float, now: float | None = None) -> bool:
        """Whether a frame arriving now fits under ``max_fps`` (it takes a token when it does)."""
        now = time.monotonic() if now is None else now
        self._tokens = min(self.burst, self._tokens + (now - self._last_s) * max_fps)
        self._last_s = now
        if self._tokens < 1.0:
            return False
        self._tokens -= 1.0
        return True

    def stamp(self, frame: av.VideoFrame, scale_down: float, now: float | None = None) -> av.VideoFrame:
        """``frame`` scaled by ``1/scale_down`` (even sizes), with its pts on the 90 kHz clock."""
        now = time.monotonic() if now is None else now
        if scale_down > 1.0:
            frame = frame.reformat(width=int(frame.width / scale_down) & ~1, height=int(frame.height / scale_down) & ~1)
        if self._t0 is None:
            self._t0 = now
        frame.pts = int((now - self._t0) * VIDEO_CLOCK_RATE)
        frame.time_base = VIDEO_TIME_BASE
        return frame
