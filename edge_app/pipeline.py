"""One source's analysis loop: newest frame -> budget -> scheduler -> smoothing -> annotation -> subscribers.

``AnalysisPipeline`` takes frames from a ``LatestSlot`` (a browser's track or
an RTSP camera), works out the frame's compute budget from the network
estimate its viewers supply, runs the scheduler in the inference thread
pool (never on the event loop), smooths and annotates the result, and
``publish``es an ``AnalysedFrame`` to every subscriber (outbound video
tracks, data channels).  A frame whose analysis raises is logged, counted
and skipped; the loop goes on.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import time
from collections.abc import Callable
from concurrent.futures import Executor
from dataclasses import asdict, dataclass
from typing import Any

import av
import cv2
import numpy as np

from edge_app.annotate import Overlay, annotate
from edge_app.budget import Budget, frame_budget, late_uplink_ms
from edge_app.config import BudgetConfig, SmoothingConfig
from edge_app.metrics import Metrics
from edge_app.scheduler import FrameDecision, FrameScheduler
from edge_app.smoothing import Smoothed, TemporalSmoother
from models.costs import RunningCost
from models.errors import SegmentRunError
from models.policies import ExitPolicy
from models.runtime import ExitResult, ModelRuntime
from streams.frames import Broadcast, LatestSlot, SlotClosed, SourceFrame
from streams.netstats import ArrivalDelay, NetworkEstimate
from streams.stamp import read_stamp

log = logging.getLogger(__name__)


@dataclass(frozen=True)
class NetworkView:
    """What the viewers' network costs a frame: the estimate, and the bytes sent back per frame."""

    estimate: NetworkEstimate
    frame_bytes: float


def r2(v: float) -> float:
    return round(float(v), 3)


@dataclass(frozen=True)
class FrameResult:
    source: str
    seq: int  # arrival number at the source
    stamp: int | None  # frame counter drawn in the frame by a probe client / test video
    arrived_unix_ms: float
    raw_class: int
    raw_confidence: float
    smoothed_class: int
    smoothed_confidence: float
    exit: int  # 1-based exit whose answer is returned; 0: none ran (reused)
    exits_run: int
    horizon: int  # exits the deadline allowed
    predicted_ms: float
    actual_ms: float
    segments_ms: tuple[float, ...]
    budget: Budget
    network: NetworkEstimate
    stages_ms: dict[str, float]  # convert, preprocess, inference, annotate
    latency_ms: float  # server side: arrival to annotated frame ready
    deadline_met: bool  # latency + expected network time <= total budget
    dropped_stale: int  # frames of this source dropped before analysis, so far
    error: str | None = None  # a later segment failed; the answer comes from the exits before it
    reused: bool = False  # no exit ran (exit 0): even exit 1 would have been late, the smoothed answer so far
    frame_size: tuple[int, int] = (0, 0)  # (width, height) as decoded: a browser lowers it when bits are short

    def to_json(self, class_names: list[str]) -> dict[str, Any]:
        return {
            "type": "result",
            "source": self.source,
            "frame": self.seq,
            "stamp": self.stamp,
            "arrived_unix_ms": r2(self.arrived_unix_ms),
            "raw": {"class": self.raw_class, "label": class_names[self.raw_class],
                    "confidence": r2(self.raw_confidence)},
            "smoothed": {"class": self.smoothed_class, "label": class_names[self.smoothed_class],
                         "confidence": r2(self.smoothed_confidence)},
            "exit": self.exit,
            "exits_run": self.exits_run,
            "horizon": self.horizon,
            "costs": {"predicted_ms": r2(self.predicted_ms), "actual_ms": r2(self.actual_ms),
                      "segments_ms": [r2(v) for v in self.segments_ms]},
            "budget": {k: r2(v) for k, v in asdict(self.budget).items()},
            "network": {k: (v if isinstance(v, bool) else r2(v)) for k, v in asdict(self.network).items()},
            "stages_ms": {k: r2(v) for k, v in self.stages_ms.items()},
            "latency_ms": r2(self.latency_ms),
            "deadline_met": self.deadline_met,
            "dropped_stale": self.dropped_stale,
            "error": self.error,
            "reused": self.reused,
            "frame_size": list(self.frame_size),
        }


