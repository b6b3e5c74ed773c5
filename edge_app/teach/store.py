"""Captured frames of a user's scene: datasets of classes of frames, on disk as ImageFolders.

    DATA_DIR/DATASET/CLASS/FRAME_ID.jpg    the frame as the source gave it (JPEG, quality 95)
    DATA_DIR/DATASET/frames.jsonl          one line per frame: id, class, source, unix time, size

Neighbouring frames of a video are near copies, so a frame-by-frame random split would test on frames the model
trained on. ``split`` cuts each class's frames, in time order, into contiguous blocks of ``block_s`` seconds (a
new block also starts after any pause in capture) and deals the blocks out: of every seven, five train, one
calibrates (the policy and the traces) and one tests. Those held-out blocks come from the same recordings as the
training blocks, so they measure memory more than the scene. A frame's ``role`` overrides the deal: ``check``
frames (a check recording, captured apart: other times, other light) are never trained or calibrated on and give
the figure to trust; ``train`` frames (a check's wrong frames, added by the user) always train. ``materialize``
writes train/ calibration/ test/ check/ ImageFolders for the exporter. Frames of one recording share its id, so a
recording can be labelled in spans (``label_span``). Nothing here imports torch.
"""

from __future__ import annotations

import contextlib
import json
import shutil
import threading
import time
import uuid
from collections.abc import Callable
from dataclasses import asdict, replace
from pathlib import Path

import cv2
import numpy as np

from edge_app.teach.frames import DEAL, NAME, SPLITS, DatasetError, Frame, check_name, check_role, locked


