"""Labelled video in time order, made from the project's own pictures, for exit 0 (``models.video``).

A fixed camera mostly shows one state for a long while, then another. ``render`` plays labelled images as such a
camera: each image is a state held for a drawn number of seconds (``ClipSpec.hold_s``); while it holds, the frame
gets sensor noise, a slow drift of the light, and now and then a passer-by (a dark figure crossing the view in
1.5-3 s) that hides part of the scene without changing its state; a change is a short cross-fade (a door moving),
the label switching half way. ``clip_traces`` sends the frames through a codec as the live path gets them (VP8 or
H.264, ``edge_app.bench.codec``) and records, for every decoded frame, the softmax of every exit and exit 0's
thumbnail of the model's input. ``write_clip_traces`` writes a model folder's ``traces_clips-calibration.npz`` and
``traces_clips-test.npz`` (``models.folder.load_clips``) and lists them in its manifest: the calibration clips
are drawn from the calibration split's images, the test clips from the test split's, each clip with its own seed.

Two kinds of clip: ``static`` (states held 10-120 s: a gate, a door, a shelf) and ``busy`` (a new image every
second, as the demo camera shows them).
"""

from __future__ import annotations

import logging
import time
from collections import deque
from collections.abc import Iterator
from dataclasses import asdict, dataclass
from pathlib import Path

import cv2
import numpy as np

from edge_app.bench.codec import ROUNDTRIPS
from edge_app.bench.codec_traces import demo_split
from models.folder import CLIPS_CALIBRATION, CLIPS_TEST, save_clips
from models.manifest import TraceSpec, list_traces
from models.runtime import ModelRuntime
from models.video import thumbnail

log = logging.getLogger(__name__)

@dataclass(frozen=True)
class ClipSpec:
    seconds: float
    hold_s: tuple[float, float]  # each state held this long (uniform)
    codec: str = "vp8"
    kbps: float = 250.0
    fps: float = 15.0
    noise: float = 3.0  # sensor noise, grey levels (sd)
    drift: float = 0.03  # the light's random walk, log-gain per sqrt(second)
    passers_per_min: float = 1.0
    fade_s: float = 0.5
    width: int = 320
    height: int = 240
    seed: int = 0


def static_clip(minutes: float, seed: int, codec: str = "vp8") -> ClipSpec:
    return ClipSpec(60 * minutes, (10.0, 120.0), codec=codec, seed=seed)


def busy_clip(minutes: float, seed: int, codec: str = "vp8") -> ClipSpec:
    return ClipSpec(60 * minutes, (1.0, 1.0), codec=codec, passers_per_min=0.0, fade_s=0.0, seed=seed)


CALIBRATION = (static_clip(5, 11), static_clip(5, 12, "h264"), static_clip(5, 13), static_clip(5, 14, "h264"),
               busy_clip(2, 15))
TEST = (static_clip(5, 21), static_clip(5, 22, "h264"), static_clip(5, 23), static_clip(5, 24, "h264"),
        busy_clip(2, 25, "h264"))


def _noise_bank(spec: ClipSpec, rng: np.random.Generator) -> np.ndarray:
    return rng.normal(0, spec.noise, (8, spec.height, spec.width, 1)).astype(np.float32)


def render(images: np.ndarray, labels: np.ndarray, spec: ClipSpec) -> Iterator[tuple[np.ndarray, int]]:
    """(RGB frame, label of that moment) for every frame of the clip."""
    rng = np.random.default_rng(spec.seed)
    n_frames = int(spec.seconds * spec.fps)
    side = spec.height
    x0 = (spec.width - side) // 2
    noise = _noise_bank(spec, rng)

    def framed(i: int) -> np.ndarray:
        out = np.full((spec.height, spec.width, 3), 32, np.float32)
        out[:, x0 : x0 + side] = cv2.resize(images[i], (side, side), interpolation=cv2.INTER_LINEAR)
        return out

    current = int(rng.integers(len(images)))
    base, nxt = framed(current), None
    change_at = int(rng.uniform(*spec.hold_s) * spec.fps)
    fade = max(1, int(spec.fade_s * spec.fps))
    log_gain, passer = 0.0, None
    for t in range(n_frames):
        label = int(labels[current])
        picture = base
        if t >= change_at:  # the next state fades in; the label switches half way
            if nxt is None:
                nxt_index = int(rng.integers(len(images)))
                while labels[nxt_index] == labels[current] and len(set(labels.tolist())) > 1:
                    nxt_index = int(rng.integers(len(images)))
                nxt = (nxt_index, framed(nxt_index))
            a = min(1.0, (t - change_at + 1) / fade)
            picture = (1 - a) * base + a * nxt[1]
            label = int(labels[nxt[0]]) if a >= 0.5 else label
            if a >= 1.0:
                current, base = nxt
                nxt = None
                change_at = t + max(1, int(rng.uniform(*spec.hold_s) * spec.fps))
        log_gain = float(np.clip(log_gain + rng.normal(0, spec.drift / np.sqrt(spec.fps)), -0.3, 0.3))
        frame = picture * np.exp(log_gain) + noise[t % len(noise)]
        if passer is None and rng.random() < spec.passers_per_min / 60 / spec.fps:
            passer = (t, int(rng.uniform(1.5, 3.0) * spec.fps), rng.uniform(0.12, 0.22), bool(rng.random() < 0.5))
        if passer is not None:
            passer = _cross(frame, passer, t, spec)
        yield np.clip(frame, 0, 255).astype(np.uint8), label


