"""Replay exit policies on traces and summarise them (pure numpy; plotting lives in ``edge_app``)."""

from __future__ import annotations

from collections.abc import Iterable, Sequence
from dataclasses import asdict, dataclass
from typing import Any

import numpy as np

from models.fit import LAM_GRID, FittedChain, build_policy
from models.policies import (
    BudgetGreedy,
    ConfidenceThreshold,
    EntropyThreshold,
    ExitPolicy,
    FixedExit,
    Patience,
    run_on_trace,
)


@dataclass(frozen=True)
class PolicyPoint:
    """One policy at one parameter and one horizon, replayed on a trace set."""

    policy: str
    param: float | None
    horizon: int
    accuracy: float  # against ground truth
    agreement_with_final: float  # against the final exit's answer
    mean_cost: float  # normalised: 1.0 = full depth
    mean_exits_run: float
    exit_usage: list[float]  # share of frames answered by each exit

    def as_dict(self) -> dict[str, Any]:
        return asdict(self)


def replay(policy: ExitPolicy, probs: np.ndarray, labels: np.ndarray, cost: np.ndarray, horizon: int,
           param: float | None = None) -> PolicyPoint:
    """Run ``policy`` on every frame of the traces, as the server would, and score it."""
    n_frames, _n, _ = probs.shape
    cum = np.cumsum(cost)
    ran = np.empty(n_frames, int)
    chosen = np.empty(n_frames, int)
    for i in range(n_frames):
        ran[i], chosen[i] = run_on_trace(policy, probs[i], horizon)
    return _score(policy.name, param, horizon, probs, labels, cum, ran, chosen)


def _score(name: str, param: float | None, horizon: int, probs: np.ndarray, labels: np.ndarray, cum: np.ndarray,
           ran: np.ndarray, chosen: np.ndarray) -> PolicyPoint:
    n_frames, n, _ = probs.shape
    answers = probs[np.arange(n_frames), chosen].argmax(-1)
    final = probs[:, -1].argmax(-1)
    usage = np.bincount(chosen, minlength=n) / n_frames
    return PolicyPoint(name, param, horizon, float((answers == labels).mean()), float((answers == final).mean()),
                       float(cum[ran - 1].mean()), float(ran.mean()), [float(u) for u in usage])


def prophet(probs: np.ndarray, labels: np.ndarray, cost: np.ndarray, horizon: int) -> PolicyPoint:
    """The best exit in hindsight: the shallowest correct exit within the horizon (else exit 1)."""
    correct = probs[:, :horizon].argmax(-1) == labels[:, None]
    first = np.where(correct.any(1), correct.argmax(1), 0)
    return _score("prophet", None, horizon, probs, labels, np.cumsum(cost), first + 1, first)


# Each policy's knob is swept over about 60 values, denser where the fronts bend (high confidence, small
# entropy), so that no policy's front looks worse for want of points; lam uses fit-policy's own grid.
DEFAULT_THRESHOLDS = tuple(float(t) for t in np.concatenate([np.linspace(0.3, 0.9, 31),
                                                             1 - np.geomspace(0.09, 0.001, 30)]))
DEFAULT_ENTROPIES = tuple(float(t) for t in np.geomspace(0.001, 0.7, 61))
DEFAULT_LAMS = LAM_GRID


def sweep(chain: FittedChain, probs: np.ndarray, labels: np.ndarray, horizon: int,
          lams: Iterable[float] = DEFAULT_LAMS, thresholds: Iterable[float] = DEFAULT_THRESHOLDS,
          entropies: Iterable[float] = DEFAULT_ENTROPIES) -> list[PolicyPoint]:
    """Every policy across its parameter sweep at one horizon (``chain`` supplies the index and the costs)."""
    cost = chain.cost
    n = probs.shape[1]
    pts = [replay(build_policy(chain, lam), probs, labels, cost, horizon, lam) for lam in lams]
    pts += [replay(ConfidenceThreshold(t), probs, labels, cost, horizon, t) for t in thresholds]
    pts += [replay(EntropyThreshold(t), probs, labels, cost, horizon, t) for t in entropies]
    pts += [replay(Patience(k), probs, labels, cost, horizon, k) for k in (1, 2)]
    pts += [replay(FixedExit(k), probs, labels, cost, horizon, k) for k in range(1, n + 1)]
    pts.append(replay(BudgetGreedy(), probs, labels, cost, horizon))
    pts.append(prophet(probs, labels, cost, horizon))
    return pts


def pareto_front(points: Sequence[PolicyPoint]) -> list[PolicyPoint]:
    """Points no other point beats on both cost (lower) and accuracy (higher), by increasing cost."""
    front: list[PolicyPoint] = []
    for p in sorted(points, key=lambda p: (p.mean_cost, -p.accuracy)):
        if not front or p.accuracy > front[-1].accuracy:
            front.append(p)
    return front


def cheapest_reaching(points: Sequence[PolicyPoint], accuracy: float) -> PolicyPoint | None:
    ok = [p for p in points if p.accuracy >= accuracy - 1e-12]
    return min(ok, key=lambda p: p.mean_cost) if ok else None


def cost_curve(points: Sequence[PolicyPoint], levels: np.ndarray) -> np.ndarray:
    """Cheapest cost reaching each accuracy level (inf where never reached)."""
    out = np.full(len(levels), np.inf)
    for i, a in enumerate(levels):
        p = cheapest_reaching(points, float(a))
        if p is not None:
            out[i] = p.mean_cost
    return out


def dominance(ours: Sequence[PolicyPoint], theirs: Sequence[PolicyPoint], final_accuracy: float,
              within: float = 0.02, step: float = 0.001) -> dict[str, Any]:
    """At each accuracy level from ``final - within`` up to the best either reaches, is our cost <= theirs?"""
    top = max(p.accuracy for p in [*ours, *theirs])
    levels = np.arange(final_accuracy - within, top + 1e-9, step)
    a, b = cost_curve(ours, levels), cost_curve(theirs, levels)
    reached = np.isfinite(a) | np.isfinite(b)
    worse = reached & (a > b + 1e-9)
    finite_worse = worse & np.isfinite(a)
    return {
        "levels": int(reached.sum()),
        "levels_not_worse": int((reached & ~worse).sum()),
        "levels_ours_never_reaches": int((reached & ~np.isfinite(a)).sum()),
        "worst_excess_cost": float(np.max(np.where(finite_worse, a - b, 0.0), initial=0.0)),
        "worse_at": [round(float(x), 4) for x in levels[worse]],
    }
