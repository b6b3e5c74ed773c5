"""Shadow runs: before deploy, a candidate model answers a live source next to the model in use, and the page
shows where they disagree.

The candidate is loaded as its own runtime (CPU, one thread, in a worker thread: never the served inference
service). Up to ``fps`` frames a second are taken from the source's analysis as the served model sees them (the
camera's region); the candidate answers each with its own policy at full horizon, and the served model's raw
answer for the same frame arrives through the pipeline's results, matched by the frame's number. Answers are
compared by class name (the two models may have other class sets). Disagreeing frames are kept (JPEG, at most
``MAX_KEPT``) so that the user can look at them and add them to a class of a dataset.
"""

from __future__ import annotations

import asyncio
import functools
import itertools
import logging
import time
from collections import Counter
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import cv2
import numpy as np

from edge_app.pipeline import AnalysisPipeline
from edge_app.results import AnalysedFrame
from edge_app.teach.capture import Pace
from edge_app.teach.frames import DatasetError
from models.policies import run_on_trace
from models.policy_store import load_policy
from models.runtime import ModelRuntime
from streams.tasks import cancel_and_wait

log = logging.getLogger(__name__)
MAX_KEPT = 48
PENDING = 64  # candidate answers waiting for the served one (a frame the pipeline dropped never comes)


@dataclass
class ShadowRun:
    id: int
    model: str
    source: str
    seconds: float
    started_s: float = field(default_factory=time.monotonic)
    state: str = "running"  # running, done, failed
    error: str | None = None
    compared: int = 0
    agreed: int = 0
    pairs: Counter[tuple[str, str]] = field(default_factory=Counter)  # (in use, candidate) -> frames
    kept: list[dict[str, Any]] = field(default_factory=list)  # disagreements: k, in_use, candidate, exit, jpeg

    def status(self) -> dict[str, Any]:
        return {"id": self.id, "model": self.model, "source": self.source, "seconds": self.seconds,
                "state": self.state, "error": self.error, "elapsed_s": round(time.monotonic() - self.started_s, 1),
                "compared": self.compared, "agreed": self.agreed,
                "agreement": None if not self.compared else round(self.agreed / self.compared, 4),
                "pairs": [{"in_use": a, "candidate": b, "frames": n} for (a, b), n in self.pairs.most_common()],
                "disagreements": [{k: v for k, v in d.items() if k not in ("jpeg", "view")} for d in self.kept]}


class Shadows:
    def __init__(self) -> None:
        self.runs: dict[int, ShadowRun] = {}
        self._ids = itertools.count(1)
        self._tasks: set[asyncio.Task[None]] = set()

    async def start(self, model: str, folder: Path, source: str, pipe: AnalysisPipeline, seconds: float,
                    fps: float = 5.0) -> ShadowRun:
        if any(r.state == "running" for r in self.runs.values()):
            raise DatasetError("a shadow run is already running; wait for it", 409)
        if not 2 <= seconds <= 600:
            raise DatasetError("'seconds' must be from 2 to 600")
        loop = asyncio.get_running_loop()
        try:
            runtime = await loop.run_in_executor(None, ModelRuntime.load, folder, ("cpu",), 1, 1)
            policy = load_policy(folder, runtime.num_exits)
        except Exception as exc:  # a folder that does not load is reported, never served
            raise DatasetError(f"model {model!r} does not load: {exc}", 422) from exc
        run = ShadowRun(next(self._ids), model, source, seconds)
        self.runs[run.id] = run
        task = asyncio.create_task(self._run(run, pipe, runtime, policy, fps), name=f"shadow-{run.id}")
        self._tasks.add(task)
        task.add_done_callback(self._tasks.discard)
        return run

    async def _run(self, run: ShadowRun, pipe: AnalysisPipeline, runtime: ModelRuntime, policy: Any,
                   fps: float) -> None:
        loop = asyncio.get_running_loop()
        pace = Pace(fps)
        answers: dict[int, tuple[str, int, np.ndarray]] = {}  # seq -> (candidate's class, exit, frame)
        served: dict[int, str] = {}
        busy = [False]

        def candidate(view: np.ndarray) -> tuple[str, int, np.ndarray]:  # in a worker thread
            probs = runtime.all_exits(view)
            choice = run_on_trace(policy, probs, runtime.num_exits)[1]
            return runtime.class_names[int(probs[choice].argmax())], choice + 1, view

        def answered(seq: int, future: asyncio.Future[tuple[str, int, np.ndarray]]) -> None:  # on the loop
            busy[0] = False
            if future.cancelled() or future.exception() is not None:
                run.error = None if future.cancelled() else str(future.exception())
                return
            answers[seq] = future.result()
            while len(answers) > PENDING:
                answers.pop(next(iter(answers)))

        def tap(seq: int, view: np.ndarray) -> None:
            if busy[0] or not pace.take(time.monotonic()):
                return
            busy[0] = True
            future = loop.run_in_executor(None, candidate, view.copy())
            future.add_done_callback(functools.partial(answered, seq))

        def on_result(frame: AnalysedFrame) -> None:
            if frame.classes is not None and not frame.result.reused:
                served[frame.result.seq] = frame.classes[frame.result.raw_class]

        pipe.add_tap(tap)
        pipe.subscribe(on_result, video=False)
        try:
            end = time.monotonic() + run.seconds
            while time.monotonic() < end:
                await asyncio.sleep(0.2)
                self._match(run, answers, served)
            await asyncio.sleep(0.5)  # the last frames' answers
            self._match(run, answers, served)
            run.state = "done"
        except Exception as exc:
            run.state, run.error = "failed", str(exc)
            log.exception("shadow run %d failed", run.id)
        finally:
            pipe.remove_tap(tap)
            pipe.unsubscribe(on_result)
        log.info("shadow run %d of %s on %s: %d frames compared, %d agreed", run.id, run.model, run.source,
                 run.compared, run.agreed)

    @staticmethod
    def _match(run: ShadowRun, answers: dict[int, tuple[str, int, np.ndarray]], served: dict[int, str]) -> None:
        for seq in [s for s in answers if s in served]:
            label, exit_used, view = answers.pop(seq)
            in_use = served[seq]
            run.compared += 1
            run.agreed += label == in_use
            run.pairs[(in_use, label)] += 1
            if label != in_use and len(run.kept) < MAX_KEPT:
                ok, jpeg = cv2.imencode(".jpg", cv2.cvtColor(view, cv2.COLOR_RGB2BGR), [cv2.IMWRITE_JPEG_QUALITY, 92])
                if ok:
                    run.kept.append({"k": len(run.kept), "seq": seq, "in_use": in_use, "candidate": label,
                                     "exit": exit_used, "jpeg": jpeg.tobytes(), "view": view})
        while len(served) > 4 * PENDING:
            served.pop(next(iter(served)))

    def get(self, run_id: int) -> ShadowRun:
        if run_id not in self.runs:
            raise DatasetError(f"no shadow run {run_id}", 404)
        return self.runs[run_id]

    def frame(self, run_id: int, k: int) -> dict[str, Any]:
        run = self.get(run_id)
        if not 0 <= k < len(run.kept):
            raise DatasetError(f"shadow run {run_id} kept {len(run.kept)} frame(s); no frame {k}", 404)
        return run.kept[k]

    async def stop(self) -> None:
        await cancel_and_wait(*self._tasks)
