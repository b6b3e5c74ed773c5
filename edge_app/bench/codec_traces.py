"""Softmax traces of VP8-coded frames: what the exits see on the live path, for fitting and evaluating policies.

The export's traces come from the data set's own pixels.  The live server
analyses frames a browser encoded with VP8 and aiortc decoded, and coding costs
the early exits more accuracy than the final one, so a policy fitted on clean
traces stops too early on live video.  ``codec_traces`` plays a split's images
as the test camera shows them (``edge_app.bench.testvideo.LabelledVideo``: each image
scaled to the frame height, 480 px by default, and centred in a 4:3 frame, held
``hold`` frames), sends
the video through ``edge_app.bench.codec.vp8_roundtrip`` at ``kbps``, and records
every exit's softmax, through the runtime's own preprocessing, on one decoded
frame per image (a seeded random one of its ``hold``: the analyser takes
whichever frame is newest, so any of them).
"""

from __future__ import annotations

import json
import logging
import time
from pathlib import Path

import numpy as np

from edge_app.bench.codec import vp8_roundtrip
from edge_app.bench.testvideo import LabelledVideo
from models.folder import CODEC_SUFFIX
from models.manifest import TraceSpec, list_traces, trace_spec
from models.runtime import ModelRuntime

log = logging.getLogger(__name__)


def codec_traces(rt: ModelRuntime, images: np.ndarray, labels: np.ndarray, kbps: float, hold: int = 3,
                 seed: int = 0, progress_every: int = 500, height: int = 480) -> np.ndarray:
    """(N, exits, classes) softmax of every exit on one VP8-coded frame of each image."""
    pick = np.random.default_rng(seed).integers(0, hold, len(images))
    probs = np.empty((len(images), rt.num_exits, len(rt.class_names)), np.float32)
    chunk = 1000  # images per encoded stream (the stamp counts to 2**BITS frames)
    t0 = time.perf_counter()
    for start in range(0, len(images), chunk):
        part = slice(start, min(start + chunk, len(images)))
        video = LabelledVideo(images[part], labels[part], hold=hold, width=height * 4 // 3, height=height)
        for j, rgb in enumerate(vp8_roundtrip(video.frames(), kbps)):
            i, offset = start + j // hold, j % hold
            if offset != pick[i]:
                continue
            probs[i] = rt.all_exits(rgb)
            if (i + 1) % progress_every == 0:
                log.info("%d of %d images coded and analysed (%.0f s)", i + 1, len(images),
                         time.perf_counter() - t0)
    return probs


def demo_split(data: Path, split: str) -> tuple[Path, np.ndarray, np.ndarray, list[str]]:
    """(file, images, labels, class names) of a demo data split (``python -m exporter data``), or
    ``FileNotFoundError`` saying how to build it."""
    src = data / f"{split}.npz"
    if not src.is_file():
        raise FileNotFoundError(f"{src} is missing: build the demo data with 'python -m exporter data --out {data}'")
    with np.load(src) as z:
        return src, z["images"], z["labels"], [str(c) for c in z["class_names"]]


def write_codec_traces(folder: Path, data: Path, kbps: float, hold: int = 3, seed: int = 0,
                       splits: tuple[str, ...] = ("calibration", "test"), height: int = 480) -> dict[str, TraceSpec]:
    """Write ``traces_<split>-vp8.npz`` beside the model for each split and list them in its manifest."""
    rt = ModelRuntime.load(folder, providers=("cpu",), threads=0, warmup=1)
    written: dict[str, TraceSpec] = {}
    for split in splits:
        src, images, labels, _ = demo_split(data, split)
        log.info("%s: %d images through VP8 at %g kbps, %dp, %d frames each", split, len(images), kbps, height, hold)
        probs = codec_traces(rt, images, labels, kbps, hold, seed, height=height)
        name = split + CODEC_SUFFIX
        path = folder / f"traces_{name}.npz"
        np.savez_compressed(path, probs=probs, labels=labels, class_names=np.asarray(rt.class_names),
                            codec=json.dumps({"codec": "vp8", "kbps": kbps, "hold": hold, "seed": seed,
                                              "height": height, "source": src.name}))
        written[name] = trace_spec(path, len(labels))
        acc = (probs.argmax(-1) == labels[:, None]).mean(axis=0)
        log.info("wrote %s: per-exit accuracy %s", path, " / ".join(f"{a:.4f}" for a in acc))
    list_traces(folder, written)
    return written
