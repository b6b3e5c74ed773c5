"""A scene that is not easy, for the teach benchmark: a fixed camera on a workshop (scikit-image's
``motorcycle_left`` photo) in three states that differ by a small object in one part of the view, the lower
right: nothing there, a tray of brass coins (``coins``), or a cardboard parcel (``brick``, tinted the colour of the
boxes on the shelves). The object fills 8-14 % of the
frame. Light and noise change while the states are recorded, and after deployment the scene is shown in new
light: dimmer or brighter than anything recorded for training, another tint, more noise, and the light falling
from the other side.

Phases: ``train`` (what the user records for each state), ``check`` (a check recording, captured apart: light
from the other phase's range, as a user would record "lights off" and "evening"), ``live`` (after deploy: new
light, positions a little wider). With ``night``, a frame goes through the camera's infrared night mode (grayscale,
dim, noisy), which the training recordings never show. The photos and objects are other than the tests'
(``scene.py``).
"""

from __future__ import annotations

from functools import cache
from pathlib import Path

import cv2
import numpy as np

STATES = ("empty", "coins", "parcel")
PHASES = ("train", "check", "live")
SIZE = (640, 480)
REGION = (0.5, 0.42, 0.46, 0.56)  # (x, y, w, h): the part of the view where the object appears
AREA = (0.08, 0.14)  # the object's share of the frame


@cache
def _photos() -> dict[str, tuple[np.ndarray, np.ndarray]]:
    import skimage.io
    from skimage import data  # the train extra (scikit-image ships its sample photos)

    folder = Path(data.__file__).parent
    background = cv2.resize(skimage.io.imread(folder / "motorcycle_left.png")[..., :3], SIZE,
                            interpolation=cv2.INTER_AREA)
    coins = np.asarray(data.coins())[20:280, 40:340].astype(np.float32)  # type: ignore[no-untyped-call]
    coins_rgb = np.clip(np.stack([coins * 0.75 + 40, coins * 0.62 + 35, coins * 0.45 + 25], -1), 0, 255)
    coins_mask = np.ones(coins.shape, np.float32)  # a tray of brass coins
    brick = np.asarray(data.brick())[:300, :300].astype(np.float32)  # type: ignore[no-untyped-call]
    box = np.clip(np.stack([brick * 0.45 + 110, brick * 0.35 + 80, brick * 0.25 + 50], -1), 0, 255)
    box_mask = np.ones(brick.shape, np.float32)  # a cardboard parcel, the colour of the boxes on the shelves
    return {"background": (background, np.ones(background.shape[:2], np.float32)),
            "coins": (coins_rgb.astype(np.uint8), coins_mask), "parcel": (box.astype(np.uint8), box_mask)}


def _light(phase: str, rng: np.random.Generator) -> tuple[float, np.ndarray, float, float, float]:
    """(gain, tint, noise sigma, gradient strength, gradient angle) for a phase."""
    if phase == "train":
        return (rng.uniform(0.75, 1.15), rng.uniform(0.93, 1.07, 3), rng.uniform(1, 5), rng.uniform(0.0, 0.3),
                rng.uniform(-0.6, 0.6))
    if phase == "check":  # the conditions the user expects: dim ("lights off") and bright, light from the left
        gain = rng.choice([rng.uniform(0.5, 0.7), rng.uniform(1.15, 1.3)])
        return gain, rng.uniform(0.88, 1.12, 3), rng.uniform(3, 9), rng.uniform(0.2, 0.5), rng.uniform(2.5, 3.8)
    gain = rng.choice([rng.uniform(0.35, 0.55), rng.uniform(1.2, 1.4)])  # live: new light
    return gain, rng.uniform(0.84, 1.16, 3), rng.uniform(5, 13), rng.uniform(0.2, 0.6), rng.uniform(1.6, 4.6)


