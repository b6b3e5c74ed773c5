"""Operating points of the dynamic index: the same fitted chain at other costs of waiting (lam), each with the
accuracy and the expected cost per frame it has on the calibration traces.

The fitted chain predicts what each lam costs (``replay_index`` on the calibration traces: the cost is exactly
what the policy would spend there), so when frames arrive faster than the box can take them at the fitted lam,
the app can move to a cheaper point it knows the price of, and back when the load falls
(``edge_app.decision.governor``). Point 0 is the model's own policy (``policy.json``); later points are cheaper.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, replace
from pathlib import Path

import numpy as np

from models.fit import LAM_GRID, build_policy, fit_chain, normalised_costs, replay_index
from models.folder import load_traces, policy_meta
from models.manifest import read_manifest
from models.policies import ConfidenceThreshold, DynamicIndex, ExitPolicy
from models.policy_store import stored_exit0


@dataclass(frozen=True)
class OperatingPoint:
    lam: float
    policy: ExitPolicy
    accuracy: float  # on the calibration traces
    cost: float  # mean cost per frame as a fraction of full depth (all exits), on the calibration traces

    def summary(self) -> dict[str, float | None]:
        """For ``/status`` (JSON: a policy with no fitted figures, a fixed exit say, has None, never NaN)."""
        def num(v: float, digits: int) -> float | None:
            return round(float(v), digits) if np.isfinite(v) else None

        return {"lam": num(self.lam, 6), "calibration_accuracy": num(self.accuracy, 4),
                "cost_fraction": num(self.cost, 4)}


def operating_points(folder: Path, policy: ExitPolicy, count: int = 8, costs_ms: Sequence[float] | None = None
                     ) -> list[OperatingPoint]:
    """``policy`` (the one configured) first, then up to ``count - 1`` cheaper dynamic-index points of the same
    chain, each cheaper than the one before; a confidence threshold's are lower thresholds (``threshold_points``).
    Other policies have no others.

    ``costs_ms``: the segments' costs as measured now (default: the manifest's). With them the index is re-solved
    from the same tables at the configured lam (``policy`` itself is then replaced by that re-solve): a segment
    that became dearer is worth going on to less often, and each point's cost is in today's shares."""
    manifest = read_manifest(folder)
    if isinstance(policy, ConfidenceThreshold):
        return threshold_points(folder, policy, count + 4, costs_ms)
    if not isinstance(policy, DynamicIndex):
        return [OperatingPoint(float("nan"), policy, float("nan"), 1.0)]
    meta = policy_meta(folder)
    probs, labels = load_traces(folder, manifest, str(meta["calibration_traces"]))
    chain = fit_chain(probs, labels, costs_ms or manifest.costs_ms, bins=int(meta.get("bins", 8)),
                      loss_kind=str(meta["loss_kind"]), statistic=str(meta.get("statistic", "confidence")),
                      isotonic=bool(meta.get("isotonic", False)))
    chain = replace(chain, exit0=stored_exit0(meta))  # exit 0 at every point, when fitted on video
    if costs_ms is not None:
        policy = build_policy(chain, policy.lam, policy.min_exit)
    acc, cost = replay_index(policy, probs, labels, chain.cost)
    points = [OperatingPoint(policy.lam, policy, acc, cost)]
    # lam weighs the loss against the cost: a smaller lam stops earlier and pays less
    lower = [float(x) for x in np.linspace(policy.lam, 0.0, 4 * count + 1)[1:]] + [lam for lam in LAM_GRID[:3]]
    for lam in lower:
        cand = build_policy(chain, lam, policy.min_exit)
        acc, cost = replay_index(cand, probs, labels, chain.cost)
        if cost < points[-1].cost - 0.01:
            points.append(OperatingPoint(lam, cand, acc, cost))
        if len(points) >= count:
            break
    return points


def resolve_points(folder: Path, policy: ExitPolicy, segment_ms: list[float]) -> list[OperatingPoint]:
    """``operating_points`` for the segment costs measured now (the load governor's re-solve)."""
    return operating_points(folder, policy, costs_ms=segment_ms)


def threshold_points(folder: Path, policy: ConfidenceThreshold, count: int = 12,
                     costs_ms: Sequence[float] | None = None) -> list[OperatingPoint]:
    """A confidence threshold's operating points: itself, then lower thresholds, each at least a point of full
    depth cheaper on the calibration traces (``lam`` holds the threshold). Other segment costs change what each
    costs, not the rule: a threshold cannot be re-solved, only re-tuned on traces."""
    from models.select import THRESHOLDS, per_frame

    manifest = read_manifest(folder)
    probs, labels = load_traces(folder, manifest, str(policy_meta(folder)["calibration_traces"]))
    cost = normalised_costs(costs_ms or manifest.costs_ms)
    paid, right = per_frame(policy, probs, labels, cost)
    points = [OperatingPoint(policy.threshold, policy, float(right.mean()), float(paid.mean()))]
    for t in sorted((t for t in THRESHOLDS if t < policy.threshold), reverse=True):
        cand = ConfidenceThreshold(t)
        paid, right = per_frame(cand, probs, labels, cost)
        if paid.mean() < points[-1].cost - 0.01:
            points.append(OperatingPoint(t, cand, float(right.mean()), float(paid.mean())))
        if len(points) >= count:
            break
    return points
