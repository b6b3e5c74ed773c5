"""Network estimates from RTCP feedback: pure arithmetic, no aiortc, no asyncio.

``RttEstimator`` smooths round-trip-time samples (EWMA, with odd samples
clamped), follows a confirmed rise at once (the estimate is never below the
smaller of the last two samples, so one spike does not move it but a step
does within two samples) and adds a trend term: the least-squares slope of
the recent samples, when positive, is projected ``lookahead_s`` ahead, so a
worsening network is seen before the average catches up.  A falling RTT is
followed at the EWMA's pace: degrade early, recover with care.  Until
the first sample it answers with a configured prior.  ``BitrateEstimator``
does the same for REMB / receive-side bitrate estimates, without the trend.
"""

from __future__ import annotations

from collections import deque
from dataclasses import dataclass

import numpy as np


@dataclass(frozen=True)
class NetworkEstimate:
    rtt_ms: float  # smoothed, plus the positive trend projection
    rtt_smoothed_ms: float
    rtt_trend_ms_per_s: float
    bitrate_bps: float
    rtt_from_prior: bool
    bitrate_from_prior: bool


class _Ewma:
    """Exponentially weighted mean; ``None`` until the first sample."""

    def __init__(self, alpha: float) -> None:
        if not 0 < alpha <= 1:
            raise ValueError("alpha must be in (0, 1]")
        self.alpha = alpha
        self.value: float | None = None

    def add(self, v: float) -> None:
        self.value = v if self.value is None else self.alpha * v + (1 - self.alpha) * self.value


class RttEstimator:
    def __init__(self, prior_ms: float, alpha: float = 0.3, window: int = 16, lookahead_s: float = 1.0,
                 min_ms: float = 0.1, max_ms: float = 10_000.0) -> None:
        self.prior_ms = prior_ms
        self._ewma = _Ewma(alpha)
        self.lookahead_s = lookahead_s
        self.min_ms, self.max_ms = min_ms, max_ms
        self._samples: deque[tuple[float, float]] = deque(maxlen=window)

    def add(self, t_s: float, rtt_ms: float) -> None:
        """A new sample at time ``t_s`` (seconds, monotonic). Samples outside [min_ms, max_ms] are clamped."""
        v = min(max(rtt_ms, self.min_ms), self.max_ms)
        self._samples.append((t_s, v))
        self._ewma.add(v)
        if len(self._samples) >= 2:  # a rise seen twice in a row is real: do not wait for the average
            confirmed = min(self._samples[-1][1], self._samples[-2][1])
            if self._ewma.value is not None and confirmed > self._ewma.value:
                self._ewma.value = confirmed

    @property
    def has_samples(self) -> bool:
        return self._ewma.value is not None

    @property
    def smoothed_ms(self) -> float:
        return self.prior_ms if self._ewma.value is None else self._ewma.value

    @property
    def trend_ms_per_s(self) -> float:
        if len(self._samples) < 3:
            return 0.0
        t, v = np.array(self._samples).T
        if np.ptp(t) <= 0:
            return 0.0
        return float(np.polyfit(t - t[0], v, 1)[0])

    @property
    def estimate_ms(self) -> float:
        return self.smoothed_ms + max(0.0, self.trend_ms_per_s) * self.lookahead_s


class BitrateEstimator:
    def __init__(self, prior_bps: float, alpha: float = 0.3, min_bps: float = 10_000.0) -> None:
        self.prior_bps = prior_bps
        self.min_bps = min_bps
        self._ewma = _Ewma(alpha)

    def add(self, bps: float) -> None:
        self._ewma.add(max(bps, self.min_bps))

    @property
    def has_samples(self) -> bool:
        return self._ewma.value is not None

    @property
    def estimate_bps(self) -> float:
        return self.prior_bps if self._ewma.value is None else self._ewma.value


def snapshot(rtt: RttEstimator, bitrate: BitrateEstimator) -> NetworkEstimate:
    return NetworkEstimate(rtt.estimate_ms, rtt.smoothed_ms, rtt.trend_ms_per_s, bitrate.estimate_bps,
                           not rtt.has_samples, not bitrate.has_samples)