def night_mode(rgb: np.ndarray, rng: np.random.Generator) -> np.ndarray:
    """The camera's infrared night mode: grayscale, dim, noisy, the illuminator brighter in the middle."""
    gray = cv2.cvtColor(rgb, cv2.COLOR_RGB2GRAY).astype(np.float32)
    yy, xx = np.mgrid[0 : gray.shape[0], 0 : gray.shape[1]].astype(np.float32)
    spot = 1.15 - 0.6 * ((xx / gray.shape[1] - 0.5) ** 2 + (yy / gray.shape[0] - 0.5) ** 2)
    gray = gray * spot * rng.uniform(0.35, 0.55) + rng.normal(0, rng.uniform(4, 9), gray.shape)
    return np.repeat(np.clip(gray, 0, 255).astype(np.uint8)[..., None], 3, -1)


def render(state: str, rng: np.random.Generator, phase: str = "train", night: bool = False) -> np.ndarray:
    """One (480, 640, 3) uint8 RGB frame of the scene in ``state`` (one of ``STATES``) in ``phase``; ``night``:
    through the camera's night mode (``night_mode``)."""
    if state not in STATES:
        raise ValueError(f"state {state!r}: one of {STATES}")
    if phase not in PHASES:
        raise ValueError(f"phase {phase!r}: one of {PHASES}")
    photos = _photos()
    frame = photos["background"][0].astype(np.float32)
    if state != "empty":
        obj, mask = photos[state]
        area = rng.uniform(*AREA) * SIZE[0] * SIZE[1]
        scale = float(np.sqrt(area / mask.sum()))
        obj_s = cv2.resize(obj, None, fx=scale, fy=scale, interpolation=cv2.INTER_AREA).astype(np.float32)
        m = cv2.resize(mask, (obj_s.shape[1], obj_s.shape[0]))[..., None]
        spread = 0.05 if phase == "train" else 0.07
        cx = (REGION[0] + REGION[2] / 2 + rng.uniform(-spread, spread)) * SIZE[0]
        cy = (REGION[1] + REGION[3] / 2 + rng.uniform(-spread, spread)) * SIZE[1]
        x = int(np.clip(cx - obj_s.shape[1] / 2, 0, SIZE[0] - obj_s.shape[1]))
        y = int(np.clip(cy - obj_s.shape[0] / 2, 0, SIZE[1] - obj_s.shape[0]))
        region = frame[y : y + obj_s.shape[0], x : x + obj_s.shape[1]]
        region[:] = region * (1 - m) + obj_s * m
    gain, tint, noise, slope, angle = _light(phase, rng)
    yy, xx = np.mgrid[0 : SIZE[1], 0 : SIZE[0]].astype(np.float32)
    ramp = 1 + slope * (np.cos(angle) * (xx / SIZE[0] - 0.5) + np.sin(angle) * (yy / SIZE[1] - 0.5))
    lit = frame * (gain * ramp)[..., None] * tint + rng.normal(0, noise, frame.shape)
    dx, dy = rng.uniform(-4, 4, 2)  # camera shake
    shift = np.array([[1, 0, dx], [0, 1, dy]], np.float32)
    out = cv2.warpAffine(np.clip(lit, 0, 255).astype(np.uint8), shift, SIZE, borderMode=cv2.BORDER_REFLECT)
    return night_mode(out, rng) if night else np.asarray(out, np.uint8)


def write_clip(folder: Path, state: str, seed: int, frames: int = 30, phase: str = "train",
               night: bool = False) -> None:
    """``frames`` JPEGs ``00000.jpg``... of ``state`` in ``folder`` (replaced one by one, atomically), for
    ``edge_app/bench/rtsp_server.py`` to loop."""
    folder.mkdir(parents=True, exist_ok=True)
    rng = np.random.default_rng(seed)
    for i in range(frames):
        rgb = render(state, rng, phase, night)
        tmp = folder / f".{i:05d}.jpg"
        cv2.imwrite(str(tmp), cv2.cvtColor(rgb, cv2.COLOR_RGB2BGR), [cv2.IMWRITE_JPEG_QUALITY, 90])
        tmp.replace(folder / f"{i:05d}.jpg")
