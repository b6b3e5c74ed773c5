"""DECIDE: one source's per-frame decisions: budget -> scheduler -> smoothing -> ``FrameResult``.

``Decider.prepare`` (in a media thread: conversion and pre-processing are CPU work) turns a decoded frame into the
model's input, exit 0's thumbnail of it (``models.video``) and works out its compute budget; ``Decider.decide`` (on
the event loop) either reuses the smoothed answer (even exit 1 would be late), or answers at exit 0 with it (the
policy's index says the picture did not change enough since the model last ran), or submits the frame to the
inference service through the scheduler, then smooths.  ``Decider.result`` builds the frozen result by keyword.
No annotation happens here: that is RENDER's (``edge_app.annotate``), and only when some subscriber wants video.
"""

from __future__ import annotations

import time
from dataclasses import dataclass, replace
from typing import Any

import numpy as np

from edge_app.config import BudgetConfig, SmoothingConfig
from edge_app.decision.budget import Budget, frame_budget, late_uplink_ms
from edge_app.decision.governor import Governor
from edge_app.decision.scheduler import FrameDecision, FrameScheduler
from edge_app.decision.smoothing import Smoothed, TemporalSmoother
from edge_app.results import FrameResult, NetworkView
from models.costs import RunningCost
from models.policies import ExitPolicy
from models.preprocess import Region, crop_region
from models.runtime import ExitResult
from models.service import Runner
from models.video import change, thumbnail
from streams.frames import SourceFrame
from streams.netstats import ArrivalDelay
from streams.stamp import read_stamp


@dataclass(frozen=True)
class PipelineSettings:
    """How one source is analysed (the pipeline's settings, from ``config.toml``)."""

    budget: BudgetConfig
    smoothing: SmoothingConfig
    truncate: bool = True  # never start an exit whose predicted cost misses the deadline
    probe: bool = False  # read the frame counter a test source stamps into each frame
    uplink_from_frames: bool = False  # a browser's own camera: frame arrival shows the uplink's delay


@dataclass(frozen=True, kw_only=True)
class PreparedFrame:
    sf: SourceFrame
    rgb: np.ndarray  # (H, W, 3) uint8, what RENDER draws on
    view: np.ndarray  # the part of ``rgb`` the model sees (the region's square; the whole frame without one)
    x: np.ndarray  # the model's input
    stamp: int | None
    budget: Budget
    network: NetworkView
    convert_ms: float
    preprocess_ms: float
    ready_s: float = 0.0  # time.monotonic() when it was prepared (it may wait for the frame before it)
    thumb: np.ndarray | None = None  # exit 0's picture of the model's input (a policy with exit 0 only)
    thumb_ms: float = 0.0


def reused_decision(sm: Smoothed, compute_budget_ms: float) -> FrameDecision:
    """What a frame answered without the model carries: no exit run (``exit_index`` -1), the smoothed answer so
    far as its answer."""
    return FrameDecision(exit_index=-1, exits_run=0, horizon=0,
                         result=ExitResult(-1, sm.probs, sm.label, sm.confidence, 0.0), predicted_ms=0.0,
                         actual_ms=0.0, compute_budget_ms=compute_budget_ms, deadline_met=True)


