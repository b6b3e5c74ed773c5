"""One source's analysis loop, in stages: newest frame -> DECIDE -> (RENDER, only if wanted) -> subscribers.

``AnalysisPipeline`` takes frames from a ``LatestSlot`` (a browser's track or an RTSP camera).  DECIDE
(``edge_app.decide``) prepares the frame in a media thread, works out its compute budget from the network view
its viewers supply, submits it to the one inference service and smooths the answer.  RENDER
(``edge_app.annotate.render``: overlay and I420, in a media thread) runs only while some subscriber asked for
video; a source watched only through data channels is never annotated or converted.  Each ``AnalysedFrame`` goes
to every subscriber.  A frame whose analysis raises is logged, counted and skipped; the loop goes on.
"""

from __future__ import annotations

import asyncio
import contextlib
import functools
import logging
import time
from collections.abc import Callable
from concurrent.futures import Executor
from dataclasses import dataclass
from typing import Any

import numpy as np

from edge_app.annotate import Overlay, render
from edge_app.decide import Decider, PipelineSettings, PreparedFrame
from edge_app.governor import LoadGovernor
from edge_app.metrics import Metrics
from edge_app.results import AnalysedFrame, FrameResult, NetworkView
from edge_app.scheduler import FrameDecision
from edge_app.smoothing import Smoothed
from models.errors import SegmentRunError
from models.policies import ExitPolicy
from models.preprocess import Region, region_box
from models.service import InferenceService
from streams.frames import Broadcast, LatestSlot, SlotClosed, SourceFrame
from streams.stamp import read_stamp

log = logging.getLogger(__name__)

Subscriber = Callable[[AnalysedFrame], None]


@dataclass(frozen=True)
class Engine:
    """What every pipeline of the app shares: the inference service, the exit policy, metrics, media threads."""

    service: InferenceService
    policy: ExitPolicy
    metrics: Metrics
    media: Executor  # conversion, pre-processing and RENDER: CPU work that must stay off the event loop
    load: LoadGovernor | None = None  # the operating point per frame from the arrival rate ([policy] adapt_to_load)


