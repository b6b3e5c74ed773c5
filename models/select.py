"""Which policy serves by default: the dynamic index or a tuned confidence threshold, chosen on held-out frames.

The calibration frames are split in two halves (a fixed shuffle). On one half the index's chain is fitted and both
policies are tuned to the same target (the cheapest lam, the cheapest threshold reaching it); on the other half
both are replayed frame by frame. The default is the cheaper one there when their held-out accuracies are within
``TIE`` of each other, else the more accurate; the paired-bootstrap intervals of the differences (index minus
threshold, over the held-out frames) go into ``policy.json`` with the choice, so the page and the docs can say
which and why. ``[policy] kind = "auto"`` serves that choice (``models.fit.configured_policy``).
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import numpy as np

from models.evaluate import DEFAULT_THRESHOLDS
from models.fit import build_policy, fit_chain, lam_for_target
from models.policies import ConfidenceThreshold, ExitPolicy, run_on_trace

THRESHOLDS = DEFAULT_THRESHOLDS  # the thresholds `edge-app evaluate` sweeps
TIE = 0.005  # held-out accuracies this close: the cheaper policy


def per_frame(policy: ExitPolicy, probs: np.ndarray, labels: np.ndarray, cost: np.ndarray) -> tuple[np.ndarray,
                                                                                                       np.ndarray]:
    """(cost, right) of ``policy`` on each frame, at full horizon."""
    cum = np.cumsum(cost)
    paid = np.empty(len(labels))
    right = np.empty(len(labels), bool)
    for i in range(len(labels)):
        ran, choice = run_on_trace(policy, probs[i], probs.shape[1])
        paid[i], right[i] = cum[ran - 1], probs[i, choice].argmax() == labels[i]
    return paid, right


def tuned_threshold(probs: np.ndarray, labels: np.ndarray, cost: np.ndarray, target: float) -> float:
    """The cheapest confidence threshold whose accuracy on these frames reaches ``target`` (else the most
    accurate)."""
    best: tuple[float, float] | None = None  # (cost, threshold)
    top = (-1.0, THRESHOLDS[-1])
    for t in THRESHOLDS:
        paid, right = per_frame(ConfidenceThreshold(t), probs, labels, cost)
        if right.mean() >= target and (best is None or paid.mean() < best[0]):
            best = (float(paid.mean()), t)
        if right.mean() > top[0]:
            top = (float(right.mean()), t)
    return best[1] if best is not None else top[1]


def _interval(diff: np.ndarray, resamples: int, rng: np.random.Generator) -> list[float]:
    n = len(diff)
    means = np.array([diff[rng.integers(0, n, n)].mean() for _ in range(resamples)])
    return [float(np.percentile(means, 2.5)), float(np.percentile(means, 97.5))]


def choose_default(probs: np.ndarray, labels: np.ndarray, costs_ms: Sequence[float], chain_args: dict[str, Any],
                   min_exit: int = 1, seed: int = 0, resamples: int = 1000) -> dict[str, Any]:
    """The held-out comparison and the choice (``kind``: "dynamic-index" or "confidence")."""
    order = np.random.default_rng(seed).permutation(len(labels))
    a, b = order[: len(order) // 2], order[len(order) // 2:]
    chain = fit_chain(probs[a], labels[a], costs_ms, **chain_args)
    target = float((probs[a, -1].argmax(-1) == labels[a]).mean()) - 0.01
    lam = lam_for_target(chain, probs[a], labels[a], target, min_exit)[0]
    threshold = tuned_threshold(probs[a], labels[a], chain.cost, target)
    ci, ri = per_frame(build_policy(chain, lam, min_exit), probs[b], labels[b], chain.cost)
    ct, rt = per_frame(ConfidenceThreshold(threshold), probs[b], labels[b], chain.cost)
    rng = np.random.default_rng(seed + 1)
    held: dict[str, Any] = {"frames": len(b), "target_accuracy": target,
            "index": {"lam": lam, "accuracy": float(ri.mean()), "cost": float(ci.mean())},
            "confidence": {"threshold": threshold, "accuracy": float(rt.mean()), "cost": float(ct.mean())},
            "cost_difference": float((ci - ct).mean()), "cost_difference_interval": _interval(ci - ct, resamples, rng),
            "accuracy_difference": float((ri.astype(float) - rt).mean()),
            "accuracy_difference_interval": _interval(ri.astype(float) - rt, resamples, rng)}
    if abs(held["accuracy_difference"]) <= TIE:
        kind = "dynamic-index" if held["cost_difference"] <= 0 else "confidence"
    else:
        kind = "dynamic-index" if held["accuracy_difference"] > 0 else "confidence"
    return {"kind": kind, "held_out": held}