@dataclass(frozen=True)
class AnalysedFrame:
    i420: np.ndarray  # the annotated frame as planar YUV 4:2:0 (what the encoder takes), shared by all viewers
    result: FrameResult

    def video_frame(self) -> av.VideoFrame:
        """A new ``av.VideoFrame`` per viewer (each encoder stamps its own pts on it)."""
        return av.VideoFrame.from_ndarray(self.i420, format="yuv420p")


def reused_decision(sm: Smoothed, compute_budget_ms: float) -> FrameDecision:
    """What a frame answered without the model carries: no exit run (``exit_index`` -1), the smoothed
    answer so far as its answer."""
    return FrameDecision(-1, 0, 0, ExitResult(-1, sm.probs, sm.label, sm.confidence, 0.0), 0.0, 0.0,
                         compute_budget_ms, True)


class AnalysisPipeline:
    def __init__(self, source: str, metric_source: str, slot: LatestSlot[SourceFrame], runtime: ModelRuntime,
                 policy: ExitPolicy, budget: BudgetConfig, executor: Executor, metrics: Metrics,
                 network: Callable[[], NetworkView], probe: bool = False,
                 smoothing: SmoothingConfig | None = None, truncate: bool = True,
                 uplink_from_frames: bool = False) -> None:
        self.source = source
        self.metric_source = metric_source
        self.slot = slot
        self.runtime = runtime
        self.budget = budget
        self.executor = executor
        self.metrics = metrics
        self.network = network
        self.probe = probe
        sm = smoothing or SmoothingConfig()
        self.scheduler = FrameScheduler(runtime, policy, sm.max_depth_step, truncate)
        self.smoother = TemporalSmoother([ex.test_accuracy for ex in runtime.manifest.exits], sm.alpha, sm.hysteresis)
        self.outputs: Broadcast[AnalysedFrame] = Broadcast()
        self.analysed = 0
        self.errors = 0
        self.deadline_misses = 0
        self.last: FrameResult | None = None
        self.reused = 0
        self._smoothed: Smoothed | None = None  # the latest smoothed answer, what a reused frame gets
        self._reused_in_a_row = 0
        self._post_ms = RunningCost(1.0, 64, percentile=90)  # annotation, budgeted ahead of time
        # a browser's own camera comes over the viewer's path: its frames' arrival shows the up-leg at once
        self._arrival = ArrivalDelay() if uplink_from_frames else None
        self._task: asyncio.Task[None] | None = None
        slot.on_put = metrics.frames_received.labels(metric_source).inc
        slot.on_drop = metrics.frames_dropped.labels(metric_source, "analysis").inc

    def start(self) -> None:
        self._task = asyncio.create_task(self._run(), name=f"analysis-{self.source}")

    async def stop(self) -> None:
        self.slot.close()
        if self._task is not None:
            self._task.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await self._task
            self._task = None

    @property
    def running(self) -> bool:
        return self._task is not None and not self._task.done()

    async def _run(self) -> None:
        loop = asyncio.get_running_loop()
        while True:
            try:
                sf = await self.slot.get()
            except SlotClosed:
                log.info("%s: source closed after %d analysed frames", self.source, self.analysed)
                return
            net = self.network()
            try:
                out = await loop.run_in_executor(self.executor, self.analyse, sf, net)
            except (SegmentRunError, ValueError) as exc:
                self._failed(sf.seq, str(exc), answered=False)
                continue
            if out.result.error is not None:
                self._failed(sf.seq, out.result.error, answered=True)
            self._record(out.result)
            self.outputs.publish(out)

    def analyse(self, sf: SourceFrame, net: NetworkView) -> AnalysedFrame:
        """The whole per-frame computation; runs in the inference thread."""
        rt, cfg = self.runtime, self.budget
        t0 = time.monotonic()
        rgb = sf.frame.to_ndarray(format="rgb24")
        t1 = time.monotonic()
        stamp = read_stamp(rgb) if self.probe else None
        x = rt.preprocess(rgb)
        t2 = time.monotonic()
        waited_ms = (t2 - sf.arrived_s) * 1e3
        est = net.estimate
        late_ms = 0.0
        if self._arrival is not None and sf.frame.pts is not None:
            late_ms = late_uplink_ms(self._arrival.add(sf.frame.pts, sf.arrived_s), est.rtt_ms, est.rtt_low_ms)
        budget = frame_budget(cfg.total_budget_ms, est.rtt_ms, net.frame_bytes, est.bitrate_bps, waited_ms,
                              cfg.safety_margin_ms + self._post_ms.high_ms, late_ms, cfg.late_return_factor)
        reused = self._reuse(budget.compute_ms)
        if reused:
            self._reused_in_a_row += 1
            assert self._smoothed is not None
            sm = self._smoothed
            dec = reused_decision(sm, budget.compute_ms)
        else:
            self._reused_in_a_row = 0
            dec = self.scheduler.analyse(x, budget.compute_ms)
            sm = self._smoothed = self.smoother.update(dec.result.probs, dec.exit_index)
        exit_used = dec.exit_index + 1
        t3 = time.monotonic()
        # the same test as the result's deadline_met, with annotation's running estimate in place of its time
        on_time = (t3 - sf.arrived_s) * 1e3 + self._post_ms.high_ms + budget.network_ms <= cfg.total_budget_ms
        annotate(rgb, Overlay(rt.class_names[sm.label], sm.confidence, exit_used, rt.num_exits,
                              est.rtt_ms, budget.compute_ms, on_time))
        i420 = cv2.cvtColor(rgb[: rgb.shape[0] & ~1, : rgb.shape[1] & ~1], cv2.COLOR_RGB2YUV_I420)
        t4 = time.monotonic()
        self._post_ms.record((t4 - t3) * 1e3)
        latency_ms = (t4 - sf.arrived_s) * 1e3
        result = FrameResult(
            self.source, sf.seq, stamp, (time.time() - (t4 - sf.arrived_s)) * 1e3,
            dec.result.label, dec.result.confidence, sm.label, sm.confidence,
            exit_used, dec.exits_run, dec.horizon, dec.predicted_ms, dec.actual_ms, dec.segments_ms,
            budget, est,
            {"convert": (t1 - t0) * 1e3, "preprocess": (t2 - t1) * 1e3, "inference": dec.actual_ms,
             "annotate": (t4 - t3) * 1e3},
            latency_ms, latency_ms + budget.network_ms <= cfg.total_budget_ms, self.slot.dropped, dec.error,
            reused, (rgb.shape[1], rgb.shape[0]))
        return AnalysedFrame(i420, result)

    def _reuse(self, compute_ms: float) -> bool:
        """Answer without the model: even exit 1 (its high-percentile cost) would be late with the safety
        margin spent too, there is an answer to give, and fewer than ``max_reused_in_a_row`` went before."""
        cfg = self.budget
        if not (cfg.reuse_when_late and self.scheduler.truncate) or self._smoothed is None:
            return False
        if self._reused_in_a_row >= cfg.max_reused_in_a_row:
            return False
        return compute_ms + cfg.safety_margin_ms < self.scheduler.predicted_costs_ms()[0]

    def _failed(self, seq: int, error: str, answered: bool) -> None:
        """Counted every time, logged the first time and then once per 300 (a broken segment fails every frame)."""
        self.errors += 1
        self.metrics.analysis_errors.labels(self.metric_source).inc()
        if self.errors == 1 or self.errors % 300 == 0:
            what = "answered from an earlier exit" if answered else "not analysed"
            log.error("%s: frame %d %s (%d failures so far): %s", self.source, seq, what, self.errors, error)

    def _record(self, r: FrameResult) -> None:
        m, src = self.metrics, self.metric_source
        self.analysed += 1
        self.last = r
        m.frames_analysed.labels(src).inc()
        if r.reused:
            self.reused += 1
            m.answers_reused.labels(src).inc()
        else:
            m.exit_chosen.labels(str(r.exit)).inc()
        for k, ms in enumerate(r.segments_ms):
            m.segment_runs.labels(str(k + 1)).inc()
            m.segment_seconds.labels(str(k + 1)).observe(ms / 1e3)
        m.frame_latency.labels(src).observe(r.latency_ms / 1e3)
        m.compute_budget.labels(src).observe(max(0.0, r.budget.compute_ms) / 1e3)
        m.rtt_estimate.labels(src).observe(r.network.rtt_ms / 1e3)
        if not r.deadline_met:
            self.deadline_misses += 1
            m.deadline_missed.labels(src).inc()
