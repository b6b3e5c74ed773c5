"""Capture frames of a live source into a class: one snapshot, or N frames a second for S seconds.

A source is ``camera:NAME`` (a configured camera) or ``session:ID`` (a browser's own camera, while its session
is open). Frames are taken from the source's analysis as it decodes them (before anything is drawn on them), as
the model sees them (the camera's region, when it has one), copied, and written to the dataset store in a media
thread; the analysis itself is not slowed. A recording keeps to the rate asked for on average (10 fps from a
15 fps camera is two frames of every three, not every other one), and ``role`` "check" makes it a check
recording, which training never sees.
"""

from __future__ import annotations

import asyncio
import itertools
import os
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

import numpy as np

from edge_app.pipeline import AnalysisPipeline
from edge_app.teach.frames import DatasetError, check_role
from edge_app.teach.store import DatasetStore
from models.preprocess import Region
from streams.tasks import cancel_and_wait

Resolve = Callable[[str], AnalysisPipeline]


class Pace:
    """Takes frames at ``fps`` on average from a source at any rate: a frame is taken once its due time has come
    (less a quarter interval of jitter), and the next is due one interval after the last due time; after a gap
    the schedule restarts rather than taking a burst."""

    def __init__(self, fps: float) -> None:
        self.interval_s = 1.0 / fps
        self.due_s: float | None = None

    def take(self, now_s: float) -> bool:
        if self.due_s is None or now_s - self.due_s > self.interval_s:
            self.due_s = now_s + self.interval_s
            return True
        if now_s + 0.25 * self.interval_s < self.due_s:
            return False
        self.due_s += self.interval_s
        return True


@dataclass
class Recording:
    id: int
    dataset: str
    cls: str
    source: str
    fps: float
    seconds: float
    role: str = "auto"
    key: str = ""  # the id its frames carry in the store (unique across restarts)
    started_s: float = field(default_factory=time.monotonic)
    saved: int = 0
    failed: int = 0
    state: str = "recording"  # recording, done, failed
    error: str | None = None
    frame_ids: list[str] = field(default_factory=list)

    def status(self) -> dict[str, Any]:
        return {"id": self.id, "recording": self.key, "dataset": self.dataset, "class": self.cls,
                "source": self.source, "fps": self.fps, "seconds": self.seconds, "role": self.role,
                "saved": self.saved, "state": self.state, "error": self.error,
                "elapsed_s": round(time.monotonic() - self.started_s, 1), "frames": self.frame_ids[-200:]}


class Recorder:
    def __init__(self, store: DatasetStore, resolve: Resolve, max_seconds: float) -> None:
        self.store, self.resolve, self.max_seconds = store, resolve, max_seconds
        self.recordings: dict[int, Recording] = {}
        self._ids = itertools.count(1)
        self._tasks: set[asyncio.Task[None]] = set()

    async def record(self, dataset: str, cls: str, source: str, seconds: float = 0.0, fps: float = 10.0,
                     wait: bool = False, role: str = "auto") -> Recording:
        """``seconds`` 0: one snapshot (waited for). Else a recording in the background (``wait``: until done)."""
        self.store.classes(dataset)
        self.store.class_dir(dataset, cls)  # a 404 naming the classes when it is not there
        if not 0 <= seconds <= self.max_seconds:
            raise DatasetError(f"seconds must be between 0 and {self.max_seconds:g} ([training] max_record_s)")
        if not 0.1 <= fps <= 30:
            raise DatasetError("fps must be between 0.1 and 30")
        check_role(role)
        pipe = self.resolve(source)
        number = next(self._ids)
        # the key is unique across restarts and across the processes of serve --workers, which share the store
        rec = Recording(number, dataset, cls, source, fps, seconds, role, f"{int(time.time())}-{os.getpid()}-{number}")
        self.recordings[rec.id] = rec
        task = asyncio.create_task(self._run(rec, pipe), name=f"record-{rec.id}")
        self._tasks.add(task)
        task.add_done_callback(self._tasks.discard)
        if wait or seconds == 0:
            await task
        return rec

    async def _run(self, rec: Recording, pipe: AnalysisPipeline) -> None:
        pending: list[asyncio.Future[Any]] = []
        snapshot = rec.seconds == 0
        got_one = asyncio.Event()
        pace = Pace(rec.fps)

        def tap(seq: int, rgb: np.ndarray) -> None:
            if (snapshot and got_one.is_set()) or not pace.take(time.monotonic()):
                return
            got_one.set()
            frame = rgb.copy()
            pending.append(pipe.run_media(self._save, rec, frame, pipe.region))

        pipe.add_tap(tap)
        try:
            if snapshot:
                await asyncio.wait_for(got_one.wait(), 5.0)
            else:
                await asyncio.sleep(rec.seconds)
        except TimeoutError:
            rec.state, rec.error = "failed", f"no frame from {rec.source} for 5 s (is it streaming?)"
        finally:
            pipe.remove_tap(tap)
        await asyncio.gather(*pending, return_exceptions=True)
        if rec.state == "recording":
            rec.state = "done" if rec.saved else "failed"
            rec.error = None if rec.saved else f"no frame arrived from {rec.source}"

    def _save(self, rec: Recording, rgb: np.ndarray, region: Region | None) -> None:
        try:
            frame = self.store.add_frame(rec.dataset, rec.cls, rgb, rec.source, role=rec.role,
                                         recording=None if rec.seconds == 0 else rec.key, region=region)
        except (DatasetError, OSError) as exc:
            rec.failed += 1
            rec.error = str(exc)
            return
        rec.saved += 1
        rec.frame_ids.append(frame.id)

    def get(self, rec_id: int) -> Recording:
        if rec_id not in self.recordings:
            raise DatasetError(f"no recording {rec_id}", 404)
        return self.recordings[rec_id]

    async def stop(self) -> None:
        await cancel_and_wait(*self._tasks)
