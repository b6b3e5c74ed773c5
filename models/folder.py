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
from models.manifest import Manifest, verify_file
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
