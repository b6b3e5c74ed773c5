"""Per-frame scheduling: how many exits fit, which the policy runs, what it answers.

``FrameScheduler`` takes the compute budget the caller worked out
(``edge_app.decision.budget``), truncates the chain to the exits whose predicted cost
(the inference service's running high-percentile estimates) fits, bounds the
depth window (``edge_app.decision.smoothing.depth_window``), submits the frame to the
inference service (the policy decides after each exit there) and turns the
outcome into a ``FrameDecision``.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

import numpy as np

from edge_app.config import PolicyConfig
from edge_app.decision.budget import horizon as exits_that_fit
from edge_app.decision.smoothing import depth_window
from models.policies import ExitPolicy
from models.policy_store import configured_policy, describe_policy
from models.runtime import ExitResult
from models.service import ChainOutcome, ChainRequest, Runner


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
    unchanged: bool = False  # exit 0 answered: the picture did not change enough since the model last ran


@dataclass(frozen=True)
class ExitPlan:
    horizon: int  # exits whose predicted cost fits the budget
    min_exits: int  # the depth window: at least ...
    max_exits: int  # ... and at most this many exits run
    predicted_ms: tuple[float, ...]  # each segment's predicted (high-percentile) cost
    budget_ms: float = 0.0  # the frame's compute budget: a remote runner waits no longer (ChainRequest.timeout_s)


MIN_WAIT_MS = 2.0  # a frame already out of budget still gets a chance at a remote runner before the cheap path


class FrameScheduler:
    """One source's scheduler: plans each frame's depth from its budget, submits it to the inference service."""

    def __init__(self, service: Runner, policy: ExitPolicy, max_depth_step: int | None = None,
                 truncate: bool = True, source: str = "") -> None:
        self.service = service
        self.source = source  # named in each request (a shared server's governor counts its frames per source)
        self.truncate = truncate  # False: a baseline that starts every exit its policy wants, deadline or not
        self.policy = policy
        self.max_depth_step = max_depth_step
        self._previous_exits_run: int | None = None

    def predicted_costs_ms(self) -> list[float]:
        return self.service.predicted_costs_ms()

    def plan(self, compute_budget_ms: float) -> ExitPlan:
        predicted = self.predicted_costs_ms()
        fit = exits_that_fit(compute_budget_ms, predicted)
        n = self.service.num_exits
        lo, hi = depth_window(self._previous_exits_run, fit if self.truncate else n, n, self.max_depth_step)
        return ExitPlan(horizon=fit, min_exits=lo, max_exits=hi, predicted_ms=tuple(predicted),
                        budget_ms=compute_budget_ms)

    def request(self, x: np.ndarray, plan: ExitPlan, policy: ExitPolicy | None = None) -> ChainRequest:
        return ChainRequest(x=x, policy=policy or self.policy, min_exits=plan.min_exits, max_exits=plan.max_exits,
                            timeout_s=max(MIN_WAIT_MS, plan.budget_ms) / 1e3, source=self.source)

    def decision(self, plan: ExitPlan, outcome: ChainOutcome, compute_budget_ms: float) -> FrameDecision:
        ran = len(outcome.results)
        self._previous_exits_run = ran
        return FrameDecision(exit_index=outcome.choice, exits_run=ran, horizon=plan.horizon,
                             result=outcome.results[outcome.choice],
                             predicted_ms=float(sum(plan.predicted_ms[:ran])), actual_ms=outcome.actual_ms,
                             compute_budget_ms=compute_budget_ms,
                             # as users see it: a remote runner's round trip counts against the budget too
                             deadline_met=outcome.actual_ms + outcome.queue_ms <= compute_budget_ms,
                             segments_ms=tuple(r.segment_ms for r in outcome.results), error=outcome.error)

    async def analyse(self, x: np.ndarray, compute_budget_ms: float, policy: ExitPolicy | None = None,
                      plan: ExitPlan | None = None) -> FrameDecision:
        """Plan (unless given), run in the service's inference thread, decide (with ``policy``, this frame's
        operating point, when given; else the scheduler's own)."""
        plan = plan or self.plan(compute_budget_ms)
        return self.decision(plan, await self.service.run(self.request(x, plan, policy)), compute_budget_ms)

    def analyse_now(self, x: np.ndarray, compute_budget_ms: float) -> FrameDecision:
        """The same in the calling thread (offline tools and benchmarks that run frame by frame)."""
        plan = self.plan(compute_budget_ms)
        return self.decision(plan, self.service.run_now(self.request(x, plan)), compute_budget_ms)


def policy_from_config(cfg: PolicyConfig, model_folder: Path) -> ExitPolicy:
    """The exit policy ``[policy]`` asks for, for the model in ``model_folder`` (``models.fit.configured_policy``)."""
    return configured_policy(model_folder, cfg.kind, cfg.lam, cfg.target_accuracy, cfg.threshold, cfg.fixed_exit)


def describe_served(cfg: PolicyConfig, model_folder: Path, policy: ExitPolicy) -> dict[str, object]:
    """``/status``'s ``policy``: what ``policy_from_config`` gave for this model (kind, parameters, where from)."""
    return describe_policy(policy, model_folder, cfg.kind, cfg.lam, cfg.target_accuracy)
