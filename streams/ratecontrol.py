"""Send less when the path gets worse: pure rate decisions, no asyncio, tested synchronously.

* ``VideoRateController``: the target bitrate of annotated video we send back, from what the viewer's receiver
  reports say about the path (RTCP: loss, and RTT rising above its floor) on top of its REMB: cut by 30 % at once
  when the path shows congestion (at most every 0.5 s, so one burst of reports is one cut), raise by 8 % a second
  while it is clean, and frame rate with the bitrate (``max_fps``), so that a narrow path gets fewer, not worse,
  frames rather than a queue.
* ``UplinkController``: what the browser should send us, from how late its frames arrive (``late_ms``: transit above
  the path's floor, read from each frame's RTP timestamp): halve the bitrate cap (and the resolution, down to the
  model's needs) when frames queue on the way in, double it back after a calm spell.
"""

from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True)
class VideoRate:
    target_bps: int
    max_fps: float


class VideoRateController:
    CUT = 0.7
    RAISE_PER_S = 1.08
    CUT_EVERY_S = 0.5
    LOSS_CONGESTED = 0.02  # fraction lost in a receiver report
    RTT_RISE_MS = 30.0  # RTT this far above its floor (and 50 % above it) reads as a queue building up

    def __init__(self, start_bps: int = 500_000, min_bps: int = 60_000, max_bps: int = 1_500_000) -> None:
        self.min_bps, self.max_bps = min_bps, max_bps
        self.target_bps = float(start_bps)
        self._last_cut_s = -1e9
        self._last_update_s: float | None = None
        self.cuts = 0

    def congested(self, loss_fraction: float, rtt_ms: float | None, rtt_floor_ms: float | None) -> bool:
        if loss_fraction >= self.LOSS_CONGESTED:
            return True
        if rtt_ms is None or rtt_floor_ms is None:
            return False
        return rtt_ms > rtt_floor_ms + self.RTT_RISE_MS and rtt_ms > 1.5 * rtt_floor_ms

    def update(self, now_s: float, loss_fraction: float, rtt_ms: float | None, rtt_floor_ms: float | None,
               remb_bps: float | None = None) -> VideoRate:
        """One receiver report (or a periodic check): the new target."""
        dt = 0.0 if self._last_update_s is None else max(0.0, now_s - self._last_update_s)
        self._last_update_s = now_s
        if self.congested(loss_fraction, rtt_ms, rtt_floor_ms):
            if now_s - self._last_cut_s >= self.CUT_EVERY_S:
                self.target_bps *= self.CUT
                self._last_cut_s = now_s
                self.cuts += 1
        elif now_s - self._last_cut_s >= 2.0:  # a clean spell after the last cut: probe upwards slowly
            self.target_bps *= self.RAISE_PER_S ** dt
        if remb_bps is not None:  # the peer's own estimate is a ceiling too
            self.target_bps = min(self.target_bps, float(remb_bps))
        self.target_bps = min(float(self.max_bps), max(float(self.min_bps), self.target_bps))
        return self.rate

    @property
    def rate(self) -> VideoRate:
        t = self.target_bps
        return VideoRate(round(t), 30.0 if t >= 300_000 else 15.0 if t >= 150_000 else 10.0)


@dataclass(frozen=True)
class UplinkRequest:
    max_bitrate_bps: int
    scale_down: float  # RTCRtpEncodingParameters.scaleResolutionDownBy
    max_fps: float

    def message(self) -> dict[str, object]:
        return {"type": "uplink", "max_bitrate_bps": self.max_bitrate_bps, "scale_down": self.scale_down,
                "max_fps": self.max_fps}


class UplinkController:
    LATE_MS = 60.0  # frames this late (above the path's floor) for ``SUSTAIN_S`` mean a queue on the way in
    CALM_MS = 20.0
    SUSTAIN_S = 1.0
    CALM_S = 5.0
    STEPS = (UplinkRequest(1_500_000, 1.0, 30.0), UplinkRequest(600_000, 1.0, 30.0),
             UplinkRequest(300_000, 2.0, 30.0), UplinkRequest(150_000, 2.0, 15.0), UplinkRequest(80_000, 4.0, 15.0))

    def __init__(self) -> None:
        self.level = 0  # index into STEPS; 0: no limit asked for
        self._late_since: float | None = None
        self._calm_since: float | None = None
        self._changed_s = -1e9

    def update(self, now_s: float, late_ms: float) -> UplinkRequest | None:
        """A frame arrived ``late_ms`` late: the new request when the level changes, else None."""
        if late_ms >= self.LATE_MS:
            self._calm_since = None
            self._late_since = now_s if self._late_since is None else self._late_since
            if now_s - self._late_since >= self.SUSTAIN_S and now_s - self._changed_s >= self.SUSTAIN_S \
                    and self.level < len(self.STEPS) - 1:
                return self._move(now_s, +1)
        elif late_ms <= self.CALM_MS:
            self._late_since = None
            self._calm_since = now_s if self._calm_since is None else self._calm_since
            if now_s - self._calm_since >= self.CALM_S and now_s - self._changed_s >= self.CALM_S and self.level > 0:
                return self._move(now_s, -1)
        return None

    def _move(self, now_s: float, step: int) -> UplinkRequest:
        self.level += step
        self._changed_s = now_s
        self._late_since = self._calm_since = None
        return self.STEPS[self.level]
