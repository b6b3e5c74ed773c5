"""Per-frame scheduling: how many exits fit, which the policy runs, what it answers.

``FrameScheduler.analyse`` is synchronous and meant to run in the inference
thread (never on the event loop).  It takes the compute budget the caller
worked out (``edge_app.budget``), truncates the chain to the exits whose
predicted cost (the runtime's running high-percentile estimates) fits, lets
the policy decide after each exit within the depth window, and records the
decision.
"""

from __future__ import annotations

import time
from dataclasses import dataclass

import numpy as np

from edge_app.budget import horizon as exits_that_fit
from edge_app.config import PolicyConfig
from edge_app.smoothing import depth_window
from models.errors import SegmentRunError
from models.fit import configured_policy
from models.policies import ExitPolicy
from models.runtime import ExitResult, ModelRuntime


@dataclass(frozen=True)
class FrameDecision:
    exit_index: int  # 0-based exit whose answer is returned; -1: none ran, the answer was reused
    exits_run: int
    horizon: int
    result: ExitResult
    predicted_ms: float  # predicted cost of the exits that ran
    actual_ms: float  # measured time of the exits that ran
    compute_budget_ms: float
    deadline_met: bool  # the compute fitted its budget
    segments_ms: tuple[float, ...] = ()  # measured time of each segment that ran
    error: str | None = None  # a segment after the first raised: the answer is the best exit before it


class FrameScheduler:
    def __init__(self, runtime: ModelRuntime, policy: ExitPolicy, max_depth_step: int | None = None,
                 truncate: bool = True) -> None:
        self.runtime = runtime
        self.truncate = truncate  # False: a baseline that starts every exit its policy wants, deadline or not
        self.policy = policy
        self.max_depth_step = max_depth_step
        self._previous_exits_run: int | None = None

    def predicted_costs_ms(self) -> list[float]:
        return [c.high_ms for c in self.runtime.costs]

    def analyse(self, x: np.ndarray, compute_budget_ms: float) -> FrameDecision:
        predicted = self.predicted_costs_ms()
        fit = exits_that_fit(compute_budget_ms, predicted)
        n = self.runtime.num_exits
        lo, hi = depth_window(self._previous_exits_run, fit if self.truncate else n, n, self.max_depth_step)
        run = self.runtime.start(x)
        decide = self.policy.start(hi)
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
            stop = decide.observe(res.probs)
            if run.next_exit >= hi or (stop and run.next_exit >= lo):
                break
        actual = (time.perf_counter() - t0) * 1e3
        ran = run.next_exit
        # the policy observed every exit that ran (also those the depth window forced), so its choice stands
        choice = decide.choice
        self._previous_exits_run = ran
        return FrameDecision(choice, ran, fit, run.results[choice], float(sum(predicted[:ran])), actual,
                             compute_budget_ms, actual <= compute_budget_ms,
                             tuple(r.segment_ms for r in run.results), error)


def policy_from_config(cfg: PolicyConfig, runtime: ModelRuntime) -> ExitPolicy:
    """The exit policy ``[policy]`` asks for, for the runtime's model (``models.fit.configured_policy``)."""
    return configured_policy(runtime.folder, cfg.kind, cfg.lam, cfg.target_accuracy, cfg.threshold, cfg.fixed_exit)
