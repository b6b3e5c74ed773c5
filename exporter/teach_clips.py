"""A taught model's exit 0, fitted from its own recordings (``models.video_fit`` reads what this writes).

The recordings are video already: each class's frames in time order, taken from the live stream (its codec's
artefacts, the camera's noise and light). ``write_recording_clips`` plays them as a fixed camera shows a scene
that changes state now and then: each class's frames in time order, cut in two halves, the first halves of every
class one after another, then the second halves in a rotated order, so every class is entered and left twice. A
jump inside a class (a pause between recordings, another recording of the same state) is a picture change that
does not change the state, as a passer-by is. Frames are timed at the recordings' own rate (from the frame ids'
times).

- ``clips-calibration``: the train and calibration blocks (exit 0's tables and the choice of lam and hold; the
  model knows these frames, so they say how a held state looks to exit 0 rather than how right the model is; the
  frame-level chain keeps its jittered calibration).
- ``clips-test``: the test blocks, held out by time: what the report shows as served.
- ``clips-check``: the check recordings, when there are any (captured apart, perhaps in other light).
"""

from __future__ import annotations

import itertools
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any, Protocol

import numpy as np

from models.folder import CLIPS_CALIBRATION, CLIPS_TEST, load_clips, save_clips
from models.manifest import TraceSpec, list_traces, read_manifest
from models.policies import DynamicIndex
from models.runtime import ModelRuntime
from models.video import thumbnail
from models.video_replay import notice, replay_index

CLIPS_CHECK = "clips-check"
DEFAULT_FPS = 10.0  # the page's recording rate, when the frame ids carry no times


class Frames(Protocol):
    @property
    def images(self) -> np.ndarray: ...  # (N, h, w, 3) uint8 as the runtime prepares them

    @property
    def labels(self) -> np.ndarray: ...

    @property
    def ids(self) -> list[str]: ...  # frame ids: "<ms since 1970, 13 digits>-<random>" (edge_app.teach.store)


def frame_ms(frame_id: str) -> float | None:
    head = frame_id.split("-", 1)[0]
    return float(head) if head.isdigit() and len(head) == 13 else None


def recording_fps(ids: Sequence[str], labels: np.ndarray) -> float:
    """The recordings' frame rate: the median gap between a class's consecutive frames (gaps over 1 s are pauses)."""
    gaps: list[float] = []
    for c in np.unique(labels):
        times = sorted(t for i in np.flatnonzero(labels == c) if (t := frame_ms(ids[int(i)])) is not None)
        gaps += [b - a for a, b in itertools.pairwise(times) if 0 < b - a <= 1000]
    return round(1000.0 / float(np.median(gaps)), 2) if gaps else DEFAULT_FPS


def play_order(ids: Sequence[str], labels: np.ndarray) -> np.ndarray:
    """Frame indices in the order the clip shows them (see the module's docstring)."""
    classes = [int(c) for c in np.unique(labels)]
    halves: dict[int, list[np.ndarray]] = {}
    for c in classes:
        mine = np.flatnonzero(labels == c)
        mine = mine[np.argsort([ids[int(i)] for i in mine], kind="stable")]  # ids sort by time
        halves[c] = np.array_split(mine, 2)
    rotated = classes[1:] + classes[:1]
    parts = [halves[c][0] for c in classes] + [halves[c][1] for c in rotated]
    return np.concatenate([p for p in parts if len(p)])


def recording_clip(rt: ModelRuntime, frames: Frames, order: np.ndarray) -> dict[str, np.ndarray]:
    """Every frame, in ``order``, through the exported model as the serve path runs it: every exit's softmax and
    exit 0's thumbnail of the model's input."""
    probs, thumbs = [], []
    for i in order:
        x = rt.preprocess(frames.images[i])
        probs.append(rt.exits_of(x))
        thumbs.append(thumbnail(x))
    return {"probs": np.stack(probs), "labels": np.asarray(frames.labels)[order], "thumbs": np.stack(thumbs),
            "clip": np.zeros(len(order), np.int16)}


def write_recording_clips(out: Path, splits: Mapping[str, Frames], threads: int = 0) -> dict[str, dict[str, Any]]:
    """Write the clips above beside the taught model ``out`` and list them in its manifest; returns per clip
    name: frames, fps, changes."""
    rt = ModelRuntime.load(out, providers=("cpu",), threads=threads, warmup=1)
    sources: dict[str, list[str]] = {CLIPS_CALIBRATION: ["train", "calibration"], CLIPS_TEST: ["test"],
                                     CLIPS_CHECK: ["check"]}
    written: dict[str, TraceSpec] = {}
    info: dict[str, dict[str, Any]] = {}
    for name, parts in sources.items():
        have = [splits[p] for p in parts if p in splits]
        if not have:
            continue
        merged = _Merged(have)
        fps = recording_fps(merged.ids, merged.labels)
        order = play_order(merged.ids, merged.labels)
        arrays = recording_clip(rt, merged, order)
        written[name] = save_clips(out, name, arrays, rt.class_names, fps,
                                   [{"source": "recordings", "splits": parts, "order": "halves, rotated"}])
        info[name] = {"frames": len(order), "fps": fps,
                      "changes": int(np.count_nonzero(np.diff(arrays["labels"])))}
    list_traces(out, written)
    return info


class _Merged:
    def __init__(self, splits: list[Frames]) -> None:
        self.images = np.concatenate([s.images for s in splits])
        self.labels = np.concatenate([s.labels for s in splits])
        self.ids = [i for s in splits for i in s.ids]


def served_on_clips(out: Path, policy: DynamicIndex, names: Sequence[str] = (CLIPS_TEST, CLIPS_CHECK)
                    ) -> dict[str, dict[str, Any]]:
    """What the policy as served (exit 0 included, smoothed as served) does on the held-out clips: every frame
    counted against the label of its moment, the share answered at exit 0, the cost as a share of full depth on
    every frame, and how many frames a change took to be noticed (p50 / p95)."""
    from models.video_fit import smoother_for

    manifest = read_manifest(out)
    costs = np.asarray(manifest.costs_ms, float) / float(sum(manifest.costs_ms))
    report: dict[str, dict[str, Any]] = {}
    for name in names:
        if name not in manifest.traces:
            continue
        clips = load_clips(out, manifest, name)
        run = replay_index(policy, clips, costs, smoother_for(manifest))
        delays, seen = notice(clips, run.served)
        exits = [int(np.count_nonzero(run.exit == k)) for k in range(clips.probs.shape[1] + 1)]
        report[name] = {"frames": len(clips.labels), "fps": clips.fps, "accuracy": round(run.accuracy, 4),
                        "exits_used": exits, "exit0_share": round(run.exit0_share, 4),
                        "cost_fraction": round(run.mean_cost, 4), "changes": len(delays),
                        "changes_noticed": int(seen.sum()),
                        "notice_frames_p50": None if not seen.any() else float(np.percentile(delays[seen], 50)),
                        "notice_frames_p95": None if not seen.any() else float(np.percentile(delays[seen], 95))}
    return report
