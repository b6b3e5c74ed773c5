"""Model-folder I/O beyond the manifest: calibration and test traces, and the fitted policy's header.

A model on disk is a folder: three ONNX segments, ``manifest.json`` (``models.manifest``), softmax traces of
calibration and test frames (``traces_*.npz``, checksummed in the manifest) and ``policy.json``
(``models.fit``).  Everything here reads a file once per call and fails loudly, naming the file and what to do:
nothing falls back to a default when a file is missing or damaged.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import numpy as np

from models.errors import ModelFolderError, PolicyError
from models.manifest import Manifest, TraceSpec, trace_spec, verify_file
from models.video import Clips

POLICY_FILE = "policy.json"
TRACE_KINDS = ("auto", "clean", "vp8")
CODEC_SUFFIX = "-vp8"  # manifest trace names of VP8-coded frames: "calibration-vp8", "test-vp8"
CLIPS_CALIBRATION, CLIPS_TEST = "clips-calibration", "clips-test"  # labelled video in time order (exit 0)


def load_traces(folder: Path, manifest: Manifest, split: str) -> tuple[np.ndarray, np.ndarray]:
    """(probs (frames, exits, classes) float64, labels) of the trace file the manifest names ``split``."""
    if split not in manifest.traces:
        raise ModelFolderError(f"{folder}: the manifest lists no {split!r} traces (it has {sorted(manifest.traces)})")
    spec = manifest.traces[split]
    path = verify_file(folder, spec.file, spec.sha256)
    try:
        with np.load(path) as z:
            return z["probs"].astype(np.float64), z["labels"]
    except (OSError, KeyError, ValueError) as exc:
        raise ModelFolderError(f"{path}: not a trace file with probs and labels ({exc}); re-export the model") from exc


THUMB_SCALE = 40.0  # thumbnails are stored as uint8: value * THUMB_SCALE + 128 (the input's units, 1/40 steps), as
# differences from the frame before (int16; the first from 0), which compress to two thirds on video


def save_clips(folder: Path, name: str, arrays: dict[str, np.ndarray], class_names: list[str], fps: float,
               specs: list[dict[str, Any]]) -> TraceSpec:
    """Write ``traces_{name}.npz`` beside the model (``load_clips`` reads it) from ``arrays``: probs (N, n, C),
    labels (N,), thumbs (N, 16, 16) float32 (``models.video.thumbnail``), clip (N,); ``specs`` say how the clips
    were made. Returns its manifest entry (the caller lists it: ``models.manifest.list_traces``)."""
    thumbs = np.clip(np.round(arrays["thumbs"] * THUMB_SCALE + 128), 0, 255).astype(np.int16)
    path = folder / f"traces_{name}.npz"
    np.savez_compressed(path, probs=arrays["probs"].astype(np.float16), labels=arrays["labels"].astype(np.int16),
                        clip=arrays["clip"].astype(np.int16),
                        thumb_deltas=np.diff(thumbs, axis=0, prepend=np.zeros((1, *thumbs.shape[1:]), np.int16)),
                        class_names=np.asarray(class_names), fps=np.float32(fps),
                        thumb_scale=np.float32(THUMB_SCALE), specs=json.dumps(specs))
    return trace_spec(path, len(arrays["labels"]))


def load_clips(folder: Path, manifest: Manifest, name: str) -> Clips:
    """The labelled video the manifest names ``name`` (``edge_app.bench.clips`` writes it): every frame's softmax
    at every exit, its label, exit 0's thumbnail of it, its clip."""
    if name not in manifest.traces:
        raise ModelFolderError(f"{folder}: the manifest lists no {name!r} clips (it has {sorted(manifest.traces)}); "
                               f"make them with 'edge-app clip-traces --model {folder}'")
    spec = manifest.traces[name]
    path = verify_file(folder, spec.file, spec.sha256)
    try:
        with np.load(path) as z:
            scale = float(z["thumb_scale"])
            thumbs = np.cumsum(z["thumb_deltas"], axis=0, dtype=np.int16)  # stored frame to frame
            return Clips(z["probs"].astype(np.float64), z["labels"].astype(int),
                         (thumbs.astype(np.float32) - 128) / scale, z["clip"].astype(int), float(z["fps"]))
    except (OSError, KeyError, ValueError) as exc:
        raise ModelFolderError(f"{path}: not a clip trace file ({exc}); make it again with 'edge-app "
                               "clip-traces'") from exc


def trace_names(manifest: Manifest, kind: str = "auto") -> tuple[str, str]:
    """(calibration, test) trace names for ``kind``: "clean" (the data set's pixels), "vp8" (the frames after a
    VP8 round trip, ``edge-app codec-traces``), or "auto": vp8 when the model folder has them, else clean."""
    if kind not in TRACE_KINDS:
        raise ValueError(f"trace kind must be one of {TRACE_KINDS}, got {kind!r}")
    coded = ("calibration" + CODEC_SUFFIX, "test" + CODEC_SUFFIX)
    if kind == "vp8" or (kind == "auto" and all(n in manifest.traces for n in coded)):
        missing = [n for n in coded if n not in manifest.traces]
        if missing:
            raise ModelFolderError(f"the model's manifest lists no {' or '.join(missing)} traces: write them with "
                                   "'edge-app codec-traces'")
        return coded
    return "calibration", "test"


def policy_meta(folder: Path) -> dict[str, Any]:
    """The header of ``folder/policy.json``: lam, loss_kind, calibration_traces, ... (the tables are read by
    ``models.fit.load_policy``).  Raises ``PolicyError`` when the file is missing or not a policy table."""
    path = folder / POLICY_FILE
    if not path.is_file():
        raise PolicyError(f"{path} is missing: fit it with 'edge-app fit-policy --model {folder}'")
    try:
        data = json.loads(path.read_text())
    except (OSError, UnicodeDecodeError, json.JSONDecodeError) as exc:
        raise PolicyError(f"{path} cannot be read as JSON ({exc}); refit with 'edge-app fit-policy'") from exc
    if not isinstance(data, dict) or data.get("kind") != "dynamic-index":
        raise PolicyError(f"{path} is not a dynamic-index policy table; refit with 'edge-app fit-policy'")
    meta = {k: v for k, v in data.items() if not isinstance(v, list)}
    meta.setdefault("loss_kind", "error")  # the tables' own field since the first format; absent = "error"
    meta.setdefault("calibration_traces", "calibration")
    return meta