class AnalysisPipeline:
    def __init__(self, source: str, metric_source: str, slot: LatestSlot[SourceFrame], engine: Engine,
                 settings: PipelineSettings, network: Callable[[], NetworkView]) -> None:
        self.source = source
        self.metric_source = metric_source
        self.slot = slot
        self.engine = engine
        self.settings = settings
        self.network = network
        service = engine.service
        self.decider = Decider(source, service, engine.policy, settings,
                               [ex.test_accuracy for ex in service.backend.manifest.exits], engine.load)
        self.outputs: Broadcast[AnalysedFrame] = Broadcast()
        self._video_subscribers: set[Subscriber] = set()
        self.analysed = 0
        self.rendered = 0  # frames RENDER drew: 0 while nobody watches this source as video
        self.errors = 0
        self.deadline_misses = 0
        self.reused = 0
        # every frame that arrived: answered (on time or late; skipped ones too), or unanswered with a reason
        self.answered = {"on_time": 0, "late": 0}
        self.skipped = 0  # answered from the smoothed state: replaced by a newer frame while busy
        self.unanswered = {"no-answer-yet": 0, "error": 0}
        self.last: FrameResult | None = None
        self._task: asyncio.Task[None] | None = None
        self._busy = False  # a frame is between DECIDE and publish
        self._next: tuple[Engine, asyncio.Event] | None = None  # a model swap, applied between frames
        self.scored = dict.fromkeys(("frames", "raw_frames", "raw_correct", "smoothed_correct"), 0)
        # see the part of each frame the model sees (the region's square), before RENDER draws on it
        self.frame_taps: set[Callable[[int, np.ndarray], None]] = set()
        self.region: Region | None = None  # [[cameras]] region, or set through the API
        slot.on_put = self._arrived
        slot.on_drop = engine.metrics.frames_dropped.labels(metric_source, "analysis").inc
        slot.on_replace = self._skipped

    # --- subscribers ---------------------------------------------------------------------------------------

    def subscribe(self, callback: Subscriber, video: bool) -> None:
        """``callback`` gets every analysed frame; ``video``: it also needs the annotated frame (``i420``)."""
        self.outputs.subscribe(callback)
        if video:
            self._video_subscribers.add(callback)

    def unsubscribe(self, callback: Subscriber) -> None:
        self.outputs.unsubscribe(callback)
        self._video_subscribers.discard(callback)

    @property
    def wants_video(self) -> bool:
        return bool(self._video_subscribers)

    # --- lifecycle -----------------------------------------------------------------------------------------

    def start(self) -> None:
        self._task = asyncio.create_task(self._run(), name=f"analysis-{self.source}")

    async def stop(self) -> None:
        self.slot.close()
        if self.engine.load is not None:
            self.engine.load.forget(self.source)
        if self._task is not None:
            self._task.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await self._task
            self._task = None

    async def use(self, engine: Engine, timeout_s: float = 10.0) -> None:
        """Analyse the next frames with ``engine`` (a new model): between two frames, never within one; the
        smoothing starts again (the classes may be others). Returns once no frame uses the old engine."""
        done = asyncio.Event()
        self._next = (engine, done)
        if not self._busy:
            self._switch()
        with contextlib.suppress(TimeoutError):
            await asyncio.wait_for(done.wait(), timeout_s)

    def _switch(self) -> None:
        if self._next is None:
            return
        engine, done = self._next
        self._next = None
        self.engine = engine
        self.decider = Decider(self.source, engine.service, engine.policy, self.settings,
                               [ex.test_accuracy for ex in engine.service.backend.manifest.exits], engine.load)
        self.last = None
        self.scored = dict.fromkeys(self.scored, 0)  # the new model's own figures
        done.set()

    @property
    def running(self) -> bool:
        return self._task is not None and not self._task.done()

    async def _run(self) -> None:
        """Frame by frame, two deep: while frame N is in DECIDE (the inference thread), the newest frame to arrive
        is converted and pre-processed in a media thread, so the inference thread waits for no conversion and a
        source's frame interval only has to hold the slower of the two. A model swap in between prepares it
        again for the new model."""
        ahead: tuple[SourceFrame, Decider, asyncio.Future[PreparedFrame]] | None = None
        while True:
            if ahead is None:
                try:
                    sf = await self.slot.get()
                except SlotClosed:
                    log.info("%s: source closed after %d analysed frames", self.source, self.analysed)
                    return
                self._switch()
                ahead = (sf, self.decider, self._prepare(sf))
            sf, decider, future = ahead
            ahead = None
            self._busy = True
            t0 = time.monotonic()
            try:
                prepared = await future
                self._switch()
                if decider is not self.decider:  # prepared for the model before a swap
                    prepared = await self._prepare(sf)
                for tap in list(self.frame_taps):  # capture for teaching: what the model sees (copied if kept)
                    tap(sf.seq, prepared.view)
                deciding = asyncio.ensure_future(self.decider.decide(prepared))
                try:
                    ahead = await self._take_ahead(deciding)
                except asyncio.CancelledError:  # stopped: the frame in DECIDE goes too
                    deciding.cancel()
                    raise
                dec, sm = await deciding
                out = await self._finish(prepared, dec, sm)
            except (SegmentRunError, ValueError) as exc:
                self._failed(sf.seq, str(exc), answered=False)
                continue
            finally:
                self._busy = False
            if self.engine.load is not None:  # the pipeline's own work per frame, outside inference
                busy_ms = (time.monotonic() - t0) * 1e3
                own = max(0.0, busy_ms - out.result.actual_ms) + max(0.0, prepared.convert_ms +
                                                                     prepared.preprocess_ms - busy_ms)
                self.engine.load.own_work(self.source, own)
            if out.result.error is not None:
                self._failed(sf.seq, out.result.error, answered=True)
            self._record(out.result)
            self.outputs.publish(out)

    def _prepare(self, sf: SourceFrame) -> asyncio.Future[PreparedFrame]:
        """Convert, cut the region, pre-process and budget ``sf`` in a media thread."""
        return asyncio.get_running_loop().run_in_executor(self.engine.media, self.decider.prepare, sf,
                                                          self.network(), self.wants_video, self.region)

    async def _take_ahead(self, deciding: asyncio.Future[Any]
                          ) -> tuple[SourceFrame, Decider, asyncio.Future[PreparedFrame]] | None:
        """While ``deciding`` runs, the newest frame to arrive, already being prepared; None if none came. A frame
        taken ahead that a newer one overtakes before ``deciding`` ends is answered from the smoothed state (as the
        slot answers frames it replaces): the frame analysed next is the freshest, with the most budget left."""
        ahead: tuple[SourceFrame, Decider, asyncio.Future[PreparedFrame]] | None = None
        while not deciding.done():
            getter = asyncio.ensure_future(self.slot.get())
            await asyncio.wait({deciding, getter}, return_when=asyncio.FIRST_COMPLETED)
            if not getter.done():
                getter.cancel()
                with contextlib.suppress(asyncio.CancelledError):
                    await getter
            if getter.cancelled() or getter.exception() is not None:  # none came, or the source closed
                break
            sf = getter.result()
            if ahead is not None:  # answered once its preparation is done: its frame is in a media thread now
                ahead[2].add_done_callback(functools.partial(self._overtaken, ahead[0]))
            ahead = (sf, self.decider, self._prepare(sf))
        return ahead

    def _overtaken(self, sf: SourceFrame, future: asyncio.Future[PreparedFrame]) -> None:
        """A frame taken ahead that a newer one overtook, answered from the smoothed state with the stamp its
        preparation read (never reading the frame here while a media thread converts it: PyAV's frames are not
        safe to convert from two threads at once, and that hung the event loop)."""
        prepared = None if future.cancelled() or future.exception() is not None else future.result()
        self._skipped(sf, None if prepared is None else prepared.stamp, read=False)

    # --- the stages ----------------------------------------------------------------------------------------

    async def _finish(self, prepared: PreparedFrame, dec: FrameDecision, sm: Smoothed) -> AnalysedFrame:
        """RENDER, if some subscriber wants video, and the result."""
        rendering = self.wants_video
        if not rendering:
            return AnalysedFrame(self.decider.result(prepared, dec, sm, time.monotonic(), None, self.slot.dropped),
                                 classes=self.engine.service.class_names)
        t0 = time.monotonic()
        overlay = self._overlay(prepared, dec.exit_index + 1, sm, self.decider.on_time(prepared, t0, True))
        i420 = await asyncio.get_running_loop().run_in_executor(self.engine.media, render, prepared.rgb, overlay)
        t1 = time.monotonic()
        self.decider.render_ms.record((t1 - t0) * 1e3)
        self.rendered += 1
        result = self.decider.result(prepared, dec, sm, t1, (t1 - t0) * 1e3, self.slot.dropped)
        return AnalysedFrame(result, i420, self.engine.service.class_names)

    def _overlay(self, p: PreparedFrame, exit_used: int, sm: Smoothed, on_time: bool) -> Overlay:
        service = self.engine.service
        return Overlay(label=service.class_names[sm.label], confidence=sm.confidence, exit_used=exit_used,
                       num_exits=service.num_exits, rtt_ms=p.network.estimate.rtt_ms,
                       compute_budget_ms=p.budget.compute_ms, deadline_met=on_time,
                       roi=None if self.region is None else region_box(p.rgb.shape[0], p.rgb.shape[1], self.region))

    # --- every frame that arrives ----------------------------------------------------------------------------

    def _arrived(self) -> None:
        self.engine.metrics.frames_received.labels(self.metric_source).inc()
        if self.engine.load is not None:
            self.engine.load.arrived(self.source, time.monotonic())

    def _skipped(self, sf: SourceFrame, stamp: int | None = None, read: bool = True) -> None:
        """A frame replaced by a newer one before analysis: answered at once from the smoothed state. Behind a busy
        pipeline that is load, and the governor hears of it; not while a model swap or a capture holds it up."""
        load = self.engine.load
        if load is not None and self._busy and self._next is None and not self.frame_taps:
            load.dropped(time.monotonic())
        if read and self.settings.probe:  # a frame from the slot: no other thread holds it
            stamp = read_stamp(sf.frame.to_ndarray(format="gray"))
        result = self.decider.skipped_result(sf, self.network(), stamp, self.slot.dropped)
        if result is None:
            self.unanswered["no-answer-yet"] += 1
            self.engine.metrics.frames_unanswered.labels(self.metric_source, "no-answer-yet").inc()
            return
        self._record(result)
        self.outputs.publish(AnalysedFrame(result, classes=self.engine.service.class_names))

    # --- bookkeeping ---------------------------------------------------------------------------------------

    def _failed(self, seq: int, error: str, answered: bool) -> None:
        """Counted every time, logged the first time and then once per 300 (a broken segment fails every frame)."""
        self.errors += 1
        self.engine.metrics.analysis_errors.labels(self.metric_source).inc()
        if not answered:
            self.unanswered["error"] += 1
            self.engine.metrics.frames_unanswered.labels(self.metric_source, "error").inc()
        if self.errors == 1 or self.errors % 300 == 0:
            what = "answered from an earlier exit" if answered else "not analysed"
            log.error("%s: frame %d %s (%d failures so far): %s", self.source, seq, what, self.errors, error)

    def _score(self, r: FrameResult) -> None:
        if r.truth is not None:  # a labelled source: live accuracy, for /status and the page
            self.scored["frames"] += 1
            self.scored["raw_frames"] += r.raw_correct is not None
            self.scored["raw_correct"] += bool(r.raw_correct)
            self.scored["smoothed_correct"] += bool(r.smoothed_correct)

    def counts(self) -> dict[str, Any]:
        """Every frame that arrived, as users see it: answered on time / late (of which skipped: the smoothed
        answer for a frame replaced while busy), or unanswered with its reason; they add up to ``arrived``."""
        return {"arrived": self.slot.put_count, "on_time": self.answered["on_time"], "late": self.answered["late"],
                "skipped": self.skipped, "reused": self.reused, "unanswered": dict(self.unanswered),
                "pending": self.slot.put_count - sum(self.answered.values()) - sum(self.unanswered.values())}

    def _record(self, r: FrameResult) -> None:
        m, src = self.engine.metrics, self.metric_source
        timing = "on_time" if r.deadline_met else "late"
        self.answered[timing] += 1
        m.frames_answered.labels(src, timing, "skipped" if r.skipped else "reused" if r.reused else "model").inc()
        if r.skipped is not None:
            self.skipped += 1
            self._score(r)
            return
        self.analysed += 1
        self.last = r
        self._score(r)
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
