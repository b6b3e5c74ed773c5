"""The load-adaptive operating point: keep the frames' expected compute within what the inference threads can do.

Every second the governor reads how many frames arrived for analysis (all sources) and what a full-depth frame
costs now (the service's running medians), and picks the most accurate operating point of the dynamic index
(``models.operating``) whose expected cost per frame, times the arrival rate, fits in ``load_headroom`` of the
inference threads' time. It moves to a cheaper point at once; back to a dearer one a step at a time, after
``CALM_S`` in which that point would have fitted with room to spare. So every stream keeps its frame rate and its
deadline (frames are not dropped as stale behind a queue); what gives is depth, by the amount the fitted chain
predicts. ``choose`` is the decision alone, tested synchronously.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import time
from collections import deque
from collections.abc import Callable, Iterable
from typing import Any

from models.operating import OperatingPoint

log = logging.getLogger(__name__)


class LoadGovernor:
    CHECK_S = 1.0
    CALM_S = 3.0
    RAISE_BELOW = 0.75  # a dearer point only when it would use under this share of the headroom
    ANSWERED = 0.99  # fewer frames analysed than this share of those arriving: frames are being dropped
    DROPPING_S = 2.0  # ... over this long: one step cheaper, whatever the expected load says

    def __init__(self, points: list[OperatingPoint], headroom: float, workers: int) -> None:
        self.points, self.headroom, self.workers = points, headroom, workers
        self.index = 0
        self.moves = 0
        self.arrival_fps = 0.0
        self.load = 0.0  # expected compute at the current point, as a share of the inference threads' time
        self._calm_since: float | None = None
        self._window: deque[tuple[float, float, float]] = deque()  # (time, arrived/s, answered/s)
        self._dropped_at: dict[int, float] = {}  # point -> the lowest arrival rate at which it dropped frames
        self._task: asyncio.Task[None] | None = None

    @property
    def point(self) -> OperatingPoint:
        return self.points[self.index]

    def need(self, i: int, arrival_fps: float, full_depth_ms: float) -> float:
        """Point ``i``'s expected compute, as a share of the inference threads' time."""
        return arrival_fps * self.points[i].cost * full_depth_ms / (1000.0 * self.workers)

    def choose(self, now_s: float, arrival_fps: float, full_depth_ms: float, answered_fps: float | None = None
               ) -> int:
        """The point to use from now (and remember it). ``answered_fps``: frames analysed per second; fewer than
        arrived means frames are dropped as stale behind the queue whatever the model says (the pipelines' own
        work, decoding, waiting), so that too moves to a cheaper point."""
        self.arrival_fps = arrival_fps
        fits = [i for i in range(len(self.points)) if self.need(i, arrival_fps, full_depth_ms) <= self.headroom]
        target = fits[0] if fits else len(self.points) - 1
        dropping = False
        if answered_fps is not None:  # over the last DROPPING_S (drops come in bursts, not every second)
            window = self._window
            window.append((now_s, arrival_fps, answered_fps))
            while window[0][0] < now_s - self.DROPPING_S - 0.5 * self.CHECK_S:
                window.popleft()
            arrived = sum(w[1] for w in window)
            dropping = sum(w[2] for w in window) < self.ANSWERED * arrived
            if dropping and now_s - window[0][0] >= self.DROPPING_S - 0.5 * self.CHECK_S:
                target = max(target, min(self.index + 1, len(self.points) - 1))
                self._dropped_at[self.index] = min(arrival_fps, self._dropped_at.get(self.index, arrival_fps))
                window.clear()
        if target > self.index:  # overloaded: cheaper at once
            self.index, self._calm_since = target, None
            self.moves += 1
        elif target < self.index:
            dearer = self.index - 1
            # not back to a point that dropped frames at this rate (else it would swing between two points)
            remembered = arrival_fps < 0.9 * self._dropped_at.get(dearer, float("inf"))
            if not dropping and remembered and \
                    self.need(dearer, arrival_fps, full_depth_ms) <= self.RAISE_BELOW * self.headroom:
                self._calm_since = now_s if self._calm_since is None else self._calm_since
                if now_s - self._calm_since >= self.CALM_S:
                    self.index, self._calm_since = dearer, None
                    self.moves += 1
            else:
                self._calm_since = None
        self.load = self.need(self.index, arrival_fps, full_depth_ms)
        return self.index

    def start(self, arrivals: Callable[[], int], full_depth_ms: Callable[[], float],
              apply: Callable[[OperatingPoint], None], answered: Callable[[], int] | None = None) -> None:
        async def run() -> None:
            last_n, last_t = arrivals(), time.monotonic()
            last_a = answered() if answered else 0
            while True:
                await asyncio.sleep(self.CHECK_S)
                n, t = arrivals(), time.monotonic()
                a = answered() if answered else 0
                dt = max(t - last_t, 1e-3)
                before = self.index
                self.choose(t, (n - last_n) / dt, full_depth_ms(), (a - last_a) / dt if answered else None)
                last_n, last_t, last_a = n, t, a
                if self.index != before:
                    p = self.point
                    log.info("load: %.0f frames/s for analysis; operating point %d of %d (lam %.3f, expected "
                             "cost %.0f %% of full depth, calibration accuracy %.1f %%), load %.0f %%",
                             self.arrival_fps, self.index, len(self.points) - 1, p.lam, 100 * p.cost,
                             100 * p.accuracy, 100 * self.load)
                    apply(p)

        self._task = asyncio.create_task(run(), name="load-governor")

    async def stop(self) -> None:
        if self._task is not None:
            self._task.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await self._task
            self._task = None

    def status(self) -> dict[str, Any]:
        return {"index": self.index, "points": len(self.points), **self.point.summary(),
                "arrival_fps": round(self.arrival_fps, 1), "load": round(float(self.load), 3), "moves": self.moves}


def arrivals_of(slots: Iterable[Any]) -> int:
    """Frames put into the analysis slots so far (each slot's ``put_count``)."""
    return sum(int(s.put_count) for s in slots)
