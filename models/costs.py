"""Running estimate of a segment's cost: median and a high percentile over a sliding window."""

from __future__ import annotations

import bisect
import math
import threading
from collections import deque


class RunningCost:
    """Thread-safe window of the last ``window`` measured times (ms) of one segment.

    Seeded with a prior (the manifest's measured cost, or warm-up timings) so
    that estimates exist before the first frame. The window is also kept sorted (an insertion and a removal
    per sample), so a percentile is a lookup: the scheduler reads them for every frame.
    """

    def __init__(self, prior_ms: float, window: int = 256, percentile: float = 95.0) -> None:
        if window < 1:
            raise ValueError("window must be >= 1")
        self._times: deque[float] = deque([prior_ms], maxlen=window)
        self._sorted = [prior_ms]
        self._percentile = percentile
        self._lock = threading.Lock()
        self.count = 0

    def record(self, ms: float) -> None:
        with self._lock:
            if self.count == 0:
                self._times.clear()  # the first real measurement replaces the prior
                self._sorted.clear()
            if len(self._times) == self._times.maxlen:
                del self._sorted[bisect.bisect_left(self._sorted, self._times[0])]
            self._times.append(ms)
            bisect.insort(self._sorted, ms)
            self.count += 1

    def percentile(self, q: float) -> float:
        """The ``q``-th percentile of the window, interpolated as ``numpy.percentile`` does (linear)."""
        with self._lock:
            s = self._sorted
            pos = (len(s) - 1) * q / 100.0
            lo = math.floor(pos)
            hi = min(lo + 1, len(s) - 1)
            return s[lo] + (s[hi] - s[lo]) * (pos - lo)

    @property
    def median_ms(self) -> float:
        return self.percentile(50.0)

    @property
    def high_ms(self) -> float:
        """The ``percentile``-th percentile (p95 by default): what the scheduler budgets for."""
        return self.percentile(self._percentile)
