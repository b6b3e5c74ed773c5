"""Is the dynamic index worth its structure? Pareto fronts against tuned thresholds, with paired-bootstrap intervals.

Each policy family is replayed once per parameter on the test traces, frame by frame, into a (parameters, frames)
matrix of costs and of right answers. A family's front at an accuracy level is the cheapest mean cost among its
parameters whose accuracy reaches the level. The comparison resamples the test frames with replacement (the same
resample for both families: paired) and recomputes both fronts on each resample, so every level's cost
difference, and the area between the fronts (the mean difference over the levels both reach), gets a 95 %
percentile interval. A negative difference favours the first family (the index).

``costs`` are each segment's cost in units of the shipped full depth, so fronts under other segment costs (a
segment slowed by contention, a remote server's queue) compare on the same scale: the index is re-solved for
them from the same tables (``resolved``), a threshold's rule cannot change, only its parameter.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, replace
from typing import Any

import numpy as np

from models.evaluate import DEFAULT_ENTROPIES, DEFAULT_THRESHOLDS
from models.fit import LAM_GRID, FittedChain, build_policy
from models.policies import ConfidenceThreshold, EntropyThreshold, ExitPolicy
from models.select import per_frame


@dataclass(frozen=True)
class Family:
    name: str
    params: tuple[float, ...]
    cost: np.ndarray  # (P, N) cost each parameter paid on each frame (units of the shipped full depth)
    correct: np.ndarray  # (P, N) whether its answer was right


def replay_family(name: str, policies: Sequence[tuple[float, ExitPolicy]], probs: np.ndarray, labels: np.ndarray,
                  costs: np.ndarray) -> Family:
    rows = [per_frame(policy, probs, labels, costs) for _, policy in policies]
    return Family(name, tuple(float(x) for x, _ in policies), np.stack([c for c, _ in rows]),
                  np.stack([r for _, r in rows]))


def resolved(chain: FittedChain, costs: np.ndarray) -> FittedChain:
    """The same tables with other segment costs: the index solved for them needs no traces."""
    return replace(chain, cost=np.asarray(costs, float))


def index_family(chain: FittedChain, probs: np.ndarray, labels: np.ndarray, costs: np.ndarray,
                 name: str = "dynamic-index", lams: Sequence[float] = LAM_GRID, min_exit: int = 1) -> Family:
    c = resolved(chain, costs)
    return replay_family(name, [(lam, build_policy(c, lam, min_exit)) for lam in lams], probs, labels, costs)


def threshold_families(probs: np.ndarray, labels: np.ndarray, costs: np.ndarray) -> list[Family]:
    confidence = [(t, ConfidenceThreshold(t)) for t in DEFAULT_THRESHOLDS]
    entropy = [(t, EntropyThreshold(t)) for t in DEFAULT_ENTROPIES]
    return [replay_family("confidence", confidence, probs, labels, costs),
            replay_family("entropy", entropy, probs, labels, costs)]


def front(f: Family, weights: np.ndarray, levels: np.ndarray) -> np.ndarray:
    """Cheapest mean cost reaching each accuracy level on frames weighted by ``weights`` (inf: never reached)."""
    total = weights.sum()
    acc = f.correct @ weights / total
    cost = f.cost @ weights / total
    ok = acc[:, None] >= levels[None, :] - 1e-12
    out: np.ndarray = np.where(ok, cost[:, None], np.inf).min(axis=0)
    return out


def compare(a: Family, b: Family, levels: np.ndarray, resamples: int = 1000, seed: int = 0,
            blocks: np.ndarray | None = None) -> dict[str, Any]:
    """``a``'s cost minus ``b``'s at each level and on average over the levels both reach, with paired-bootstrap
    95 % intervals over the frames; with ``blocks`` (a block id per frame: consecutive frames of video, which are
    not independent), over whole blocks (a block bootstrap)."""
    n = a.cost.shape[1]
    ones = np.ones(n)
    point = front(a, ones, levels) - front(b, ones, levels)
    both = np.isfinite(point)
    rng = np.random.default_rng(seed)
    diffs = np.empty((resamples, len(levels)))
    ids, inverse = (np.arange(n), np.arange(n)) if blocks is None else np.unique(blocks, return_inverse=True)
    for r in range(resamples):
        w = np.bincount(rng.integers(0, len(ids), len(ids)), minlength=len(ids)).astype(float)[inverse]
        diffs[r] = front(a, w, levels) - front(b, w, levels)
    rows: list[dict[str, Any]] = []
    for i, level in enumerate(levels):
        d = diffs[:, i][np.isfinite(diffs[:, i])]
        lo, hi = (np.percentile(d, [2.5, 97.5]) if len(d) >= 0.9 * resamples else (np.nan, np.nan))
        rows.append({"level": round(float(level), 4), "diff": float(point[i]), "lo": float(lo), "hi": float(hi),
                     "reached": (bool(np.isfinite(front(a, ones, levels[i:i + 1])[0])),
                                 bool(np.isfinite(front(b, ones, levels[i:i + 1])[0])))})
    area = diffs[:, both]
    area = area[np.isfinite(area).all(axis=1)].mean(axis=1) if both.any() else np.array([np.nan])
    return {"a": a.name, "b": b.name, "rows": rows, "levels_both": int(both.sum()),
            "area": float(point[both].mean()) if both.any() else float("nan"),
            "area_lo": float(np.percentile(area, 2.5)), "area_hi": float(np.percentile(area, 97.5)),
            # levels both reach, by what the interval says; "unsettled": in over a tenth of the resamples one of the
            # fronts does not reach the level at all (the top levels), so there is no interval
            "cheaper": int(sum(1 for r in rows if np.isfinite(r["diff"]) and r["hi"] < 0)),
            "includes_0": int(sum(1 for r in rows if np.isfinite(r["diff"]) and r["lo"] <= 0 <= r["hi"])),
            "costlier": int(sum(1 for r in rows if np.isfinite(r["diff"]) and r["lo"] > 0)),
            "unsettled": int(sum(1 for r in rows if np.isfinite(r["diff"]) and np.isnan(r["lo"]))),
            "unsettled_point": [round(float(r["diff"]), 3) for r in rows
                                if np.isfinite(r["diff"]) and np.isnan(r["lo"])]}


def levels_below(final_accuracy: float, within: float = 0.02, step: float = 0.001) -> np.ndarray:
    return np.round(np.arange(final_accuracy - within, final_accuracy + 1e-9, step), 4)
