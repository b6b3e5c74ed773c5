"""A slower device, emulated around a real runtime (benchmarks only; the serve path never uses it).

``EmulatedDevice(runtime, segment_ms=[25, 25, 25])`` pads segment k to ``segment_ms[k]`` milliseconds;
``EmulatedDevice(runtime, slowdown=5)`` pads each to 5 times the export's measured median (a heavier model with
the same exits).  The padding is a sleep after the real segment, so the CPU stays free as it is while an
accelerator computes, and a segment that is already slower than its pad (a busy CPU) is not padded: contention
still shows.  It has the shape of an inference backend (``models.service.InferenceBackend``), so the inference
service, the scheduler and everything they decide see the emulated costs.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Sequence
from dataclasses import replace
from typing import Any

import numpy as np

from models.runtime import ExitResult, ModelRuntime

log = logging.getLogger(__name__)


class EmulatedDevice:
    def __init__(self, runtime: ModelRuntime, segment_ms: Sequence[float] | None = None, slowdown: float = 1.0) -> None:
        if (segment_ms is None) == (slowdown == 1.0):
            raise ValueError("give either segment_ms or a slowdown > 1")
        if slowdown < 1:
            raise ValueError("slowdown must be >= 1")
        n = runtime.num_exits
        if segment_ms is not None and (len(segment_ms) != n or min(segment_ms) <= 0):
            raise ValueError(f"segment_ms needs {n} positive times, got {list(segment_ms)}")
        self.runtime = runtime
        self.pad_ms = (list(segment_ms) if segment_ms is not None
                       else [ex.cpu_cost.median_ms * slowdown for ex in runtime.manifest.exits])
        self.folder, self.manifest, self.providers = runtime.folder, runtime.manifest, runtime.providers
        self.device = runtime.device
        log.warning("emulated device: segments padded to %s ms", [round(ms, 2) for ms in self.pad_ms])

    @property
    def batchable(self) -> bool:
        return False  # one frame per call: the padding emulates one frame's segment time

    @property
    def device_name(self) -> str:
        return f"{self.runtime.device_name} (emulated: {'/'.join(f'{ms:g}' for ms in self.pad_ms)} ms)"

    @property
    def num_exits(self) -> int:
        return self.runtime.num_exits

    @property
    def class_names(self) -> list[str]:
        return self.runtime.class_names

    @property
    def prior_costs_ms(self) -> list[float]:
        return list(self.pad_ms)

    def preprocess(self, rgb: np.ndarray) -> np.ndarray:
        return self.runtime.preprocess(rgb)

    def start(self, x: np.ndarray) -> PaddedRun:
        return PaddedRun(self.runtime.start(x), self.pad_ms)


class PaddedRun:
    def __init__(self, run: Any, pad_ms: list[float]) -> None:
        self._run = run
        self._pad_ms = pad_ms
        self.results: list[ExitResult] = []

    @property
    def next_exit(self) -> int:
        return len(self.results)

    @property
    def done(self) -> bool:
        return bool(self._run.done)

    def advance(self) -> ExitResult:
        t0 = time.perf_counter()
        res: ExitResult = self._run.advance()
        pad = self._pad_ms[res.exit_index] / 1e3 - (time.perf_counter() - t0)
        if pad > 0:
            time.sleep(pad)
        res = replace(res, segment_ms=(time.perf_counter() - t0) * 1e3)
        self.results.append(res)
        return res
