"""The load-adaptive operating point (the decision; ``edge_app.decision.governor`` wires it into the app, and the
Triton host runs one for all its clients): every frame's compute leaves room for the frames behind it.

Each source's frames arrive at some rate; the inference threads and each source's own pipeline (which analyses
one frame at a time) have only so much time per frame. The governor keeps each source's arrival rate (the last
second of arrivals, per source) and each pipeline's own work per frame outside inference (conversion,
pre-processing, RENDER), and picks, for the frame about to run, the most accurate operating point of the dynamic
index (``models.operating``) whose expected compute fits both:

    all sources:  sum_s rate_s * cost_i * full_depth_ms         <= headroom * workers * 1000 ms/s
    each source:  rate_s * (cost_i * full_depth_ms + own_ms_s)  <= headroom * 1000 ms/s

``full_depth_ms`` is what a full-depth run costs now (the service's running medians), so a device that slows down
moves the point too. When the segments' shares of that cost move by more than ``RESOLVE_SHIFT`` from those the
points were solved for (one segment slowed by contention, another model on the device, a remote server's queue),
the dynamic index is re-solved from the same tables for the measured costs (``resolver``, in a worker thread; the
frames meanwhile use the old points) and the points are replaced: a segment that became dearer is worth going on
to less often, which a fixed threshold cannot express. The point is re-evaluated at most every ``EVERY_S``
(frames in between read it): cheaper at once, dearer a step at a time after ``CALM_S`` in which that point would
have fitted with room to spare. What gives under load is depth, by the amount the fitted chain predicts, not
frames.

Frames dropped as stale behind a busy pipeline are the backstop: ``DROP_SHARE`` of the last ``DROP_WINDOW_S``'s
arrivals (at least ``DROP_MIN`` frames) moves one step cheaper whatever the expected load says, and the rate at
which a point dropped is remembered for ``MEMORY_S`` (not for ever). Drops that are not load (a model swap, a
capture, a burst after a camera reconnects while the pipeline was idle) are not reported here
(``edge_app.pipeline``). ``choose`` is the decision alone, tested synchronously with explicit times.
"""

from __future__ import annotations

import asyncio
import logging
from collections import deque
from collections.abc import Callable, Sequence
from typing import Any

from models.operating import OperatingPoint
from models.policies import ExitPolicy

log = logging.getLogger(__name__)


def smooth_into(per_source: dict[str, float], source: str, ms: float) -> None:
    """``source``'s own work per frame, as an exponentially weighted mean (a tenth for each new frame)."""
    old = per_source.get(source)
    per_source[source] = ms if old is None else 0.9 * old + 0.1 * ms


class ServerLoad:
    """A remote runner's side of a shared server's load governor: what this process tells it with each frame (each
    source's own work per frame, the frames dropped behind busy pipelines) and what it last answered (``answer``:
    the operating point, the load, the arrival rate). ``edge_app.decision.governor.RemoteGovernor`` reports into it; the
    runner reads it when it sends a frame (``models.triton_runner``)."""

    def __init__(self) -> None:
        self.governed = False  # frames carry their source (the server governs them) once a governor says so
        self.own_ms: dict[str, float] = {}  # per source: its pipeline's own work per frame (EWMA)
        self._dropped = 0  # since the last frame sent
        self.answer: dict[str, Any] = {"index": None}

    def govern(self) -> None:
        self.governed = True

    def own_work(self, source: str, ms: float) -> None:
        smooth_into(self.own_ms, source, ms)

    def dropped(self) -> None:
        self._dropped += 1

    def take_dropped(self) -> int:
        n, self._dropped = self._dropped, 0
        return n

    def forget(self, source: str) -> None:
        self.own_ms.pop(source, None)


