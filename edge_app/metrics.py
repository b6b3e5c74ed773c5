"""Prometheus metrics (prometheus-client), one registry per app so that several apps can live in a test.

Counters and histograms are updated as frames go by; camera and session
state is read at scrape time by ``LiveStateCollector`` from the objects that
own it, so nothing is kept twice.  Labels are bounded: ``source`` is a camera
name or ``browser`` (all browser cameras together), never a session id.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable, Sequence
from typing import Any

from prometheus_client import CollectorRegistry, Counter, Gauge, Histogram, disable_created_metrics, generate_latest
from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily, Metric
from prometheus_client.registry import Collector

from streams.source import STATES, CameraSource

disable_created_metrics()  # type: ignore[no-untyped-call]  # no *_created series: they double the exposition and say nothing an operator needs

_MS_BUCKETS = (0.0005, 0.001, 0.002, 0.005, 0.01, 0.02, 0.05, 0.1, 0.2, 0.5, 1.0, 2.0)


class Metrics:
    def __init__(self, model_name: str, providers: Sequence[str], num_exits: int) -> None:
        self.registry = CollectorRegistry()
        r = self.registry
        self.frames_received = Counter("edge_frames_received", "Frames that arrived from a source", ["source"],
                                       registry=r)
        self.frames_dropped = Counter("edge_frames_dropped_stale", "Frames dropped because a newer one replaced "
                                      "them (stage: analysis = before analysis, send = before the encoder)",
                                      ["source", "stage"], registry=r)
        self.frames_analysed = Counter("edge_frames_analysed", "Frames analysed", ["source"], registry=r)
        self.frames_answered = Counter("edge_frames_answered", "Frames answered, by whether the answer is predicted "
                                       "to reach the viewer within total_budget_ms (on_time, late) and how (model, "
                                       "reused: the smoothed answer because even exit 1 would be late, exit0: the "
                                       "last answer because the picture did not change, skipped: replaced by a "
                                       "newer frame while busy)", ["source", "timing", "how"],
                                       registry=r)
        self.frames_unanswered = Counter("edge_frames_unanswered", "Frames that arrived and got no answer, by "
                                         "reason (no-answer-yet: skipped before the first answer; error: the "
                                         "analysis raised)", ["source", "reason"], registry=r)
        self.analysis_errors = Counter("edge_analysis_errors", "Frames whose analysis raised", ["source"],
                                       registry=r)
        self.deadline_missed = Counter("edge_deadline_missed", "Frames whose result is predicted to reach the "
                                       "viewer later than total_budget_ms", ["source"], registry=r)
        self.answers_reused = Counter("edge_answers_reused", "Frames answered with the smoothed answer so far, "
                                      "without the model, because even exit 1 would have been late",
                                      ["source"], registry=r)
        self.exit_chosen = Counter("edge_exit_chosen", "Frames answered by each exit (0: the last answer, the "
                                   "picture unchanged)", ["exit"], registry=r)
        self.compute_share = Gauge("edge_compute_share_of_full_depth", "What the answered frames cost (exit 0's change "
                                   "measure included) as a share of full depth on every one of them", ["source"],
                                   registry=r)
        self.segment_runs = Counter("edge_segment_runs", "Segments run", ["segment"], registry=r)
        self.segment_seconds = Histogram("edge_segment_seconds", "Measured time of each segment", ["segment"],
                                         buckets=_MS_BUCKETS, registry=r)
        self.frame_latency = Histogram("edge_frame_latency_seconds", "Server-side latency: frame arrival to "
                                       "annotated frame and result ready", ["source"],
                                       buckets=(0.005, 0.01, 0.02, 0.03, 0.05, 0.075, 0.1, 0.15, 0.25, 0.5, 1.0),
                                       registry=r)
        self.compute_budget = Histogram("edge_compute_budget_seconds", "Compute budget per frame", ["source"],
                                        buckets=(0, 0.005, 0.01, 0.02, 0.05, 0.1, 0.15, 0.2, 0.3, 0.5), registry=r)
        self.rtt_estimate = Histogram("edge_rtt_estimate_seconds", "RTT estimate used per frame", ["source"],
                                      buckets=(0.001, 0.005, 0.01, 0.02, 0.05, 0.1, 0.15, 0.2, 0.3, 0.5, 1.0),
                                      registry=r)
        self.results_dropped = Counter("edge_results_dropped", "Per-frame JSON results not sent because the "
                                       "data channel was not open or its buffer was full", registry=r)
        self.loop_lag = Histogram("edge_event_loop_lag_seconds", "How late the event loop's heartbeat woke up "
                                  "(edge_app.stallwatch; over 0.25 s is logged as a stall)",
                                  buckets=(0.001, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5), registry=r)
        self.offers = Counter("edge_offers", "WebRTC offers by outcome", ["outcome"], registry=r)
        self.sessions_closed = Counter("edge_sessions_closed", "Peer sessions closed, by reason (connect-timeout, "
                                       "ice-failed, dtls-failed, peer-gone, closed, shutdown)", ["reason"],
                                       registry=r)
        self.operating_point = Gauge("edge_operating_point", "The dynamic index's operating point: 0 is the fitted "
                                     "lam, higher is cheaper (the load governor moves it when frames arrive faster "
                                     "than the inference threads take them)", registry=r)
        self.operating_cost = Gauge("edge_operating_point_cost_fraction", "Expected compute per frame at the "
                                    "operating point, as a share of full depth (calibration traces)", registry=r)
        self.inference_load = Gauge("edge_inference_load", "Expected compute of the frames arriving, as a share of "
                                    "the inference threads' time", registry=r)
        self.model_info = Gauge("edge_model_info", "The loaded model and the ONNX Runtime provider in use",
                                ["model", "provider"], registry=r)
        self.set_model(model_name, providers[0])
        for k in range(num_exits):  # export zeros from the start, so rates exist before the first frame
            self.exit_chosen.labels(str(k + 1))
            self.segment_runs.labels(str(k + 1))

    def set_model(self, name: str, provider: str) -> None:
        """The model served now (a deploy from the page changes it)."""
        self.model_info.clear()
        self.model_info.labels(name, provider).set(1)

    def add_live_state(self, sessions: Callable[[], int], cameras: Callable[[], Iterable[CameraSource]]) -> None:
        self.registry.register(LiveStateCollector(sessions, cameras))

    def exposition(self) -> bytes:
        return generate_latest(self.registry)


class LiveStateCollector(Collector):
    def __init__(self, sessions: Callable[[], int], cameras: Callable[[], Iterable[CameraSource]]) -> None:
        self._sessions = sessions
        self._cameras = cameras

    def collect(self) -> Iterable[Metric]:
        s = GaugeMetricFamily("edge_sessions", "Open peer sessions")
        s.add_metric([], self._sessions())
        yield s
        state = GaugeMetricFamily("edge_camera_state", "1 for the state each camera is in", labels=["camera", "state"])
        reconnects = CounterMetricFamily("edge_camera_reconnects", "Reconnect attempts per camera", labels=["camera"])
        frames = CounterMetricFamily("edge_camera_frames", "Frames decoded per camera", labels=["camera"])
        cams: list[Any] = list(self._cameras())
        for cam in cams:
            for st in STATES:
                state.add_metric([cam.name, st], 1.0 if cam.state == st else 0.0)
            reconnects.add_metric([cam.name], cam.reconnects)
            frames.add_metric([cam.name], cam.frames)
        yield state
        yield reconnects
        yield frames
