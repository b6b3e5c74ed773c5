"""A scene the shipped model never saw, for teaching it from the page: a real photo (scikit-image's ``rocket``,
a launch pad) with a real object (the cat of ``chelsea``) present or absent, in changing light, with sensor noise,
a little camera shake and the object at different places.

``render(state, rng, phase)`` draws one frame; ``phase="test"`` draws light, positions and noise from other
(wider) ranges than ``"train"``, so that frames after deployment are new. ``write_clip`` writes a looping JPEG
clip for ``edge_app/bench/rtsp_server.py`` (its multifilesrc re-reads the files as it loops, so rewriting the
folder changes what the camera shows within one loop).
"""

from __future__ import annotations

from functools import cache
from pathlib import Path

import cv2
import numpy as np

STATES = ("empty", "cat")
SIZE = (640, 480)


@cache
def _photos() -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    from skimage import data  # the train extra (scikit-image ships its sample photos)

    background = cv2.resize(np.asarray(data.rocket()), SIZE, interpolation=cv2.INTER_AREA)  # type: ignore[no-untyped-call]
    cat = np.asarray(data.chelsea())[40:290, 90:360]  # type: ignore[no-untyped-call]  # the cat's head and shoulders
    mask = np.zeros(cat.shape[:2], np.float32)
    cv2.ellipse(mask, (cat.shape[1] // 2, cat.shape[0] // 2), (cat.shape[1] // 2 - 4, cat.shape[0] // 2 - 4), 0, 0,
                360, 1.0, -1)
    return background, cat, cv2.GaussianBlur(mask, (15, 15), 0)


def render(state: str, rng: np.random.Generator, phase: str = "train") -> np.ndarray:
    """One (480, 640, 3) uint8 RGB frame of the scene in ``state`` ("empty" or "cat")."""
    if state not in STATES:
        raise ValueError(f"state {state!r}: one of {STATES}")
    background, cat, mask = _photos()
    frame = background.astype(np.float32)
    test = phase == "test"
    if state == "cat":
        scale = rng.uniform(0.55, 0.75) if not test else rng.uniform(0.5, 0.8)
        obj = cv2.resize(cat, None, fx=scale, fy=scale, interpolation=cv2.INTER_AREA).astype(np.float32)
        m = cv2.resize(mask, (obj.shape[1], obj.shape[0]))[..., None]
        # train: the cat sits left of centre; test: anywhere in the middle band, right of centre too
        cx = rng.uniform(0.35, 0.5) if not test else rng.uniform(0.3, 0.7)
        cy = rng.uniform(0.55, 0.7) if not test else rng.uniform(0.5, 0.75)
        x = int(cx * SIZE[0] - obj.shape[1] / 2)
        y = int(cy * SIZE[1] - obj.shape[0] / 2)
        x, y = max(0, min(SIZE[0] - obj.shape[1], x)), max(0, min(SIZE[1] - obj.shape[0], y))
        region = frame[y : y + obj.shape[0], x : x + obj.shape[1]]
        region[:] = region * (1 - m) + obj * m
    gain = rng.uniform(0.7, 1.2) if not test else rng.choice([rng.uniform(0.55, 0.7), rng.uniform(1.2, 1.35)])
    tint = rng.uniform(0.92, 1.08, 3) if not test else rng.uniform(0.88, 1.12, 3)
    lit = frame * gain * tint + rng.normal(0, rng.uniform(1, 6), frame.shape)
    dx, dy = rng.uniform(-6, 6, 2)  # camera shake
    shift = np.array([[1, 0, dx], [0, 1, dy]], np.float32)
    out = cv2.warpAffine(np.clip(lit, 0, 255).astype(np.uint8), shift, SIZE, borderMode=cv2.BORDER_REFLECT)
    return np.asarray(out, np.uint8)


def write_clip(folder: Path, state: str, seed: int, frames: int = 30, phase: str = "train") -> None:
    """``frames`` JPEGs ``00000.jpg``... of ``state`` in ``folder`` (replaced one by one, atomically): light and
    positions drift across the clip, as a slow change of the scene."""
    folder.mkdir(parents=True, exist_ok=True)
    rng = np.random.default_rng(seed)
    for i in range(frames):
        rgb = render(state, rng, phase)
        tmp = folder / f".{i:05d}.jpg"
        cv2.imwrite(str(tmp), cv2.cvtColor(rgb, cv2.COLOR_RGB2BGR), [cv2.IMWRITE_JPEG_QUALITY, 90])
        tmp.replace(folder / f"{i:05d}.jpg")
