"""Camera frame -> model input: centre crop to a square, area resize, normalise, NCHW float32."""

from __future__ import annotations

import cv2
import numpy as np

from models.manifest import InputSpec


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
