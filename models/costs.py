"""Running estimate of a segment's cost: median and a high percentile over a sliding window."""

from __future__ import annotations

import threading
from collections import deque

import numpy as np


class RunningCost:
    """Thread-safe window of the last ``window`` measured times (ms) of one segment.

    Seeded with a prior (the manifest's measured cost, or warm-up timings) so
    that estimates exist before the first frame.
    """

    def __init__(self, prior_ms: float, window: int = 256, percentile: float = 95.0) -> None:
        if window < 1:
            raise ValueError("window must be >= 1")
        self._times: deque[float] = deque([prior_ms], maxlen=window)
        self._percentile = percentile
        self._lock = threading.Lock()
        self.count = 0

    def record(self, ms: float) -> None:
        with self._lock:
            if self.count == 0:
                self._times.clear()  # the first real measurement replaces the prior
            self._times.append(ms)
            self.count += 1

    def _snapshot(self) -> np.ndarray:
        with self._lock:
            return np.fromiter(self._times, float, len(self._times))

    @property
    def median_ms(self) -> float:
        return float(np.median(self._snapshot()))

    @property
    def high_ms(self) -> float:
        """The ``percentile``-th percentile (p95 by default): what the scheduler budgets for."""
        return float(np.percentile(self._snapshot(), self._percentile))
