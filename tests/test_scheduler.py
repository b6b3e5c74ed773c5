"""The scheduler on the real default model through the inference service: deadline truncation, depth steps,
recall; and the benchmarks' emulation of a slower device."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest

from edge_app.bench.emulation import EmulatedDevice
from edge_app.decision.scheduler import FrameScheduler
from models.policies import ConfidenceThreshold, FixedExit
from models.policy_store import load_policy
from models.runtime import ModelRuntime
from models.service import InferenceService

DEFAULT = Path(__file__).resolve().parents[1] / "models" / "default"


@pytest.fixture(scope="module")
def runtime() -> ModelRuntime:
    return ModelRuntime.load(DEFAULT, providers=["cpu"], warmup=3)


@pytest.fixture
def service(runtime: ModelRuntime) -> InferenceService:
    return InferenceService(runtime)


def frame(seed: int) -> np.ndarray:
    return np.random.default_rng(seed).integers(0, 256, (240, 320, 3), dtype=np.uint8)


def test_exits_that_do_not_fit_are_never_started(runtime: ModelRuntime, service: InferenceService) -> None:
    sched = FrameScheduler(service, FixedExit(3), max_depth_step=3)
    x = runtime.preprocess(frame(0))
    before = list(service.segment_runs)
    d = sched.analyse_now(x, compute_budget_ms=0.0)
    assert d.exits_run == 1 and d.horizon == 1 and d.exit_index == 0, "exit 1 always runs"
    assert [a - b for a, b in zip(service.segment_runs, before, strict=True)] == [1, 0, 0]
    assert not d.deadline_met
    d = sched.analyse_now(x, compute_budget_ms=1e6)
    assert d.exits_run == 3 and d.deadline_met and d.actual_ms > 0 and d.predicted_ms > 0


def test_depth_rises_one_step_per_frame(runtime: ModelRuntime, service: InferenceService) -> None:
    sched = FrameScheduler(service, FixedExit(3), max_depth_step=1)
    x = runtime.preprocess(frame(1))
    assert sched.analyse_now(x, 0.0).exits_run == 1
    assert [sched.analyse_now(x, 1e6).exits_run for _ in range(3)] == [2, 3, 3]


def test_depth_falls_one_step_unless_the_deadline_forces_it(runtime: ModelRuntime, service: InferenceService
                                                             ) -> None:
    sched = FrameScheduler(service, ConfidenceThreshold(0.0), max_depth_step=1)  # would stop at exit 1
    x = runtime.preprocess(frame(2))
    sched._previous_exits_run = 3
    assert sched.analyse_now(x, 1e6).exits_run == 2, "falls one step, not to exit 1 at once"
    assert sched.analyse_now(x, 1e6).exits_run == 1
    sched._previous_exits_run = 3
    assert sched.analyse_now(x, 0.0).exits_run == 1, "the deadline overrides the step limit"


def test_dynamic_index_answers_with_the_best_exit_seen(runtime: ModelRuntime, service: InferenceService) -> None:
    pol = load_policy(DEFAULT, runtime.num_exits)
    sched = FrameScheduler(service, pol, max_depth_step=3)
    for seed in range(20):
        d = sched.analyse_now(runtime.preprocess(frame(seed)), 1e6)
        assert d.exit_index < d.exits_run <= 3
        assert d.result is not None and d.result.exit_index == d.exit_index


def test_without_truncation_a_baseline_runs_past_the_deadline(runtime: ModelRuntime, service: InferenceService
                                                               ) -> None:
    sched = FrameScheduler(service, FixedExit(3), max_depth_step=3, truncate=False)
    d = sched.analyse_now(runtime.preprocess(frame(3)), compute_budget_ms=0.0)
    assert d.exits_run == 3 and d.exit_index == 2 and d.horizon == 1, "runs all exits; only exit 1 'fit'"
    assert not d.deadline_met


def test_emulated_slowdown_pads_each_segment_to_its_calibrated_cost(runtime: ModelRuntime) -> None:
    slow = InferenceService(EmulatedDevice(runtime, slowdown=5.0))
    x = runtime.preprocess(frame(4))
    target = np.array([5.0 * ex.cpu_cost.median_ms for ex in runtime.manifest.exits])
    runs = np.array([FrameScheduler(slow, FixedExit(3), 3).analyse_now(x, 1e6).segments_ms for _ in range(5)])
    med = np.median(runs, axis=0)
    assert np.all(runs >= 0.98 * target), f"every segment takes at least its padded cost {target}: {runs}"
    assert np.all(med < target + 5.0), f"and not much more (median {med} vs {target})"
    predicted = FrameScheduler(slow, FixedExit(3)).predicted_costs_ms()
    assert np.all(np.array(predicted) >= 0.95 * target), "the scheduler plans with the padded costs"
    with pytest.raises(ValueError):
        EmulatedDevice(runtime, slowdown=0.5)


def test_fixed_emulated_segment_times(runtime: ModelRuntime) -> None:
    fixed = InferenceService(EmulatedDevice(runtime, segment_ms=[6.0, 3.0, 9.0]))
    x = runtime.preprocess(frame(4))
    runs = np.array([FrameScheduler(fixed, FixedExit(3), 3).analyse_now(x, 1e6).segments_ms for _ in range(7)])
    # Padding is a floor every call must reach.  Overshoot is the OS waking the sleeper late, which a
    # busy machine stretches for many calls in a row (seen: 8.5 ms for a 3 ms pad in 4 of 5 calls), so
    # the upper bound is on the quickest call: one padded twice would still be caught.
    assert np.all(runs >= 0.98 * np.array([6.0, 3.0, 9.0])), runs
    assert np.all(runs.min(axis=0) < np.array([6.0, 3.0, 9.0]) + 2.5), runs
    with pytest.raises(ValueError, match="segment_ms needs 3 positive times"):
        EmulatedDevice(runtime, segment_ms=[6.0, 3.0])
