"""Camera frame -> model input: the region of interest (or the centre square), area resize, normalise, NCHW
float32.

A region is ``(x, y, w, h)`` in fractions of the frame (a gate in a corner, the step where parcels are left).
The model sees the smallest square of pixels that holds it, centred on it and moved inside the frame where it
would cross an edge, so nothing is stretched and capture, training and live analysis cut the same pixels.
"""

from __future__ import annotations

import cv2
import numpy as np

from models.manifest import InputSpec

Region = tuple[float, float, float, float]


def region_box(height: int, width: int, region: Region) -> tuple[int, int, int]:
    """(x0, y0, side) in pixels: the square holding ``region`` of an (height, width) frame (see above)."""
    x, y, w, h = region
    side = max(1, min(height, width, round(max(w * width, h * height))))
    cx, cy = (x + w / 2) * width, (y + h / 2) * height
    x0 = int(min(max(round(cx - side / 2), 0), width - side))
    y0 = int(min(max(round(cy - side / 2), 0), height - side))
    return x0, y0, side


def crop_region(frame_rgb: np.ndarray, region: Region | None) -> np.ndarray:
    """The square of ``frame_rgb`` (H, W, 3) the model sees for ``region`` (a view, not a copy); the frame itself
    when there is no region."""
    if region is None:
        return frame_rgb
    x0, y0, side = region_box(frame_rgb.shape[0], frame_rgb.shape[1], region)
    return frame_rgb[y0 : y0 + side, x0 : x0 + side]


def crop_resize(frame_rgb: np.ndarray, size: tuple[int, int]) -> np.ndarray:
    """The centre square of an (H, W, 3) frame at ``size`` (w, h) px: what the model sees, still uint8."""
    h, w = frame_rgb.shape[:2]
    side = min(h, w)
    y, x = (h - side) // 2, (w - side) // 2
    crop = frame_rgb[y : y + side, x : x + side]
    interp = cv2.INTER_AREA if side > size[0] else cv2.INTER_LINEAR
    return crop if (side, side) == size else cv2.resize(crop, size, interpolation=interp)


class Preprocessor:
    """Turns an (H, W, 3) uint8 RGB frame into the (1, 3, h, w) float32 input the first segment takes."""

    def __init__(self, spec: InputSpec) -> None:
        self.size = (spec.width, spec.height)
        self._scale = [np.float32(v) for v in 1.0 / (255.0 * np.asarray(spec.std, np.float32))]
        self._offset = [np.float32(v) for v in np.asarray(spec.mean, np.float32) / np.asarray(spec.std, np.float32)]

    def __call__(self, frame_rgb: np.ndarray) -> np.ndarray:
        if frame_rgb.ndim != 3 or frame_rgb.shape[2] != 3 or frame_rgb.dtype != np.uint8:
            raise ValueError(f"expected an (H, W, 3) uint8 RGB frame, got shape {frame_rgb.shape} "
                             f"dtype {frame_rgb.dtype}")
        chw = crop_resize(frame_rgb, self.size).transpose(2, 0, 1).astype(np.float32)
        for k in range(3):  # a plane at a time: numpy broadcasting a (3, 1, 1) array costs 10x more, per frame
            chw[k] *= self._scale[k]
            chw[k] -= self._offset[k]
        return chw[None]
