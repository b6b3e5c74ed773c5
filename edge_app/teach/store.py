"""Captured frames of a user's scene: datasets of classes of frames, on disk as ImageFolders.

    DATA_DIR/DATASET/CLASS/FRAME_ID.jpg    the frame as the source gave it (JPEG, quality 95)
    DATA_DIR/DATASET/frames.jsonl          one line per frame: id, class, source, unix time, size

Neighbouring frames of a video are near copies, so a frame-by-frame random split would test on frames the model
trained on. ``split`` cuts each class's frames, in time order, into contiguous blocks of ``block_s`` seconds (a
new block also starts after any pause in capture) and deals the blocks out: of every seven, five train, one
calibrates (the policy and the traces) and one tests; ``materialize`` writes that as train/ calibration/ test/
ImageFolders for the exporter. Nothing here imports torch.
"""

from __future__ import annotations

import json
import re
import shutil
import threading
import time
import uuid
from dataclasses import asdict, dataclass
from pathlib import Path

import cv2
import numpy as np

from edge_app.errors import EdgeAppError

NAME = re.compile(r"^[A-Za-z0-9][A-Za-z0-9 _.-]{0,63}$")
SPLITS = ("train", "calibration", "test")
DEAL = ("train", "train", "calibration", "train", "train", "test", "train")  # of every 7 blocks: 5 / 1 / 1


class DatasetError(EdgeAppError, ValueError):
    """A request the store refuses; ``status`` is the HTTP status to answer with."""

    def __init__(self, reason: str, status: int = 400) -> None:
        super().__init__(reason)
        self.reason = reason
        self.status = status


@dataclass(frozen=True)
class Frame:
    id: str
    cls: str
    source: str
    t: float  # unix seconds
    width: int
    height: int


def check_name(kind: str, name: str) -> str:
    if not isinstance(name, str) or not NAME.match(name) or name in (".", ".."):
        raise DatasetError(f"{kind} name {name!r}: use 1-64 letters, digits, spaces, '_', '-' or '.', starting with "
                           "a letter or digit")
    return name


class DatasetStore:
    """All datasets under ``root``; thread-safe (frames are written from media threads)."""

    def __init__(self, root: Path, block_s: float = 2.0) -> None:
        self.root = root
        self.block_s = block_s
        self._lock = threading.Lock()

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
        with self._lock:
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

    def add_frame(self, dataset: str, cls: str, rgb: np.ndarray, source: str, t: float | None = None) -> Frame:
        """Store one (H, W, 3) uint8 RGB frame in ``cls``."""
        folder = self.class_dir(dataset, cls)
        t = time.time() if t is None else t
        frame = Frame(f"{int(t * 1000):013d}-{uuid.uuid4().hex[:6]}", cls, source, round(t, 3),
                      int(rgb.shape[1]), int(rgb.shape[0]))
        ok, jpeg = cv2.imencode(".jpg", cv2.cvtColor(rgb, cv2.COLOR_RGB2BGR), [cv2.IMWRITE_JPEG_QUALITY, 95])
        if not ok:
            raise DatasetError("could not encode the frame as JPEG", 500)
        tmp = folder / f".{frame.id}.jpg"
        tmp.write_bytes(jpeg.tobytes())
        tmp.replace(folder / f"{frame.id}.jpg")
        with self._lock, (self._dir(dataset) / "frames.jsonl").open("a") as f:
            f.write(json.dumps(asdict(frame)) + "\n")
        return frame

    def frames(self, dataset: str) -> list[Frame]:
        with self._lock:
            return self._frames(dataset)

    def _frames(self, dataset: str) -> list[Frame]:
        index = self._dir(dataset) / "frames.jsonl"
        if not index.is_file():
            return []
        out = []
        for line in index.read_text().splitlines():
            if line.strip():
                f = Frame(**json.loads(line))
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
        with self._lock:
            path.unlink(missing_ok=True)
            self._write_index(dataset, self._frames(dataset))

    def summary(self, dataset: str, recent: int = 12) -> dict[str, object]:
        """Classes with their counts and latest frame ids (thumbnails), and how the split would deal them."""
        frames = self.frames(dataset)
        splits = self.split(frames)
        out: dict[str, object] = {"name": dataset, "block_s": self.block_s, "classes": []}
        for cls in self.classes(dataset):
            mine = sorted((f for f in frames if f.cls == cls), key=lambda f: f.t)
            counts = {s: sum(1 for f in mine if splits[f.id] == s) for s in SPLITS}
            out["classes"].append({"name": cls, "frames": len(mine), "split": counts,  # type: ignore[attr-defined]
                                   "sources": sorted({f.source for f in mine}),
                                   "recent": [f.id for f in mine[-recent:]]})
        return out

    # --- the split -----------------------------------------------------------------------------------------

    def split(self, frames: list[Frame]) -> dict[str, str]:
        """Frame id -> "train" / "calibration" / "test": per class, contiguous time blocks dealt out (see above)."""
        out: dict[str, str] = {}
        for cls in sorted({f.cls for f in frames}):
            mine = sorted((f for f in frames if f.cls == cls), key=lambda f: f.t)
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
            mine = [f for f in frames if f.cls == cls]
            c = counts[cls] = {s: sum(1 for f in mine if splits[f.id] == s) for s in SPLITS}
            if not mine:
                raise DatasetError(f"class {cls!r} is empty: capture frames into it, or delete it")
            if len(mine) < min_frames:
                raise DatasetError(f"class {cls!r} has {len(mine)} frames; at least {min_frames} are needed "
                                   "([training] min_frames_per_class)")
            if min(c.values()) == 0:
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
