"""The messages between the pipeline's stages and its subscribers: frozen, built by keyword."""

from __future__ import annotations

from dataclasses import asdict, dataclass
from typing import Any

import av
import numpy as np

from edge_app.budget import Budget
from streams.netstats import NetworkEstimate


@dataclass(frozen=True)
class NetworkView:
    """What the viewers' network costs a frame: the estimate, and the bytes sent back per frame."""

    estimate: NetworkEstimate
    frame_bytes: float


def r3(v: float) -> float:
    return round(float(v), 3)


def r2(v: float) -> float:
    return round(float(v), 2)


@dataclass(frozen=True, kw_only=True)
class FrameResult:
    """One analysed frame, as DECIDE made it; ``to_json`` is what a data-channel subscriber gets."""

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
    stages_ms: dict[str, float]  # convert, preprocess, inference (and annotate, when the frame was rendered)
    latency_ms: float  # server side: arrival to result ready (and annotated frame, when rendered)
    deadline_met: bool  # latency + expected network time <= total budget
    dropped_stale: int  # frames of this source dropped before analysis, so far
    error: str | None = None  # a later segment failed; the answer comes from the exits before it
    reused: bool = False  # no exit ran (exit 0): even exit 1 would have been late, the smoothed answer so far
    skipped: str | None = None  # why it was answered unanalysed: "stale" (a newer frame replaced it while busy)
    frame_size: tuple[int, int] = (0, 0)  # (width, height) as decoded: a browser lowers it when bits are short
    truth: str | None = None  # the label a labelled source says the frame shows (the demo camera)
    raw_correct: bool | None = None  # the raw answer names it (None: no truth, or reused)
    smoothed_correct: bool | None = None

    def to_compact_json(self, class_names: list[str]) -> dict[str, Any]:
        """What the page and a user's script need, about half of ``to_json``'s bytes (the default on the data
        channel: at 30 fps the full form alone is ~230 kbit/s)."""
        out: dict[str, Any] = {
            "type": "result", "source": self.source, "frame": self.seq,
            "raw": {"class": self.raw_class, "confidence": r2(self.raw_confidence)},
            "smoothed": {"class": self.smoothed_class, "label": class_names[self.smoothed_class],
                         "confidence": r2(self.smoothed_confidence)},
            "exit": self.exit, "exits_run": self.exits_run, "horizon": self.horizon, "reused": self.reused,
            "deadline_met": self.deadline_met, "latency_ms": r2(self.latency_ms),
            "arrived_unix_ms": round(self.arrived_unix_ms, 1),
            "budget": {"total_ms": r2(self.budget.total_ms), "compute_ms": r2(self.budget.compute_ms),
                       "late_ms": r2(self.budget.late_ms)},
            "costs": {"actual_ms": r2(self.actual_ms)},
            "network": {"rtt_ms": r2(self.network.rtt_ms), "bitrate_bps": round(self.network.bitrate_bps),
                        "rtt_from_prior": self.network.rtt_from_prior},
            "frame_size": list(self.frame_size),
        }
        if self.stamp is not None:
            out["stamp"] = self.stamp
        if self.truth is not None:
            out["truth"] = self.truth_json()
        if self.error is not None:
            out["error"] = self.error
        if self.skipped is not None:
            out["skipped"] = self.skipped
        return out

    def to_json(self, class_names: list[str]) -> dict[str, Any]:
        """Every field (``"detail": true``): on request (``"results": "full"`` in the offer), else once a second."""
        return {
            "type": "result",
            "source": self.source,
            "frame": self.seq,
            "stamp": self.stamp,
            "arrived_unix_ms": r3(self.arrived_unix_ms),
            "raw": {"class": self.raw_class, "label": class_names[self.raw_class],
                    "confidence": r3(self.raw_confidence)},
            "smoothed": {"class": self.smoothed_class, "label": class_names[self.smoothed_class],
                         "confidence": r3(self.smoothed_confidence)},
            "exit": self.exit,
            "exits_run": self.exits_run,
            "horizon": self.horizon,
            "costs": {"predicted_ms": r3(self.predicted_ms), "actual_ms": r3(self.actual_ms),
                      "segments_ms": [r3(v) for v in self.segments_ms]},
            "budget": {k: r3(v) for k, v in asdict(self.budget).items()},
            "network": {k: (v if isinstance(v, bool) else r3(v)) for k, v in asdict(self.network).items()},
            "stages_ms": {k: r3(v) for k, v in self.stages_ms.items()},
            "latency_ms": r3(self.latency_ms),
            "deadline_met": self.deadline_met,
            "dropped_stale": self.dropped_stale,
            "error": self.error,
            "reused": self.reused,
            "skipped": self.skipped,
            "frame_size": list(self.frame_size),
            "truth": None if self.truth is None else self.truth_json(),
            "detail": True,
        }

    def truth_json(self) -> dict[str, Any]:
        return {"label": self.truth, "raw_correct": self.raw_correct, "smoothed_correct": self.smoothed_correct}


@dataclass(frozen=True)
class AnalysedFrame:
    """What subscribers get: the result, and the annotated frame when some subscriber wants video."""

    result: FrameResult
    i420: np.ndarray | None = None  # planar YUV 4:2:0 (what the encoder takes), shared by all video viewers
    classes: list[str] | None = None  # the class names of the model that answered (a swap changes them)

    def video_frame(self) -> av.VideoFrame:
        """A new ``av.VideoFrame`` per viewer (each encoder stamps its own pts on it)."""
        if self.i420 is None:
            raise ValueError("this frame was not rendered: no subscriber asked for video")
        return av.VideoFrame.from_ndarray(self.i420, format="yuv420p")
