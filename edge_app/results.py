"""The messages between the pipeline's stages and its subscribers: frozen, built by keyword."""

from __future__ import annotations

from dataclasses import dataclass

import av
import numpy as np

from edge_app.decision.budget import Budget
from streams.netstats import NetworkEstimate


@dataclass(frozen=True)
class NetworkView:
    """What the viewers' network costs a frame: the estimate, and the bytes sent back per frame."""

    estimate: NetworkEstimate
    frame_bytes: float



@dataclass(frozen=True, kw_only=True)
class FrameResult:
    """One analysed frame, as DECIDE made it; ``edge_app.protocol.result`` is what a data-channel subscriber gets."""

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
    reused: bool = False  # no exit ran (exit 0): the smoothed answer so far (even exit 1 would be late, or unchanged)
    unchanged: bool = False  # exit 0 answered: the picture did not change enough since the model last ran
    skipped: str | None = None  # why it was answered unanalysed: "stale" (a newer frame replaced it while busy)
    frame_size: tuple[int, int] = (0, 0)  # (width, height) as decoded: a browser lowers it when bits are short
    truth: str | None = None  # the label a labelled source says the frame shows (the demo camera)
    raw_correct: bool | None = None  # the raw answer names it (None: no truth, or reused)
    smoothed_correct: bool | None = None


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
