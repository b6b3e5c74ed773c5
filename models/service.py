"""The one inference service every pipeline submits its frames to.

``InferenceService`` owns the model runtime (the *backend*, chosen by name in ``[model] backend``, as Frigate
chooses its detector plugins) and the inference thread(s).  A pipeline decides how deep a frame may go (the
horizon its deadline allows, the depth window) and submits ``ChainRequest(x, policy, min_exits, max_exits)``;
the service walks the chain one segment at a time, lets the policy decide after each exit whether to go on, and
answers with a ``ChainOutcome``.  It keeps the running cost estimate of each segment (median and high
percentile of measured times) that the scheduler's deadline truncation reads.

This is the seam where batching across streams, a second device and a remote engine plug in: a backend is any
object with the ``InferenceBackend`` shape (the ONNX Runtime one is ``models.runtime.ModelRuntime``; benchmarks
wrap it to emulate a slower device).
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import Callable, Mapping, Sequence
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Protocol

import numpy as np

from models.costs import RunningCost
from models.errors import ModelError, SegmentRunError
from models.governor import ServerLoad
from models.manifest import Manifest
from models.policies import ExitPolicy
from models.runtime import ExitResult, ModelRuntime


class InferenceBackend(Protocol):
    """What the service needs of a runtime."""

    folder: Path
    manifest: Manifest
    providers: list[str]
    device: str

    @property
    def device_name(self) -> str: ...

    @property
    def num_exits(self) -> int: ...

    @property
    def class_names(self) -> list[str]: ...

    @property
    def prior_costs_ms(self) -> list[float]: ...

    @property
    def batchable(self) -> bool: ...  # its segments take a batch of frames (a dynamic batch axis)

    def preprocess(self, rgb: np.ndarray) -> np.ndarray: ...

    def start(self, x: np.ndarray) -> Any: ...


def load_onnxruntime(folder: Path, providers: Sequence[str], threads: int, warmup: int,
                     device_id: int) -> InferenceBackend:
    return ModelRuntime.load(folder, providers=providers, threads=threads, warmup=warmup, device_id=device_id)


BACKENDS: dict[str, Callable[[Path, Sequence[str], int, int, int], InferenceBackend]] = {
    "onnxruntime": load_onnxruntime,
}


def load_backend(name: str, folder: Path, providers: Sequence[str] = ("cpu",), threads: int = 0, warmup: int = 3,
                 device_id: int = 0) -> InferenceBackend:
    if name not in BACKENDS:
        raise ModelError(f"unknown inference backend {name!r}; choose from {sorted(BACKENDS)}")
    return BACKENDS[name](folder, providers, threads, warmup, device_id)


@dataclass(frozen=True)
class ChainRequest:
    x: np.ndarray  # the preprocessed (1, 3, h, w) input
    policy: ExitPolicy  # decides after each exit whether to go on
    min_exits: int  # run at least this many exits, whatever the policy says (the depth window)
    max_exits: int  # never run more: the horizon the deadline allows, within the depth window
    timeout_s: float | None = None  # a remote runner waits at most this long (the frame's compute budget)
    source: str = ""  # the camera or session it comes from (a shared server's governor counts arrivals per source)


@dataclass(frozen=True)
class ChainOutcome:
    results: tuple[ExitResult, ...]  # one per exit that ran
    choice: int  # 0-based exit whose answer the policy returns (recall: not always the last one)
    actual_ms: float  # wall time of the segments that ran
    error: str | None = None  # a segment after the first failed: the answer comes from the exits before it
    queue_ms: float = 0.0  # waited beyond the segments (a remote runner: the round trip and the server's queue)


class Runner(Protocol):
    """The runner contract: what the app asks of whatever runs a model's chain (chosen by name, ``[model.backend]
    kind``: ``models.runners``). The local one is ``InferenceService``; ``models.triton_runner.TritonRunner`` sends
    frames to a shared Triton and answers the same way."""

    backend: InferenceBackend  # the model: manifest, classes, pre-processing (a remote runner's cheap path too)
    costs: list[RunningCost]  # each segment's measured cost, as the scheduler's deadline truncation reads it
    server_load: ServerLoad | None  # a shared server's load governor (None: the box governs its own load)

    @property
    def num_exits(self) -> int: ...

    @property
    def class_names(self) -> list[str]: ...

    def predicted_costs_ms(self) -> list[float]: ...

    def start(self) -> None: ...

    async def stop(self) -> None: ...

    async def probe(self) -> bool: ...

    async def run(self, request: ChainRequest) -> ChainOutcome: ...

    def run_now(self, request: ChainRequest) -> ChainOutcome: ...

    def status(self) -> dict[str, Any]: ...  # /status model.runner: kind, state, and what it counted


class InferenceService:
    """Runs frames' chains on one backend in ``workers`` threads; ``start()`` / ``async stop()``."""

    server_load: ServerLoad | None = None  # this box governs its own load (edge_app.decision.governor.LoadGovernor)

    def __init__(self, backend: InferenceBackend, workers: int = 1, cost_window: int = 256,
                 batch_window_ms: float = 0.0, max_batch: int = 32) -> None:
        if workers < 1:
            raise ValueError("workers must be >= 1")
        self.backend = backend
        self.workers = workers
        self.costs = [RunningCost(ms, cost_window) for ms in backend.prior_costs_ms]
        self.segment_runs = [0] * backend.num_exits  # how often each segment ran (per frame, batched or not)
        self.batch_window_s = batch_window_ms / 1e3
        self.max_batch = max_batch
        self.batches = 0  # segment-1 batches run, and the frames in them
        self.batched_frames = 0
        self._pending: list[tuple[ChainRequest, asyncio.Future[ChainOutcome]]] = []
        self._flush: asyncio.TimerHandle | None = None
        self._pool: ThreadPoolExecutor | None = None

    @property
    def num_exits(self) -> int:
        return self.backend.num_exits

    @property
    def class_names(self) -> list[str]:
        return self.backend.class_names

    @property
    def batching(self) -> bool:
        """Frames from all sources are gathered for ``batch_window_ms`` and run as one batch per segment."""
        return self.batch_window_s > 0 and self.backend.batchable

    def predicted_costs_ms(self) -> list[float]:
        """What each segment is expected to cost at worst (the running high percentile; a batch's wall time when
        batching, and segment 1 also waits for the batch window)."""
        costs = [c.high_ms for c in self.costs]
        if self.batching:
            costs[0] += self.batch_window_s * 1e3
        return costs

    def start(self) -> None:
        if self._pool is None:
            self._pool = ThreadPoolExecutor(self.workers, thread_name_prefix="inference")

    async def probe(self) -> bool:
        """Whether the runner can answer now (a remote one says in a line when it cannot); local: always."""
        return True

    def status(self) -> dict[str, Any]:
        return {"kind": "onnxruntime", "state": "up" if self._pool is not None else "stopped"}

    async def stop(self) -> None:
        if self._flush is not None:
            self._flush.cancel()
            self._flush = None
        for _, fut in self._pending:
            if not fut.done():
                fut.set_exception(SegmentRunError("the inference service stopped"))
        self._pending = []
        pool, self._pool = self._pool, None
        if pool is not None:
            pool.shutdown(wait=False, cancel_futures=True)

    async def run(self, request: ChainRequest) -> ChainOutcome:
        """Run ``request`` in an inference thread; raises ``SegmentRunError`` when exit 1 itself fails. When
        batching, it waits (at most the window) for frames of other sources to share its batch."""
        if self._pool is None:
            raise RuntimeError("the inference service is not started")
        loop = asyncio.get_running_loop()
        if not self.batching:
            return await loop.run_in_executor(self._pool, self.run_now, request)
        fut: asyncio.Future[ChainOutcome] = loop.create_future()
        self._pending.append((request, fut))
        if len(self._pending) >= self.max_batch:
            self._dispatch()
        elif self._flush is None:
            self._flush = loop.call_later(self.batch_window_s, self._dispatch)
        return await fut

    def _dispatch(self) -> None:
        if self._flush is not None:
            self._flush.cancel()
            self._flush = None
        batch, self._pending = self._pending, []
        if not batch or self._pool is None:
            return
        job = asyncio.get_running_loop().run_in_executor(self._pool, self.run_batch_now, [r for r, _ in batch])

        def done(f: asyncio.Future[list[ChainOutcome | SegmentRunError]]) -> None:
            outcomes: list[ChainOutcome | BaseException] = (
                [f.exception()] * len(batch) if f.exception() is not None else list(f.result()))  # type: ignore[list-item]
            for (_, fut), out in zip(batch, outcomes, strict=True):
                if fut.done():
                    continue
                if isinstance(out, BaseException):
                    fut.set_exception(out)
                else:
                    fut.set_result(out)

        job.add_done_callback(done)

    def run_batch_now(self, requests: Sequence[ChainRequest]) -> list[ChainOutcome | SegmentRunError]:
        """Several frames' chains at once: segment 1 on all of them, then the policy decides per frame, and
        segment 2 runs on the frames that go on (each within its own horizon), and so on. Every frame gets what
        ``run_now`` would give it; its ``actual_ms`` is the wall time of the batches it was in."""
        be: Any = self.backend
        n = len(requests)
        decides = [r.policy.start(r.max_exits) for r in requests]
        results: list[list[ExitResult]] = [[] for _ in range(n)]
        errors: list[str | None] = [None] * n
        elapsed = [0.0] * n
        active = list(range(n))
        value = be.to_device(np.concatenate([r.x for r in requests]))
        self.batches += 1
        self.batched_frames += n
        for k in range(be.num_exits):
            try:
                feats, probs, ms = be.run_segment(k, value)
            except SegmentRunError as exc:
                if k == 0:
                    return [exc] * n
                for i in active:
                    errors[i] = str(exc)  # a failing segment costs depth, not the answer
                break
            self.costs[k].record(ms)
            self.segment_runs[k] += len(active)
            keep = []
            for j, i in enumerate(active):
                p = probs[j]
                label = int(p.argmax())
                results[i].append(ExitResult(k, p, label, float(p[label]), ms))
                elapsed[i] += ms
                stop = decides[i].observe(p)
                if not (k + 1 >= requests[i].max_exits or (stop and k + 1 >= requests[i].min_exits)):
                    keep.append(j)
            if not keep or feats is None:
                break
            value = be.take(feats, keep)
            active = [active[j] for j in keep]
        return [ChainOutcome(tuple(results[i]), decides[i].choice, elapsed[i], errors[i]) for i in range(n)]

    def run_now(self, request: ChainRequest) -> ChainOutcome:
        """The chain walk itself, in the calling thread (the service's threads, or an offline tool's)."""
        run = self.backend.start(request.x)
        decide = request.policy.start(request.max_exits)
        t0 = time.perf_counter()
        error = None
        while True:
            try:
                res = run.advance()
            except SegmentRunError as exc:
                if run.next_exit == 0:
                    raise  # no exit has answered: the frame fails
                error = str(exc)  # a failing segment costs depth, not the answer (recall of the exits run)
                break
            self.costs[res.exit_index].record(res.segment_ms)
            self.segment_runs[res.exit_index] += 1
            stop = decide.observe(res.probs)
            if run.next_exit >= request.max_exits or (stop and run.next_exit >= request.min_exits):
                break
        # the policy observed every exit that ran (also those the depth window forced), so its choice stands
        return ChainOutcome(tuple(run.results), decide.choice, (time.perf_counter() - t0) * 1e3, error)


def local_runner(backend: InferenceBackend, settings: Mapping[str, Any]) -> InferenceService:
    """``[model.backend] kind = "onnxruntime"``: the model runs in this process (``models.runners``)."""
    return InferenceService(backend, settings["workers"], settings["cost_window"], settings["batch_window_ms"],
                            settings["max_batch"])