class Decider:
    def __init__(self, source: str, service: Runner, policy: ExitPolicy, settings: PipelineSettings,
                 reliability: list[float], load: Governor | None = None) -> None:
        self.source = source
        self.load = load  # the operating point for each frame, from the arrival rate (None: ``policy`` always)
        self.settings = settings
        self.service = service
        sm = settings.smoothing
        self.scheduler = FrameScheduler(service, policy, sm.max_depth_step, settings.truncate, source)
        self.smoother = TemporalSmoother(reliability, sm.alpha, sm.hysteresis)
        self.render_ms = RunningCost(1.0, 64, percentile=90)  # RENDER's cost, budgeted ahead while video is wanted
        self._smoothed: Smoothed | None = None  # the latest smoothed answer, what a reused frame gets
        self._reused_in_a_row = 0
        self._ref: tuple[np.ndarray, int] | None = None  # exit 0: (thumbnail, seq) of the frame a model exit answered
        # a browser's own camera comes over the viewer's path: its frames' arrival shows the up-leg at once
        self._arrival = ArrivalDelay() if settings.uplink_from_frames else None

    def prepare(self, sf: SourceFrame, net: NetworkView, rendering: bool, region: Region | None = None
                ) -> PreparedFrame:
        """Decode to RGB, cut the region, pre-process, work out the compute budget (in a media thread)."""
        cfg = self.settings.budget
        t0 = time.monotonic()
        rgb = sf.frame.to_ndarray(format="rgb24")
        t1 = time.monotonic()
        stamp = read_stamp(rgb) if self.settings.probe else None
        view = crop_region(rgb, region)
        x = self.service.backend.preprocess(view)
        t2 = time.monotonic()
        # a governor's points are the same chain at other lams: they have exit 0 when the policy has
        thumb = thumbnail(x) if self.scheduler.policy.exit0 is not None else None
        t3 = time.monotonic()
        est = net.estimate
        late_ms = arrival_ms = 0.0
        if self._arrival is not None and sf.frame.pts is not None:
            arrival_ms = self._arrival.add(sf.frame.pts, sf.arrived_s)
            late_ms = late_uplink_ms(arrival_ms, est.rtt_ms, est.rtt_low_ms)
        after_ms = cfg.safety_margin_ms + (self.render_ms.high_ms if rendering else 0.0)
        budget = replace(frame_budget(cfg.total_budget_ms, est.rtt_ms, net.frame_bytes, est.bitrate_bps,
                                      (t2 - sf.arrived_s) * 1e3, after_ms, late_ms, cfg.late_return_factor),
                         arrival_delay_ms=arrival_ms)
        return PreparedFrame(sf=sf, rgb=rgb, view=view, x=x, stamp=stamp, budget=budget, network=net,
                             convert_ms=(t1 - t0) * 1e3, preprocess_ms=(t2 - t1) * 1e3, ready_s=t3, thumb=thumb,
                             thumb_ms=(t3 - t2) * 1e3)

    async def decide(self, p: PreparedFrame) -> tuple[FrameDecision, Smoothed]:
        """Reuse the smoothed answer or run the model; raises ``SegmentRunError`` when exit 1 fails. The compute
        budget loses what the frame waited after it was prepared (behind the frame before it)."""
        compute_ms = p.budget.compute_ms - (max(0.0, time.monotonic() - p.ready_s) * 1e3 if p.ready_s else 0.0)
        if self._reuse(compute_ms):
            self._reused_in_a_row += 1
            assert self._smoothed is not None
            return reused_decision(self._smoothed, compute_ms), self._smoothed
        self._reused_in_a_row = 0
        policy = self.scheduler.policy if self.load is None else self.load.policy(time.monotonic(), self.segment_ms)
        plan = self.scheduler.plan(compute_ms)
        if policy.exit0 is not None and self._smoothed is not None and self._ref is not None and p.thumb is not None:
            t0 = time.perf_counter()
            if policy.exit0.decide(plan.horizon, change(p.thumb, self._ref[0]), p.sf.seq - self._ref[1],
                                   self._smoothed.confidence):  # the picture did not change enough: it stands
                ms = p.thumb_ms + (time.perf_counter() - t0) * 1e3
                return replace(reused_decision(self._smoothed, compute_ms), horizon=plan.horizon, actual_ms=ms,
                               unchanged=True), self._smoothed
        dec = await self.scheduler.analyse(p.x, compute_ms, policy, plan)
        self._smoothed = self.smoother.update(dec.result.probs, dec.exit_index)
        if p.thumb is not None:
            self._ref = (p.thumb, p.sf.seq)  # exit 0 measures change against the frame the model last saw
        return dec, self._smoothed

    def segment_ms(self) -> list[float]:
        """What each segment costs now (the inference service's running medians)."""
        return [c.median_ms for c in self.service.costs]

    @property
    def smoothed(self) -> Smoothed | None:
        """The latest smoothed answer (None before the first analysed frame)."""
        return self._smoothed

    def skipped_result(self, sf: SourceFrame, net: NetworkView, stamp: int | None, dropped_stale: int
                       ) -> FrameResult | None:
        """The answer of a frame replaced by a newer one before it could be analysed: the smoothed answer so far,
        at once (``reused``, ``skipped: "stale"``); None before there is one."""
        sm = self._smoothed
        if sm is None:
            return None
        cfg, est = self.settings.budget, net.estimate
        now = time.monotonic()
        waited_ms = (now - sf.arrived_s) * 1e3
        budget = frame_budget(cfg.total_budget_ms, est.rtt_ms, net.frame_bytes, est.bitrate_bps, waited_ms)
        dec = reused_decision(sm, budget.compute_ms)
        return FrameResult(
            source=self.source, seq=sf.seq, stamp=stamp, arrived_unix_ms=(time.time() - waited_ms / 1e3) * 1e3,
            raw_class=sm.label, raw_confidence=sm.confidence, smoothed_class=sm.label,
            smoothed_confidence=sm.confidence, exit=0, exits_run=0, horizon=0, predicted_ms=0.0, actual_ms=0.0,
            segments_ms=(), budget=budget, network=est, stages_ms={}, latency_ms=waited_ms,
            deadline_met=waited_ms + budget.network_ms <= cfg.total_budget_ms, dropped_stale=dropped_stale,
            reused=True, skipped="stale", frame_size=(sf.frame.width, sf.frame.height),
            **self._scored(sf.truth, dec, sm))

    def _reuse(self, compute_ms: float) -> bool:
        """Answer without the model: even exit 1 (its high-percentile cost) would be late with the safety
        margin spent too, there is an answer to give, and fewer than ``max_reused_in_a_row`` went before."""
        cfg = self.settings.budget
        if not (cfg.reuse_when_late and self.scheduler.truncate) or self._smoothed is None:
            return False
        if self._reused_in_a_row >= cfg.max_reused_in_a_row:
            return False
        return compute_ms + cfg.safety_margin_ms < self.scheduler.predicted_costs_ms()[0]

    def on_time(self, p: PreparedFrame, now_s: float, rendering: bool) -> bool:
        """Whether the result, sent now (after RENDER's expected cost if rendering), reaches the viewer in time."""
        after = self.render_ms.high_ms if rendering else 0.0
        return (now_s - p.sf.arrived_s) * 1e3 + after + p.budget.network_ms <= self.settings.budget.total_budget_ms

    def result(self, p: PreparedFrame, dec: FrameDecision, sm: Smoothed, done_s: float, render_ms: float | None,
               dropped_stale: int) -> FrameResult:
        latency_ms = (done_s - p.sf.arrived_s) * 1e3
        stages = {"convert": p.convert_ms, "preprocess": p.preprocess_ms, "inference": dec.actual_ms}
        if render_ms is not None:
            stages["annotate"] = render_ms
        return FrameResult(
            source=self.source, seq=p.sf.seq, stamp=p.stamp, arrived_unix_ms=(time.time() - (done_s - p.sf.arrived_s))
            * 1e3, raw_class=dec.result.label, raw_confidence=dec.result.confidence, smoothed_class=sm.label,
            smoothed_confidence=sm.confidence, exit=dec.exit_index + 1, exits_run=dec.exits_run, horizon=dec.horizon,
            predicted_ms=dec.predicted_ms, actual_ms=dec.actual_ms, segments_ms=dec.segments_ms, budget=p.budget,
            network=p.network.estimate, stages_ms=stages, latency_ms=latency_ms,
            deadline_met=latency_ms + p.budget.network_ms <= self.settings.budget.total_budget_ms,
            dropped_stale=dropped_stale, error=dec.error, reused=dec.exit_index < 0, unchanged=dec.unchanged,
            frame_size=(p.rgb.shape[1], p.rgb.shape[0]), **self._scored(p.sf.truth, dec, sm))

    def _scored(self, truth: str | None, dec: FrameDecision, sm: Smoothed) -> dict[str, Any]:
        """Against a labelled source's truth: whether the raw (not a reused) and the smoothed answers name it."""
        if truth is None:
            return {}
        names = self.service.class_names
        raw = None if dec.exit_index < 0 else names[dec.result.label] == truth
        return {"truth": truth, "raw_correct": raw, "smoothed_correct": names[sm.label] == truth}
