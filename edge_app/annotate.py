"""RENDER: draw the analysis onto the frame that goes back (label, confidence, exit used, RTT, budget) and turn
it into the planar YUV 4:2:0 the encoders take.  Run only when some subscriber wants video."""

from __future__ import annotations

from dataclasses import dataclass

import cv2
import numpy as np

from streams.stamp import column_width

_FONT = cv2.FONT_HERSHEY_SIMPLEX
_GREEN, _AMBER, _RED, _WHITE = (60, 200, 80), (240, 180, 40), (230, 60, 50), (255, 255, 255)


@dataclass(frozen=True)
class Overlay:
    label: str
    confidence: float
    exit_used: int  # 1-based; 0: no exit ran, the answer was reused
    num_exits: int
    rtt_ms: float
    compute_budget_ms: float
    deadline_met: bool
    roi: tuple[int, int, int] | None = None  # (x0, y0, side) px: the square the model sees, outlined


def annotate(rgb: np.ndarray, o: Overlay) -> None:
    """Draw ``o`` onto ``rgb`` (H, W, 3 uint8, RGB) in place: a banner at the top and a depth gauge.

    The stamp column at the left edge (``streams.stamp``) is left as it is, so that a probe client can
    still read the frame counter from the annotated frame it displays.
    """
    w = rgb.shape[1]
    x0 = column_width(w) + 4
    scale = max(0.4, w / 1280)
    thick = max(1, round(2 * scale))
    bar_h = int(56 * scale) + 8
    banner = rgb[:bar_h, x0 - 4 :]
    banner[:] = (banner.astype(np.uint16) * 2 // 5).astype(np.uint8)  # darken, keep the picture visible
    colour = _GREEN if o.confidence >= 0.8 else _AMBER if o.confidence >= 0.5 else _RED
    cv2.putText(rgb, f"{o.label}  {o.confidence * 100:.0f}%", (x0 + 6, int(30 * scale) + 4), _FONT, 1.1 * scale,
                colour, thick + 1, cv2.LINE_AA)
    depth = f"exit {o.exit_used}/{o.num_exits}" if o.exit_used else "reused"
    stats = f"{depth}  RTT {o.rtt_ms:.0f} ms  budget {o.compute_budget_ms:.0f} ms"
    cv2.putText(rgb, stats, (x0 + 6, bar_h - 8), _FONT, 0.7 * scale, _WHITE if o.deadline_met else _RED, thick,
                cv2.LINE_AA)
    if o.roi is not None:
        rx, ry, side = o.roi
        cv2.rectangle(rgb, (rx, ry), (rx + side - 1, ry + side - 1), colour, thick, cv2.LINE_AA)
    # depth gauge: one box per exit, filled up to the exit used
    box = int(18 * scale) + 4
    for k in range(o.num_exits):
        x0 = w - (o.num_exits - k) * (box + 4) - 6
        pt1, pt2 = (x0, 8), (x0 + box, 8 + box)
        if k < o.exit_used:
            cv2.rectangle(rgb, pt1, pt2, colour, -1)
        cv2.rectangle(rgb, pt1, pt2, _WHITE, 1)


def render(rgb: np.ndarray, o: Overlay) -> np.ndarray:
    """Annotate ``rgb`` in place and return it as I420 (even width and height), ready for ``av.VideoFrame``."""
    annotate(rgb, o)
    out: np.ndarray = cv2.cvtColor(rgb[: rgb.shape[0] & ~1, : rgb.shape[1] & ~1], cv2.COLOR_RGB2YUV_I420)
    return out