def _cross(frame: np.ndarray, passer: tuple[int, int, float, bool], t: int, spec: ClipSpec
           ) -> tuple[int, int, float, bool] | None:
    """Draw a dark figure crossing the view; None once it has left."""
    start, frames, width, leftwards = passer
    k = (t - start) / frames
    if k > 1:
        return None
    w = int(width * spec.width)
    x = int((1 - k if leftwards else k) * (spec.width + w)) - w
    centre = (x + w // 2, int(0.55 * spec.height))
    mask = np.zeros(frame.shape[:2], np.float32)
    cv2.ellipse(mask, centre, (w // 2, int(0.42 * spec.height)), 0, 0, 360, 1.0, -1)
    cv2.circle(mask, (centre[0], int(0.12 * spec.height)), max(2, w // 3), 1.0, -1)
    frame *= 1 - 0.8 * mask[..., None]
    frame += (0.8 * 40) * mask[..., None]
    return passer


def clip_traces(rt: ModelRuntime, images: np.ndarray, labels: np.ndarray, specs: tuple[ClipSpec, ...]
                ) -> dict[str, np.ndarray]:
    """Every frame of every clip through its codec and the model: probs (N, n, C), labels, thumbs (N, 16, 16)
    (``models.video.thumbnail``), clip ids."""
    probs, labs, thumbs, clip = [], [], [], []
    t0 = time.perf_counter()
    for c, spec in enumerate(specs):
        pending: deque[int] = deque()  # the labels of the frames the codec has taken and not yet given back

        def frames(spec: ClipSpec = spec, pending: deque[int] = pending) -> Iterator[np.ndarray]:
            for rgb, label in render(images, labels, spec):
                pending.append(label)
                yield rgb

        for rgb in ROUNDTRIPS[spec.codec](frames(), spec.kbps, int(spec.fps)):  # one frame back per frame, in order
            label = pending.popleft()
            x = rt.preprocess(rgb)
            probs.append(rt.exits_of(x))
            labs.append(label)
            thumbs.append(thumbnail(x))
            clip.append(c)
        log.info("clip %d of %d (%s, %.0f s at %g fps) done (%.0f s so far)", c + 1, len(specs), spec.codec,
                 spec.seconds, spec.fps, time.perf_counter() - t0)
    return {"probs": np.stack(probs), "labels": np.asarray(labs, np.int16), "thumbs": np.stack(thumbs),
            "clip": np.asarray(clip, np.int16)}


def write_clip_traces(folder: Path, data: Path, calibration: tuple[ClipSpec, ...] = CALIBRATION,
                      test: tuple[ClipSpec, ...] = TEST) -> dict[str, TraceSpec]:
    """``traces_clips-calibration.npz`` and ``traces_clips-test.npz`` beside the model, from the demo data's
    calibration and test images, listed in its manifest."""
    rt = ModelRuntime.load(folder, providers=("cpu",), threads=0, warmup=1)
    written: dict[str, TraceSpec] = {}
    for name, split, specs in ((CLIPS_CALIBRATION, "calibration", calibration), (CLIPS_TEST, "test", test)):
        src, images, labels, _ = demo_split(data, split)
        arrays = clip_traces(rt, images, labels, specs)
        fps = {s.fps for s in specs}
        if len(fps) != 1:
            raise ValueError(f"one frame rate per trace file, got {sorted(fps)}")
        written[name] = save_clips(folder, name, arrays, rt.class_names, fps.pop(),
                                   [asdict(s) for s in specs] + [{"source": src.name}])
        log.info("wrote %s: %d frames, %.1f MB", written[name].file, len(arrays["labels"]),
                 (folder / written[name].file).stat().st_size / 1e6)
    list_traces(folder, written)
    return written