class DatasetStore:
    """All datasets under ``root``; thread-safe (frames are written from media threads) and process-safe
    (``serve --workers``: a camera's worker captures its frames), each dataset's index under ``locked``."""

    def __init__(self, root: Path, block_s: float = 2.0) -> None:
        self.root = root
        self.block_s = block_s
        self._lock = threading.Lock()

    def _locked(self, dataset: str) -> contextlib.AbstractContextManager[None]:
        return locked(self._lock, self._dir(dataset))

    # --- datasets and classes ------------------------------------------------------------------------------

    def datasets(self) -> list[str]:
        if not self.root.is_dir():
            return []
        return sorted(p.name for p in self.root.iterdir() if p.is_dir() and NAME.match(p.name))

    def create(self, dataset: str) -> None:
        (self.root / check_name("dataset", dataset)).mkdir(parents=True, exist_ok=True)

    def _dir(self, dataset: str) -> Path:
        d = self.root / check_name("dataset", dataset)
        if not d.is_dir():
            raise DatasetError(f"no dataset {dataset!r}; create it first (POST /api/datasets)", 404)
        return d

    def classes(self, dataset: str) -> list[str]:
        d = self._dir(dataset)
        return sorted(p.name for p in d.iterdir() if p.is_dir() and NAME.match(p.name))

    def add_class(self, dataset: str, cls: str) -> None:
        (self._dir(dataset) / check_name("class", cls)).mkdir(exist_ok=True)

    def delete_class(self, dataset: str, cls: str) -> int:
        self.class_dir(dataset, cls)
        with self._locked(dataset):
            frames = self._frames(dataset)
            kept = [f for f in frames if f.cls != cls]
            self._write_index(dataset, kept)
            shutil.rmtree(self._dir(dataset) / cls)
        return len(frames) - len(kept)

    def class_dir(self, dataset: str, cls: str) -> Path:
        d = self._dir(dataset) / check_name("class", cls)
        if not d.is_dir():
            raise DatasetError(f"dataset {dataset!r} has no class {cls!r}; its classes: {self.classes(dataset)}", 404)
        return d

    # --- frames --------------------------------------------------------------------------------------------

    def add_frame(self, dataset: str, cls: str, rgb: np.ndarray, source: str, t: float | None = None,
                  role: str = "auto", recording: str | None = None,
                  region: tuple[float, float, float, float] | None = None) -> Frame:
        """Store one (H, W, 3) uint8 RGB frame in ``cls``."""
        folder = self.class_dir(dataset, cls)
        check_role(role)
        t = time.time() if t is None else t
        frame = Frame(f"{int(t * 1000):013d}-{uuid.uuid4().hex[:6]}", cls, source, round(t, 3),
                      int(rgb.shape[1]), int(rgb.shape[0]), role, recording, region)
        ok, jpeg = cv2.imencode(".jpg", cv2.cvtColor(rgb, cv2.COLOR_RGB2BGR), [cv2.IMWRITE_JPEG_QUALITY, 95])
        if not ok:
            raise DatasetError("could not encode the frame as JPEG", 500)
        tmp = folder / f".{frame.id}.jpg"
        tmp.write_bytes(jpeg.tobytes())
        tmp.replace(folder / f"{frame.id}.jpg")
        with self._locked(dataset), (self._dir(dataset) / "frames.jsonl").open("a") as f:
            f.write(json.dumps(asdict(frame)) + "\n")
        return frame

    def frames(self, dataset: str) -> list[Frame]:
        with self._locked(dataset):
            return self._frames(dataset)

    def _frames(self, dataset: str) -> list[Frame]:
        index = self._dir(dataset) / "frames.jsonl"
        if not index.is_file():
            return []
        out = []
        for line in index.read_text().splitlines():
            if line.strip():
                d = json.loads(line)
                if d.get("region") is not None:
                    d["region"] = tuple(d["region"])
                f = Frame(**d)
                if (self.root / dataset / f.cls / f"{f.id}.jpg").is_file():
                    out.append(f)
        return out

    def _write_index(self, dataset: str, frames: list[Frame]) -> None:
        index = self._dir(dataset) / "frames.jsonl"
        tmp = index.with_suffix(".tmp")
        tmp.write_text("".join(json.dumps(asdict(f)) + "\n" for f in frames))
        tmp.replace(index)

    def frame_path(self, dataset: str, frame_id: str) -> Path:
        for f in self.frames(dataset):
            if f.id == frame_id:
                return self.root / dataset / f.cls / f"{f.id}.jpg"
        raise DatasetError(f"dataset {dataset!r} has no frame {frame_id!r}", 404)

    def delete_frame(self, dataset: str, frame_id: str) -> None:
        path = self.frame_path(dataset, frame_id)
        with self._locked(dataset):
            path.unlink(missing_ok=True)
            self._write_index(dataset, self._frames(dataset))

    def _update(self, dataset: str, frame_ids: list[str], change: Callable[[Frame], Frame]) -> list[Frame]:
        """Apply ``change`` to the named frames (moving their files when the class changes); all or nothing."""
        if not isinstance(frame_ids, list) or not all(isinstance(i, str) for i in frame_ids):
            raise DatasetError("'frames' must be a list of frame ids")
        root = self._dir(dataset)
        with self._locked(dataset):
            frames = self._frames(dataset)
            by_id = {f.id: f for f in frames}
            unknown = [i for i in frame_ids if i not in by_id]
            if unknown:
                raise DatasetError(f"dataset {dataset!r} has no frame(s) {unknown[:5]}", 404)
            wanted = set(frame_ids)
            changed = []
            for k, f in enumerate(frames):
                if f.id in wanted:
                    new = change(f)
                    if new.cls != f.cls:
                        (root / f.cls / f"{f.id}.jpg").replace(root / new.cls / f"{f.id}.jpg")
                    frames[k] = new
                    changed.append(new)
            self._write_index(dataset, frames)
        return changed

    def set_role(self, dataset: str, frame_ids: list[str], role: str) -> list[Frame]:
        """Mark frames as ``check`` (never trained on), ``train`` (always trained on) or ``auto`` (dealt out)."""
        check_role(role)
        return self._update(dataset, frame_ids, lambda f: replace(f, role=role))

    def add_to_training(self, dataset: str, frame_ids: list[str]) -> list[Frame]:
        """Check frames (the ones the model got wrong) go to training, with as many check frames of every other
        class, the ones captured nearest in time (the same conditions): wrong frames are mostly of one class in
        one condition, and adding only them teaches "dark means cat", which turns the right answers wrong."""
        frames = self.frames(dataset)
        by_id = {f.id: f for f in frames}
        picked = [by_id[i] for i in frame_ids if i in by_id]
        if not picked:
            return self.set_role(dataset, frame_ids, "train")  # the 404 naming the unknown ids
        wanted = {f.id for f in picked}
        per_class = {c: sum(1 for f in picked if f.cls == c) for c in self.classes(dataset)}
        most = max(per_class.values())
        when = float(np.median([f.t for f in picked]))
        for cls, have in per_class.items():
            spare = sorted((f for f in frames if f.cls == cls and f.role == "check" and f.id not in wanted),
                           key=lambda f: abs(f.t - when))
            wanted.update(f.id for f in spare[: most - have])
        return self.set_role(dataset, sorted(wanted | set(frame_ids)), "train")

    def relabel(self, dataset: str, frame_ids: list[str], cls: str) -> list[Frame]:
        """Move frames to class ``cls`` (the same dataset)."""
        self.class_dir(dataset, cls)
        return self._update(dataset, frame_ids, lambda f: replace(f, cls=cls))

    def label_span(self, dataset: str, recording: str, start_t: float, end_t: float, cls: str) -> list[Frame]:
        """The frames of ``recording`` captured from ``start_t`` to ``end_t`` (unix seconds, inclusive) go to
        ``cls``: "this part was the gate open, that part closed"."""
        if not isinstance(recording, str):
            raise DatasetError("'recording' is required: a recording id (GET /api/datasets/{ds})")
        if end_t < start_t:
            raise DatasetError(f"the span ends ({end_t}) before it starts ({start_t})")
        mine = [f for f in self.frames(dataset) if f.recording == recording]
        if not mine:
            raise DatasetError(f"dataset {dataset!r} has no recording {recording!r}", 404)
        span = [f.id for f in mine if start_t <= f.t <= end_t]
        if not span:
            raise DatasetError(f"recording {recording!r} has no frame between {start_t} and {end_t} (it runs from "
                               f"{min(f.t for f in mine)} to {max(f.t for f in mine)})")
        return self.relabel(dataset, span, cls)

    def recordings(self, frames: list[Frame]) -> list[dict[str, object]]:
        """Each recording: id, role, its frames in time order (id, t, class), for labelling in spans."""
        out: dict[str, list[Frame]] = {}
        for f in sorted(frames, key=lambda f: f.t):
            if f.recording is not None:
                out.setdefault(f.recording, []).append(f)
        return [{"id": rid, "role": mine[0].role, "start_unix": mine[0].t, "end_unix": mine[-1].t,
                 "source": mine[0].source, "classes": sorted({f.cls for f in mine}),
                 "frames": [{"id": f.id, "t": f.t, "class": f.cls} for f in mine]} for rid, mine in out.items()]

    def summary(self, dataset: str, recent: int = 12) -> dict[str, object]:
        """Classes with their counts and latest frame ids (thumbnails), how the split would deal them, and the
        recordings (for labelling in spans)."""
        frames = self.frames(dataset)
        splits = self.split(frames)
        classes = []
        for cls in self.classes(dataset):
            mine = sorted((f for f in frames if f.cls == cls), key=lambda f: f.t)
            counts = {s: sum(1 for f in mine if splits[f.id] == s) for s in SPLITS}
            classes.append({"name": cls, "frames": len(mine), "split": counts,
                            "sources": sorted({f.source for f in mine}),
                            "recent": [f.id for f in mine if f.role != "check"][-recent:],
                            "check_recent": [f.id for f in mine if f.role == "check"][-recent:]})
        unchecked = [c["name"] for c in classes if not c["split"]["check"]]  # type: ignore[index]
        recordings = self.recordings(frames)
        return {"name": dataset, "block_s": self.block_s, "classes": classes, "recordings": recordings[-recent:],
                "recordings_total": len(recordings),
                "check": {"frames": sum(c["split"]["check"] for c in classes),  # type: ignore[index]
                          "classes_without": unchecked}}

    # --- the split -----------------------------------------------------------------------------------------

    def split(self, frames: list[Frame]) -> dict[str, str]:
        """Frame id -> "train" / "calibration" / "test" / "check": a frame's role when it has one, else per class,
        contiguous time blocks dealt out (see above)."""
        out: dict[str, str] = {f.id: f.role for f in frames if f.role != "auto"}
        dealt = [f for f in frames if f.role == "auto"]
        for cls in sorted({f.cls for f in dealt}):
            mine = sorted((f for f in dealt if f.cls == cls), key=lambda f: f.t)
            block, start, last = 0, None, None
            for f in mine:
                if start is None:
                    start = f.t
                elif f.t - start >= self.block_s or (last is not None and f.t - last > 1.0):
                    block, start = block + 1, f.t
                last = f.t
                out[f.id] = DEAL[block % len(DEAL)]
        return out

    def check_trainable(self, dataset: str, min_frames: int) -> dict[str, dict[str, int]]:
        """Per class, frames per split; raises ``DatasetError`` (400) naming what is missing."""
        classes = self.classes(dataset)
        frames = self.frames(dataset)
        splits = self.split(frames)
        if len(classes) < 2:
            raise DatasetError(f"dataset {dataset!r} has {len(classes)} class(es); a model needs at least two")
        counts: dict[str, dict[str, int]] = {}
        for cls in classes:
            mine = [f for f in frames if f.cls == cls and f.role != "check"]
            c = counts[cls] = {s: sum(1 for f in frames if f.cls == cls and splits[f.id] == s) for s in SPLITS}
            if not mine:
                raise DatasetError(f"class {cls!r} is empty: capture frames into it, or delete it")
            if len(mine) < min_frames:
                raise DatasetError(f"class {cls!r} has {len(mine)} frames to train on (check frames not counted); at "
                                   f"least {min_frames} are needed ([training] min_frames_per_class)")
            if min(c[s] for s in SPLITS if s != "check") == 0:
                raise DatasetError(f"class {cls!r}: too few frames for the split ({c}); the frames are dealt out "
                                   f"in {self.block_s:g} s blocks (5 train, 1 calibration, 1 test of every 7): "
                                   f"record at least {7 * self.block_s:g} s of it")
        return counts

    def materialize(self, dataset: str, out: Path) -> dict[str, dict[str, int]]:
        """Write train/ calibration/ test/ ImageFolders (hard links where possible) under ``out``."""
        frames = self.frames(dataset)
        splits = self.split(frames)
        if out.exists():
            shutil.rmtree(out)
        for s in SPLITS:
            for cls in self.classes(dataset):
                (out / s / cls).mkdir(parents=True, exist_ok=True)
        for f in frames:
            src = self.root / dataset / f.cls / f"{f.id}.jpg"
            dst = out / splits[f.id] / f.cls / f"{f.id}.jpg"
            try:
                dst.hardlink_to(src)
            except OSError:
                shutil.copyfile(src, dst)
        return {s: {c: sum(1 for f in frames if f.cls == c and splits[f.id] == s) for c in self.classes(dataset)}
                for s in SPLITS}

