"""Training jobs: ``python -m exporter.teach`` in its own process, never in the server's event loop or inference
threads, its JSON progress lines read as they come. One job at a time (a second is refused with 409); a job can
be cancelled (SIGTERM, then SIGKILL after 5 s). Its stderr goes to ``MODELS_DIR/VERSION.log``.
"""

from __future__ import annotations

import asyncio
import contextlib
import importlib.util
import json
import logging
import shutil
import sys
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from edge_app.config import TrainingConfig
from edge_app.teach.frames import DatasetError
from edge_app.teach.store import DatasetStore

log = logging.getLogger(__name__)
NEEDS = ("torch", "torchvision", "onnxscript")


@dataclass
class TrainingJob:
    id: str
    dataset: str
    version: str
    out: Path
    started_s: float = field(default_factory=time.time)
    state: str = "running"  # running, succeeded, failed, cancelled
    events: list[dict[str, Any]] = field(default_factory=list)
    error: str | None = None
    ended_s: float | None = None
    base: str = ""  # the model it started from
    proc: asyncio.subprocess.Process | None = None

    def status(self) -> dict[str, Any]:
        epochs = [e for e in self.events if e.get("event") == "epoch"]
        done = next((e for e in self.events if e.get("event") == "done"), None)
        stage = self.events[-1]["event"] if self.events else "starting"
        return {"id": self.id, "dataset": self.dataset, "model": self.version, "base": self.base,
                "state": self.state, "stage": stage,
                "started_unix": round(self.started_s, 1), "elapsed_s": round((self.ended_s or time.time())
                                                                             - self.started_s, 1),
                "epoch": epochs[-1] if epochs else None, "epochs": epochs, "error": self.error, "result": done}


def missing_train_extra() -> list[str]:
    return [m for m in NEEDS if importlib.util.find_spec(m) is None]


class Trainer:
    def __init__(self, store: DatasetStore, cfg: TrainingConfig, models_dir: Path) -> None:
        self.store, self.cfg, self.models_dir = store, cfg, models_dir
        self.jobs: dict[str, TrainingJob] = {}
        self._tasks: set[asyncio.Task[None]] = set()

    @property
    def running(self) -> TrainingJob | None:
        return next((j for j in self.jobs.values() if j.state == "running"), None)

    async def start(self, dataset: str, base: Path, epochs: int | None = None, input_size: int | None = None,
                    width: float | None = None) -> TrainingJob:
        """Start training on ``dataset`` from the model folder ``base`` (the last model taught on it, when the
        class set is the same, so that a retraining refines it)."""
        if (job := self.running) is not None:
            raise DatasetError(f"training is already running (job {job.id}, dataset {job.dataset!r}); wait for it "
                               f"or cancel it (DELETE /api/training/{job.id})", 409)
        missing = missing_train_extra()
        if missing:
            raise DatasetError(f"training needs the train extra ({', '.join(missing)} not installed): "
                               "pip install -e '.[train]' (or '.[gpu,train]'), then restart edge-app", 503)
        self.store.check_trainable(dataset, self.cfg.min_frames_per_class)
        version = f"{dataset}-{time.strftime('%Y%m%d-%H%M%S')}".replace(" ", "_")
        out = self.models_dir / version
        data = self.models_dir / ".data" / version
        loop = asyncio.get_running_loop()
        counts = await loop.run_in_executor(None, self.store.materialize, dataset, data)
        job = TrainingJob(id=version, dataset=dataset, version=version, out=out, base=base.name)
        job.events.append({"event": "split", "frames": counts, "base": base.name})
        self.models_dir.mkdir(parents=True, exist_ok=True)
        stderr = (self.models_dir / f"{version}.log").open("wb")
        cmd = [sys.executable, "-m", "exporter.teach", "--json", "--data", str(data), "--base", str(base),
               "--out", str(out), "--epochs", str(epochs or self.cfg.epochs), "--lr", str(self.cfg.lr),
               "--batch-size", str(self.cfg.batch_size), "--threads", str(self.cfg.threads)]
        if input_size:
            cmd += ["--input-size", str(input_size)]
        if width:
            cmd += ["--width", str(width)]
        job.proc = await asyncio.create_subprocess_exec(*cmd, stdout=asyncio.subprocess.PIPE, stderr=stderr)
        stderr.close()
        self.jobs[job.id] = job
        task = asyncio.create_task(self._follow(job), name=f"training-{job.id}")
        self._tasks.add(task)
        task.add_done_callback(self._tasks.discard)
        log.info("training %s: started on dataset %r (%s)", job.id, dataset, counts)
        return job

    async def _follow(self, job: TrainingJob) -> None:
        proc = job.proc
        assert proc is not None and proc.stdout is not None
        async for raw in proc.stdout:
            try:
                event = json.loads(raw)
            except ValueError:
                continue
            job.events.append(event)
            if event.get("event") == "epoch":
                log.info("training %s: epoch %s/%s loss %s calibration accuracy %s check accuracy %s", job.id,
                         event["epoch"], event["epochs"], event["loss"], event["calibration_accuracy"],
                         event.get("check_accuracy"))
            if event.get("event") == "error":
                job.error = event.get("error")
        rc = await proc.wait()
        job.ended_s = time.time()
        if job.state == "cancelled":
            shutil.rmtree(job.out, ignore_errors=True)
        elif rc == 0 and any(e.get("event") == "done" for e in job.events):
            job.state = "succeeded"
        else:
            job.state = "failed"
            job.error = job.error or f"the training process exited with {rc}; see {self.models_dir / job.id}.log"
            shutil.rmtree(job.out, ignore_errors=True)
        shutil.rmtree(job.out.with_name(job.out.name + ".work"), ignore_errors=True)
        log.info("training %s: %s%s", job.id, job.state, f" ({job.error})" if job.error else "")

    async def cancel(self, job_id: str) -> TrainingJob:
        job = self.get(job_id)
        if job.state != "running" or job.proc is None:
            raise DatasetError(f"training job {job_id} is not running ({job.state})", 409)
        job.state = "cancelled"
        job.proc.terminate()
        try:
            await asyncio.wait_for(job.proc.wait(), 5.0)
        except TimeoutError:
            job.proc.kill()
        return job

    def get(self, job_id: str) -> TrainingJob:
        if job_id not in self.jobs:
            raise DatasetError(f"no training job {job_id!r}", 404)
        return self.jobs[job_id]

    async def stop(self) -> None:
        for job in self.jobs.values():
            if job.state == "running" and job.proc is not None:
                job.state = "cancelled"
                with contextlib.suppress(ProcessLookupError):
                    job.proc.kill()
        for task in list(self._tasks):
            with contextlib.suppress(Exception):
                await asyncio.wait_for(task, 5.0)
