"""What became of every frame a pipeline's source delivered: answered on time or late (by the model, reused, or
skipped for a newer one), or unanswered with a reason; the figures ``/status`` and ``/metrics`` show."""

from __future__ import annotations

import logging
from collections.abc import Callable
from typing import Any

from edge_app.metrics import Metrics
from edge_app.results import FrameResult
from streams.frames import LatestSlot, SourceFrame

log = logging.getLogger(__name__)


class FrameTally:
    def __init__(self, source: str, metric_source: str, metrics: Metrics, slot: LatestSlot[SourceFrame],
                 full_ms: Callable[[], float]) -> None:
        self.source = source
        self.full_ms = full_ms  # what full depth costs a frame now (the segments' medians): compute saved
        self.metric_source = metric_source
        self.metrics = metrics
        self.slot = slot
        self.analysed = 0
        self.errors = 0
        self.deadline_misses = 0
        self.reused = 0
        self.unchanged = 0  # answered at exit 0: the picture did not change enough since the model last ran
        self.compute_ms = 0.0  # what the answered frames cost (exit 0's measure included), and what full depth
        self.full_depth_ms = 0.0  # would have cost them
        self.answered = {"on_time": 0, "late": 0}
        self.skipped = 0  # answered from the smoothed state: replaced by a newer frame while busy
        self.unanswered = {"no-answer-yet": 0, "error": 0}
        self.last: FrameResult | None = None
        self.scored = dict.fromkeys(("frames", "raw_frames", "raw_correct", "smoothed_correct"), 0)

    def new_model(self) -> None:
        self.last = None
        self.scored = dict.fromkeys(self.scored, 0)

    def unanswerable(self) -> None:
        """Skipped before the source had any answer to give."""
        self.unanswered["no-answer-yet"] += 1
        self.metrics.frames_unanswered.labels(self.metric_source, "no-answer-yet").inc()

    def exit0(self) -> dict[str, Any]:
        """Exit 0's share of every frame answered, and what the answers cost as a share of full depth on every one of
        them (a frame skipped as stale, or reused because even exit 1 would be late, cost nothing)."""
        n = sum(self.answered.values())
        return {"frames": self.unchanged, "share": round(self.unchanged / n, 4) if n else None,
                "compute_share_of_full_depth": round(self.compute_ms / self.full_depth_ms, 4)
                if self.full_depth_ms else None}

    def live_accuracy(self) -> dict[str, Any] | None:
        """A labelled source's running accuracy under the model in use (None for a source without labels)."""
        s = self.scored
        if not s["frames"]:
            return None
        return {"frames": s["frames"], "raw": round(s["raw_correct"] / max(1, s["raw_frames"]), 4),
                "smoothed": round(s["smoothed_correct"] / s["frames"], 4)}

    # --- bookkeeping ---------------------------------------------------------------------------------------

    def failed(self, seq: int, error: str, answered: bool) -> None:
        """Counted every time, logged the first time and then once per 300 (a broken segment fails every frame)."""
        self.errors += 1
        self.metrics.analysis_errors.labels(self.metric_source).inc()
        if not answered:
            self.unanswered["error"] += 1
            self.metrics.frames_unanswered.labels(self.metric_source, "error").inc()
        if self.errors == 1 or self.errors % 300 == 0:
            what = "answered from an earlier exit" if answered else "not analysed"
            log.error("%s: frame %d %s (%d failures so far): %s", self.source, seq, what, self.errors, error)

    def score(self, r: FrameResult) -> None:
        if r.truth is not None:  # a labelled source: live accuracy, for /status and the page
            self.scored["frames"] += 1
            self.scored["raw_frames"] += r.raw_correct is not None
            self.scored["raw_correct"] += bool(r.raw_correct)
            self.scored["smoothed_correct"] += bool(r.smoothed_correct)

    def counts(self) -> dict[str, Any]:
        """Every frame that arrived, as users see it: answered on time / late (of which skipped: the smoothed
        answer for a frame replaced while busy), or unanswered with its reason; they add up to ``arrived``."""
        return {"arrived": self.slot.put_count, "on_time": self.answered["on_time"], "late": self.answered["late"],
                "skipped": self.skipped, "reused": self.reused, "unchanged": self.unchanged,
                "unanswered": dict(self.unanswered),
                "pending": self.slot.put_count - sum(self.answered.values()) - sum(self.unanswered.values())}

    def record(self, r: FrameResult) -> None:
        m, src = self.metrics, self.metric_source
        timing = "on_time" if r.deadline_met else "late"
        self.answered[timing] += 1
        how = "skipped" if r.skipped else "exit0" if r.unchanged else "reused" if r.reused else "model"
        m.frames_answered.labels(src, timing, how).inc()
        self.compute_ms += r.actual_ms  # 0 for a frame skipped or reused late
        self.full_depth_ms += self.full_ms()
        m.compute_share.labels(src).set(self.compute_ms / max(self.full_depth_ms, 1e-9))
        if r.skipped is not None:
            self.skipped += 1
            self.score(r)
            return
        self.analysed += 1
        self.last = r
        self.score(r)
        m.frames_analysed.labels(src).inc()
        if r.unchanged:
            self.unchanged += 1
            m.exit_chosen.labels("0").inc()
        elif r.reused:
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
