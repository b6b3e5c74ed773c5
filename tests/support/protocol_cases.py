"""The frame every protocol vector's results are made from (``tests/protocol/vectors.json``)."""

from __future__ import annotations

from edge_app.decision.budget import Budget
from edge_app.results import FrameResult
from streams.netstats import NetworkEstimate

CLASSES = ["cat", "dog", "empty"]


def frame_result(**over: object) -> FrameResult:
    fields: dict[str, object] = dict(
        source="browser-0123456789ab", seq=41, stamp=1234, arrived_unix_ms=1765000000123.4567, raw_class=1,
        raw_confidence=0.87654, smoothed_class=1, smoothed_confidence=0.91234, exit=2, exits_run=2, horizon=3,
        predicted_ms=6.54321, actual_ms=7.12345, segments_ms=(3.1234, 4.0001),
        budget=Budget(total_ms=100.0, network_ms=30.5, waited_ms=2.25, compute_ms=67.25, late_ms=1.5,
                      arrival_delay_ms=3.0),
        network=NetworkEstimate(rtt_ms=25.123, rtt_smoothed_ms=24.5, rtt_trend_ms_per_s=0.0, bitrate_bps=2e6,
                                rtt_from_prior=False, bitrate_from_prior=True, rtt_low_ms=20.0),
        stages_ms={"convert": 0.5, "preprocess": 1.25, "inference": 7.125}, latency_ms=11.5678, deadline_met=True,
        dropped_stale=3, frame_size=(640, 480))
    fields.update(over)
    return FrameResult(**fields)  # type: ignore[arg-type]
