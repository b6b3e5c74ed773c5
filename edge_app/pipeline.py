"""One source's analysis loop, in stages: newest frame -> DECIDE -> (RENDER, only if wanted) -> subscribers.

``AnalysisPipeline`` takes frames from a ``LatestSlot`` (a browser's track or an RTSP camera).  DECIDE
(``edge_app.decision.decide``) prepares the frame in a media thread, works out its compute budget from the network view
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
from edge_app.decision.decide import Decider, PipelineSettings, PreparedFrame
from edge_app.decision.governor import Governor
from edge_app.decision.scheduler import FrameDecision
from edge_app.decision.smoothing import Smoothed
from edge_app.decision.tally import FrameTally
from edge_app.metrics import Metrics
from edge_app.results import AnalysedFrame, FrameResult, NetworkView
from models.errors import SegmentRunError
from models.policies import ExitPolicy
from models.preprocess import Region, region_box
from models.service import Runner
from streams.frames import Broadcast, LatestSlot, SlotClosed, SourceFrame
from streams.stamp import read_stamp
from streams.tasks import cancel_and_wait

log = logging.getLogger(__name__)

Subscriber = Callable[[AnalysedFrame], None]


@dataclass(frozen=True)
class Engine:
    """What every pipeline of the app shares: the inference service, the exit policy, metrics, media threads."""

    service: Runner
    policy: ExitPolicy
    metrics: Metrics
    media: Executor  # conversion, pre-processing and RENDER: CPU work that must stay off the event loop
    load: Governor | None = None  # the operating point per frame from the arrival rate ([policy] adapt_to_load)


class AnalysisPipeline:
    def __init__(self, source: str, metric_source: str, slot: LatestSlot[SourceFrame], engine: Engine,
                 settings: PipelineSettings, network: NetworkView) -> None:
        self.source = source
        self.metric_source = metric_source
        self.slot = slot
        self.engine = engine
        self.settings = settings
        self.network = network  # the worst of its viewers' views, pushed when one changes (``set_network``)
        service = engine.service
        self.decider = Decider(source, service, engine.policy, settings,
                               [ex.test_accuracy for ex in service.backend.manifest.exits], engine.load)
        self.outputs: Broadcast[AnalysedFrame] = Broadcast()
        self._video_subscribers: set[Subscriber] = set()
        self.rendered = 0  # frames RENDER drew: 0 while nobody watches this source as video
        self.tally = FrameTally(source, metric_source, engine.metrics, slot,  # every frame that arrived, answered
                                lambda: sum(c.median_ms for c in self.engine.service.costs))
        # the ingest side's view of each analysed frame (a browser's uplink control reads its arrival delay)
        self.on_decided: Callable[[FrameResult], None] | None = None
        self._task: asyncio.Task[None] | None = None
        self._busy = False  # a frame is between DECIDE and publish
        self._next: tuple[Engine, asyncio.Event] | None = None  # a model swap, applied between frames
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

    def add_tap(self, tap: Callable[[int, np.ndarray], None]) -> None:
        """``tap(seq, rgb)`` sees the part of each frame the model sees (copy it to keep it), before RENDER."""
        self.frame_taps.add(tap)

    def remove_tap(self, tap: Callable[[int, np.ndarray], None]) -> None:
        self.frame_taps.discard(tap)

    def run_media(self, fn: Callable[..., Any], *args: Any) -> asyncio.Future[Any]:
        """``fn(*args)`` in the media threads (CPU work off the event loop, beside conversion and RENDER)."""
        return asyncio.get_running_loop().run_in_executor(self.engine.media, fn, *args)

    def set_network(self, view: NetworkView) -> None:
        """The network view the next frames are budgeted for (a camera's: the costliest of its viewers')."""
        self.network = view

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
        await cancel_and_wait(self._task)
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
        self.tally.new_model()  # the new model's own figures
        done.set()

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
                    log.info("%s: source closed after %d analysed frames", self.source, self.tally.analysed)
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
                self.tally.failed(sf.seq, str(exc), answered=False)
                continue
            finally:
                self._busy = False
            if self.engine.load is not None:  # the pipeline's own work per frame, outside inference
                busy_ms = (time.monotonic() - t0) * 1e3
                own = max(0.0, busy_ms - out.result.actual_ms) + max(0.0, prepared.convert_ms +
                                                                     prepared.preprocess_ms - busy_ms)
                self.engine.load.own_work(self.source, own)
            if out.result.error is not None:
                self.tally.failed(sf.seq, out.result.error, answered=True)
            self.tally.record(out.result)
            if self.on_decided is not None:
                self.on_decided(out.result)
            self.outputs.publish(out)

    def _prepare(self, sf: SourceFrame) -> asyncio.Future[PreparedFrame]:
        """Convert, cut the region, pre-process and budget ``sf`` in a media thread."""
        return asyncio.get_running_loop().run_in_executor(self.engine.media, self.decider.prepare, sf,
                                                          self.network, self.wants_video, self.region)

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
        result = self.decider.skipped_result(sf, self.network, stamp, self.slot.dropped)
        if result is None:
            self.tally.unanswerable()
            return
        self.tally.record(result)
        self.outputs.publish(AnalysedFrame(result, classes=self.engine.service.class_names))