class LoadGovernor:
    RATE_WINDOW_S = 1.0  # arrival rate over this long, per source
    EVERY_S = 0.1  # re-evaluated at most this often
    CALM_S = 1.0
    RAISE_BELOW = 0.75  # a dearer point only when it would use under this share of the headroom
    DROP_WINDOW_S = 2.0
    DROP_SHARE = 0.05  # this share of arrivals dropped behind a busy pipeline: one step cheaper
    DROP_MIN = 3  # ... and at least this many frames (one late frame in 30 is not overload)
    MEMORY_S = 20.0  # how long the rate at which a point dropped frames keeps it from coming back
    RESOLVE_SHIFT = 0.25  # a segment's share of full depth this far (relative) from the solved one: re-solve
    RESOLVE_EVERY_S = 2.0  # ... checked at most this often

    def __init__(self, points: list[OperatingPoint], headroom: float, workers: int,
                 on_move: Callable[[OperatingPoint], None] | None = None,
                 resolver: Callable[[list[float]], list[OperatingPoint]] | None = None,
                 solved_ms: Sequence[float] | None = None) -> None:
        self.points, self.headroom, self.workers = points, headroom, max(1, workers)
        self.on_move = on_move
        self.resolver = resolver  # segment costs (ms) -> the points re-solved for them
        self.solved_ms = list(solved_ms) if solved_ms is not None else None  # the costs the points were solved for
        self.resolves = 0
        self._resolving = False
        self._resolve_checked_s = -1e9
        self.index = 0
        self.moves = 0
        self.arrival_fps = 0.0
        self.load = 0.0  # expected compute at the current point, as a share of the tighter of the two limits
        self._arrivals: dict[str, deque[float]] = {}
        self._own_ms: dict[str, float] = {}  # per source: its pipeline's work per frame outside inference (EWMA)
        self._drops: deque[float] = deque()
        self._dropped_at: dict[int, tuple[float, float]] = {}  # point -> (arrival rate it dropped at, when)
        self._calm_since: float | None = None
        self._checked_s = -1e9

    @property
    def point(self) -> OperatingPoint:
        return self.points[self.index]

    # --- what the pipelines report ------------------------------------------------------------------------

    def arrived(self, source: str, now_s: float) -> None:
        """A frame of ``source`` arrived for analysis."""
        q = self._arrivals.setdefault(source, deque())
        q.append(now_s)
        while q[0] < now_s - self.RATE_WINDOW_S:
            q.popleft()

    def own_work(self, source: str, ms: float) -> None:
        """``source``'s pipeline spent ``ms`` on a frame outside inference (its own thread time per frame)."""
        smooth_into(self._own_ms, source, ms)

    def dropped(self, now_s: float) -> None:
        """A frame was dropped as stale behind a busy pipeline (load, not a swap or a capture)."""
        self._drops.append(now_s)

    def forget(self, source: str) -> None:
        """``source`` stopped: its frames no longer count."""
        self._arrivals.pop(source, None)
        self._own_ms.pop(source, None)

    # --- the decision -------------------------------------------------------------------------------------

    def rates(self, now_s: float) -> dict[str, float]:
        out = {}
        for s, q in self._arrivals.items():
            while q and q[0] < now_s - self.RATE_WINDOW_S:
                q.popleft()
            span = q[-1] - q[0] if len(q) >= 2 else 0.0
            out[s] = (len(q) - 1) / span if span >= 0.2 else len(q) / self.RATE_WINDOW_S
        return out

    def need(self, i: int, rates: dict[str, float], full_depth_ms: float, share_ms: float | None = None) -> float:
        """Point ``i``'s expected compute as a share of the tighter limit: the inference threads' time, or a
        source's own frame interval (its pipeline runs one frame at a time). ``share_ms``: what a full-depth frame
        takes of the threads' time when that is less than its own wall time (frames batched on a server)."""
        per_frame = self.points[i].cost * full_depth_ms
        share = per_frame if share_ms is None else self.points[i].cost * share_ms
        threads = sum(rates.values()) * share / (1000.0 * self.workers)
        own = max((r * (per_frame + self._own_ms.get(s, 0.0)) / 1000.0 for s, r in rates.items()), default=0.0)
        return max(threads, own)

    def policy(self, now_s: float, segment_ms: Callable[[], list[float]],
               share_ms: Callable[[], float] | None = None) -> ExitPolicy:
        """The policy for the frame about to run (re-evaluated at most every ``EVERY_S``); ``segment_ms``: what each
        segment costs now; ``share_ms``: a full-depth frame's share of the threads' time, when batched."""
        if now_s - self._resolve_checked_s >= self.RESOLVE_EVERY_S:
            self._resolve_checked_s = now_s
            self._maybe_resolve(segment_ms())
        if now_s - self._checked_s >= self.EVERY_S:
            self._checked_s = now_s
            before = self.index
            self.choose(now_s, float(sum(segment_ms())), None if share_ms is None else share_ms())
            if self.index != before:
                p = self.point
                log.info("load: %.0f frames/s for analysis; operating point %d of %d (lam %.3f, expected cost "
                         "%.0f %% of full depth, calibration accuracy %.1f %%), load %.0f %%", self.arrival_fps,
                         self.index, len(self.points) - 1, p.lam, 100 * p.cost, 100 * p.accuracy, 100 * self.load)
                if self.on_move is not None:
                    self.on_move(p)
        return self.point.policy

    def choose(self, now_s: float, full_depth_ms: float, share_ms: float | None = None) -> int:
        """The point to use from now (and remember it)."""
        rates = self.rates(now_s)
        self.arrival_fps = sum(rates.values())
        last = len(self.points) - 1
        target = next((i for i in range(len(self.points))
                       if self.need(i, rates, full_depth_ms, share_ms) <= self.headroom), last)
        dropping = self._dropping(now_s)
        if dropping:
            self._dropped_at[self.index] = (self.arrival_fps, now_s)
            target = max(target, min(self.index + 1, last))
        if target > self.index:  # overloaded: cheaper at once
            self.index, self._calm_since = target, None
            self.moves += 1
        elif target < self.index:
            dearer = self.index - 1
            rate, when = self._dropped_at.get(dearer, (float("inf"), now_s))
            # not back to a point that dropped frames at this rate lately (else it would swing between two)
            allowed = now_s - when > self.MEMORY_S or self.arrival_fps < 0.9 * rate
            if allowed and self.need(dearer, rates, full_depth_ms, share_ms) <= self.RAISE_BELOW * self.headroom:
                self._calm_since = now_s if self._calm_since is None else self._calm_since
                if now_s - self._calm_since >= self.CALM_S:
                    self.index, self._calm_since = dearer, None
                    self.moves += 1
            else:
                self._calm_since = None
        self.load = self.need(self.index, rates, full_depth_ms, share_ms)
        return self.index

    def shifted(self, segment_ms: Sequence[float]) -> bool:
        """Whether the segments' shares of full depth moved by more than ``RESOLVE_SHIFT`` from the solved ones."""
        if self.solved_ms is None or len(segment_ms) != len(self.solved_ms) or sum(segment_ms) <= 0:
            return False
        now, then = sum(segment_ms), sum(self.solved_ms)
        return any(abs(a / now - b / then) > self.RESOLVE_SHIFT * (b / then)
                   for a, b in zip(segment_ms, self.solved_ms, strict=True))

    def _maybe_resolve(self, segment_ms: list[float]) -> None:
        if self.resolver is None or self._resolving or not self.shifted(segment_ms):
            return
        self._resolving = True
        resolver, costs = self.resolver, list(segment_ms)
        future = asyncio.get_running_loop().run_in_executor(None, resolver, costs)

        def done(f: Any) -> None:
            self._resolving = False
            if f.cancelled() or f.exception() is not None:
                log.warning("load: re-solving the dynamic index for segment costs %s failed: %s", costs,
                            None if f.cancelled() else f.exception())
                self.solved_ms = costs  # not again for the same shift
                return
            self.resolved(f.result(), costs)

        future.add_done_callback(done)

    def resolved(self, points: list[OperatingPoint], segment_ms: Sequence[float]) -> None:
        """Use ``points``, solved for ``segment_ms``; the current point becomes the one of nearest expected cost."""
        cost = self.point.cost
        self.points = points
        self.index = min(range(len(points)), key=lambda i: abs(points[i].cost - cost))
        self.solved_ms = list(segment_ms)
        self.resolves += 1
        log.info("load: segment costs now %s ms; the dynamic index re-solved for them (%d operating points, the "
                 "fitted lam's expected cost %.0f %% of full depth)", [round(ms, 1) for ms in segment_ms],
                 len(points), 100 * points[0].cost)
        if self.on_move is not None:
            self.on_move(self.point)

    def _dropping(self, now_s: float) -> bool:
        drops = self._drops
        while drops and drops[0] < now_s - self.DROP_WINDOW_S:
            drops.popleft()
        arrived = self.arrival_fps * self.DROP_WINDOW_S
        if len(drops) >= max(self.DROP_MIN, self.DROP_SHARE * arrived):
            drops.clear()  # acted on: the next step needs drops of its own
            return True
        return False

    def status(self) -> dict[str, Any]:
        return {"index": self.index, "points": len(self.points), **self.point.summary(),
                "arrival_fps": round(self.arrival_fps, 1), "load": round(float(self.load), 3), "moves": self.moves,
                "resolves": self.resolves,
                "solved_for_segment_ms": None if self.solved_ms is None else [round(ms, 2) for ms in self.solved_ms]}
