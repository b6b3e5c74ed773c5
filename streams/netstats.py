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

``ArrivalDelay`` reads the uplink from the frames themselves: each frame's
transit (arrival here minus its RTP timestamp, which the sender takes at
capture; RFC 3550's relative transit, no clock sync needed) against the
fastest transit of the last ``window_s``.  A frame held up on its way in
(a delay step the RTT samples have not shown yet, a packet waiting for its
retransmission) is seen when it arrives, not a round trip later.
"""

from __future__ import annotations

import itertools
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
    rtt_low_ms: float  # the smallest sample of the last LOW_WINDOW_S


class _Ewma:
    """Exponentially weighted mean; ``None`` until the first sample."""

    def __init__(self, alpha: float) -> None:
        if not 0 < alpha <= 1:
            raise ValueError("alpha must be in (0, 1]")
        self.alpha = alpha
        self.value: float | None = None

    def add(self, v: float) -> None:
        self.value = v if self.value is None else self.alpha * v + (1 - self.alpha) * self.value


class _WindowMin:
    """Minimum of the values added in the last ``window_s`` seconds (monotonic deque, O(1) amortised)."""

    def __init__(self, window_s: float) -> None:
        self.window_s = window_s
        self._q: deque[tuple[float, float]] = deque()

    def add(self, t_s: float, v: float) -> None:
        while self._q and self._q[-1][1] >= v:
            self._q.pop()
        self._q.append((t_s, v))
        while self._q[0][0] < t_s - self.window_s:
            self._q.popleft()

    def clear(self) -> None:
        self._q.clear()

    @property
    def value(self) -> float | None:
        return self._q[0][1] if self._q else None


#: ``RttEstimator.low_ms`` and ``ArrivalDelay`` look back this far for the network's best recent moment.
LOW_WINDOW_S = 10.0


class RttEstimator:
    def __init__(self, prior_ms: float, alpha: float = 0.3, window: int = 16, lookahead_s: float = 1.0,
                 min_ms: float = 0.1, max_ms: float = 10_000.0, low_window_s: float = LOW_WINDOW_S,
                 fall_confirm: int = 4) -> None:
        self.prior_ms = prior_ms
        self.fall_confirm = max(fall_confirm, 2)  # samples in a row below the average that make a fall real
        self._ewma = _Ewma(alpha)
        self.lookahead_s = lookahead_s
        self.min_ms, self.max_ms = min_ms, max_ms
        self._samples: deque[tuple[float, float]] = deque(maxlen=window)
        self._low = _WindowMin(low_window_s)
        self._trend: float | None = None  # the fit of the samples as they are (read for every frame, fitted anew
        # only after a sample came: a few a second)

    def add(self, t_s: float, rtt_ms: float) -> None:
        """A new sample at time ``t_s`` (seconds, monotonic). Samples outside [min_ms, max_ms] are clamped."""
        v = min(max(rtt_ms, self.min_ms), self.max_ms)
        self._samples.append((t_s, v))
        self._trend = None
        self._low.add(t_s, v)
        self._ewma.add(v)
        if len(self._samples) >= 2:  # a rise seen twice in a row is real: do not wait for the average
            confirmed = min(self._samples[-1][1], self._samples[-2][1])
            if self._ewma.value is not None and confirmed > self._ewma.value:
                self._ewma.value = confirmed
        if len(self._samples) >= self.fall_confirm:  # a fall seen fall_confirm times in a row is real too,
            highest = max(v for _, v in itertools.islice(reversed(self._samples), self.fall_confirm))
            if self._ewma.value is not None and highest < self._ewma.value:  # to the highest of those samples
                self._ewma.value = highest

    @property
    def has_samples(self) -> bool:
        return self._ewma.value is not None

    @property
    def smoothed_ms(self) -> float:
        return self.prior_ms if self._ewma.value is None else self._ewma.value

    @property
    def trend_ms_per_s(self) -> float:
        if self._trend is None:
            self._trend = self._fit_trend()
        return self._trend

    def _fit_trend(self) -> float:
        if len(self._samples) < 3:
            return 0.0
        t, v = np.array(self._samples).T
        if np.ptp(t) <= 0:
            return 0.0
        return float(np.polyfit(t - t[0], v, 1)[0])

    @property
    def estimate_ms(self) -> float:
        return self.smoothed_ms + max(0.0, self.trend_ms_per_s) * self.lookahead_s

    @property
    def low_ms(self) -> float:
        """The smallest sample of the last ``low_window_s`` (the prior before any)."""
        low = self._low.value
        return self.prior_ms if low is None else low


class ArrivalDelay:
    """How much later than the fastest recent frame this frame arrived, in ms (0 for the fastest).

    ``add(rtp_timestamp, arrived_s)`` takes the frame's RTP timestamp (``clock_rate`` ticks, 32 bits,
    wrapping) and its arrival time (seconds, monotonic).  A jump of more than ``reset_s`` either way
    (the sender restarted its clock) starts the window again instead of reporting seconds of delay.
    """

    def __init__(self, window_s: float = LOW_WINDOW_S, clock_rate: int = 90_000, reset_s: float = 5.0) -> None:
        self.clock_rate = clock_rate
        self.reset_s = reset_s
        self._low = _WindowMin(window_s)
        self._last_ts: int | None = None
        self._unwrapped = 0

    def add(self, rtp_timestamp: int, arrived_s: float) -> float:
        ts = int(rtp_timestamp) & 0xFFFFFFFF
        if self._last_ts is None:
            self._unwrapped = ts
        else:
            step = (ts - self._last_ts) & 0xFFFFFFFF
            self._unwrapped += step - (1 << 32) if step >= 1 << 31 else step
        self._last_ts = ts
        transit = arrived_s - self._unwrapped / self.clock_rate
        low = self._low.value
        if low is not None and abs(transit - low) > self.reset_s:
            self._low.clear()
        self._low.add(arrived_s, transit)
        base = self._low.value
        assert base is not None
        return (transit - base) * 1e3


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
                           not rtt.has_samples, not bitrate.has_samples, rtt.low_ms)
