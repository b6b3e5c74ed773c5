"""Fit the dynamic index from calibration traces and choose lam (the tables on disk: ``models.policy_store``).

States are quantile bins of each exit's confidence (max softmax): with ``m``
bins, exit k's inner edges are the ``1/m, ..., (m-1)/m`` quantiles of its
confidence on the calibration frames, so every state is about equally often
seen and no bin is empty by construction.  Transitions and the first-exit
distribution are Laplace-smoothed counts.  Node losses are the calibrated
error of the exit given its bin, shrunk towards the exit's overall error
``e_k``: ``(errors + 2 e_k) / (frames + 2)`` (strictly positive; and where
several bins saw no error, the deeper, better exit still gets the lower
loss, so recall does not prefer a shallow exit on a tie); ``loss_kind="one-minus-confidence"`` uses the
paper's proxy, the bin's mean ``1 - confidence``.  Costs are each segment's
cost normalised by full depth.

The answer, once the run stops after exit k, is the seen exit j of lowest
``answer_loss[j, k, s_j, s_k]``: exit j's error on the calibration frames
that had state s_j at exit j and s_k at exit k, shrunk towards its error
given s_j alone with the weight of ``ANSWER_PRIOR`` frames (``answer_loss[k,
k, ., b]`` is exit k's own calibrated error in bin b).  It is a property of
the traces, the same for every lam and horizon.
"""

from __future__ import annotations

import logging
from collections.abc import Sequence
from dataclasses import dataclass

import numpy as np

from models.chain import solve_horizons
from models.policies import (
    DynamicIndex,
)
from models.video import Exit0Fit, solve_exit0

log = logging.getLogger(__name__)

LOSS_KINDS = ("error", "one-minus-confidence")
STATISTICS = ("confidence", "margin")  # what an exit's state bins: its max softmax, or top-1 minus top-2
MIN_LOSS = 1e-6
ANSWER_PRIOR = 5.0  # frames' weight of exit j's error given its own state, in its error given (s_j, s_k)


@dataclass(frozen=True)
class FittedChain:
    bin_edges: np.ndarray  # (n, m-1)
    p1: np.ndarray  # (m,)
    transitions: np.ndarray  # (n-1, m, m)
    loss: np.ndarray  # (n, m)
    cost: np.ndarray  # (n,)
    loss_kind: str
    agreement: bool = False  # state = (confidence bin, agrees with the previous exit's class)
    answer_loss: np.ndarray | None = None  # (n, n, m, m): error of exit j given s_j and the last exit k's s_k
    statistic: str = "confidence"  # what the bins are of (``STATISTICS``)
    exit0: Exit0Fit | None = None  # the last answer's stage, fitted on video (``models.video``)

    @property
    def bins(self) -> int:
        """Confidence bins per exit (the state count is twice that with ``agreement``)."""
        return int(self.bin_edges.shape[1] + 1)


def statistic_of(probs: np.ndarray, kind: str = "confidence") -> np.ndarray:
    """(..., C) softmax -> (...) the statistic an exit's state bins: "confidence" (max softmax) or "margin" (top-1
    minus top-2: a confident exit torn between two classes has a small margin)."""
    if kind == "confidence":
        out: np.ndarray = probs.max(-1)
        return out
    if kind != "margin":
        raise ValueError(f"statistic {kind!r} is not one of {STATISTICS}")
    top2 = np.partition(probs, -2, axis=-1)[..., -2:]
    margin: np.ndarray = top2[..., 1] - top2[..., 0]
    return margin


def states_of(probs: np.ndarray, bin_edges: np.ndarray, agreement: bool = False, statistic: str = "confidence"
              ) -> np.ndarray:
    """(N, n, C) softmax traces -> (N, n) state index, exactly as the online policy computes it.

    The state is exit k's bin of ``statistic``; with ``agreement`` it is ``bin + bins * a`` where ``a`` says
    whether exit k's class equals exit k-1's (always 0 at the first exit).
    """
    conf = statistic_of(probs, statistic)
    states = np.stack([np.searchsorted(bin_edges[k], conf[:, k], side="right") for k in range(conf.shape[1])], 1)
    if agreement:
        labels = probs.argmax(-1)
        agree = np.zeros_like(labels)
        agree[:, 1:] = labels[:, 1:] == labels[:, :-1]
        states = states + (bin_edges.shape[1] + 1) * agree
    return states


def normalised_costs(costs_ms: Sequence[float]) -> np.ndarray:
    c = np.asarray(costs_ms, float)
    if (c < 0).any() or c.sum() <= 0:
        raise ValueError(f"segment costs {list(c)} must be non-negative with a positive sum")
    out: np.ndarray = c / c.sum()
    return out


def fit_chain(probs: np.ndarray, labels: np.ndarray, costs_ms: Sequence[float], bins: int = 8,
              loss_kind: str = "error", laplace: float = 1.0, agreement: bool = False,
              statistic: str = "confidence", isotonic: bool = False) -> FittedChain:
    """Estimate the chain from traces ``probs`` (N, n, C) with labels (N,). ``statistic``: what the bins are of;
    ``isotonic``: each exit's calibrated error is made non-increasing in its statistic (pool adjacent violators,
    weighted by the bins' frames), so a noisy bin cannot say a surer exit is worse."""
    if loss_kind not in LOSS_KINDS:
        raise ValueError(f"loss_kind {loss_kind!r} is not one of {LOSS_KINDS}")
    if bins < 1:
        raise ValueError("bins must be >= 1")
    n_frames, n, _ = probs.shape
    if len(costs_ms) != n:
        raise ValueError(f"{len(costs_ms)} costs for {n} exits")
    conf = statistic_of(probs, statistic)
    correct = probs.argmax(-1) == labels[:, None]
    qs = np.arange(1, bins) / bins
    edges = np.stack([np.quantile(conf[:, k], qs) for k in range(n)]) if bins > 1 else np.zeros((n, 0))
    states = states_of(probs, edges, agreement, statistic)
    n_bins = bins
    bins = n_bins * (2 if agreement else 1)
    p1 = np.bincount(states[:, 0], minlength=bins) + laplace * (np.arange(bins) < n_bins)
    p1 = p1 / p1.sum()
    trans = np.empty((max(n - 1, 0), bins, bins))
    for k in range(n - 1):
        counts = np.full((bins, bins), laplace)
        np.add.at(counts, (states[:, k], states[:, k + 1]), 1)
        trans[k] = counts / counts.sum(axis=1, keepdims=True)
    loss = np.empty((n, bins))
    exit_error = np.clip(1 - correct.mean(axis=0), 1 / (n_frames + 2), None)
    for k in range(n):
        for s in range(bins):
            mask = states[:, k] == s
            if loss_kind == "error":  # shrunk towards the exit's overall error rate (prior weight 2 frames)
                loss[k, s] = (np.count_nonzero(~correct[mask, k]) + 2 * exit_error[k]) / (np.count_nonzero(mask) + 2)
            else:
                loss[k, s] = (1 - conf[mask, k]).mean() if mask.any() else 1 - (s % n_bins + 0.5) / n_bins
    if isotonic and loss_kind == "error":
        for k in range(n):
            for block in range(bins // n_bins):
                sl = slice(block * n_bins, (block + 1) * n_bins)
                seen = np.bincount(states[:, k], minlength=bins)[sl] + 2.0
                loss[k, sl] = non_increasing(loss[k, sl], seen)
    loss = np.maximum(loss, MIN_LOSS)
    answer = answer_losses(states, correct, bins, exit_error)
    log.debug("fitted chain on %d frames: %d exits, %d bins", n_frames, n, bins)
    return FittedChain(edges, p1, trans, loss, normalised_costs(costs_ms), loss_kind, agreement, answer, statistic)


def non_increasing(values: np.ndarray, weights: np.ndarray) -> np.ndarray:
    """The weighted least-squares non-increasing fit of ``values`` (pool adjacent violators; a dozen lines, not a
    scikit-learn dependency)."""
    blocks: list[list[float]] = []  # [mean, weight, count]
    for v, w in zip(values, weights, strict=True):
        blocks.append([float(v), float(w), 1])
        while len(blocks) > 1 and blocks[-2][0] < blocks[-1][0]:
            m2, w2, c2 = blocks.pop()
            m1, w1, c1 = blocks.pop()
            blocks.append([(m1 * w1 + m2 * w2) / (w1 + w2), w1 + w2, c1 + c2])
    return np.concatenate([np.full(int(c), m) for m, _, c in blocks])


def answer_losses(states: np.ndarray, correct: np.ndarray, m: int, exit_error: np.ndarray) -> np.ndarray:
    """(n, n, m, m) table: [j, k, a, b] = error of exit j in state a on frames where exit k was in state b."""
    n = states.shape[1]
    own = np.empty((n, m))  # error given the exit's own state, shrunk towards its overall error (2 frames)
    for j in range(n):
        errors = np.bincount(states[:, j], weights=(~correct[:, j]).astype(float), minlength=m)
        own[j] = (errors + 2 * exit_error[j]) / (np.bincount(states[:, j], minlength=m) + 2)
    table = np.full((n, n, m, m), np.inf)  # j > k: not seen yet when k is the last exit run
    for k in range(n):
        table[k, k] = own[k][None, :]  # exit k's own answer: its state is s_k, whatever a says
        for j in range(k):
            wrong = np.zeros((m, m))
            seen = np.zeros((m, m))
            np.add.at(wrong, (states[:, j], states[:, k]), (~correct[:, j]).astype(float))
            np.add.at(seen, (states[:, j], states[:, k]), 1)
            table[j, k] = (wrong + ANSWER_PRIOR * own[j][:, None]) / (seen + ANSWER_PRIOR)
    out: np.ndarray = np.maximum(table, MIN_LOSS)
    return out


def build_policy(chain: FittedChain, lam: float, min_exit: int = 1) -> DynamicIndex:
    """The index at ``lam``. With exit 0, exits 1..n's node losses count ``hold`` times: an answer the model gives
    is served until the picture changes (exit 0 holds it), while a wrong last answer at exit 0 costs about one frame
    (the change stays in view, and the next frame decides again)."""
    loss = chain.loss if chain.exit0 is None else chain.loss * chain.exit0.hold
    sols = solve_horizons(chain.p1, list(chain.transitions), loss, chain.cost, lam)
    exit0 = None if chain.exit0 is None else solve_exit0(chain.exit0, chain.transitions, loss, chain.cost, lam)
    return DynamicIndex(chain.bin_edges, sols, agreement=chain.agreement, answer_loss=chain.answer_loss,
                        min_exit=min_exit, statistic=chain.statistic, exit0=exit0)


# --- choosing lam ----------------------------------------------------------------------------------------------

LAM_GRID = tuple(float(r / (1 + r)) for r in np.logspace(-3, 3, 61))


def replay_index(policy: DynamicIndex, probs: np.ndarray, labels: np.ndarray, cost: np.ndarray,
                 horizon: int | None = None) -> tuple[float, float]:
    """(accuracy, mean normalised cost) of ``policy`` on traces."""
    ran, choice = replay_frames(policy, probs, horizon or probs.shape[1])
    rows = np.arange(len(labels))
    correct = probs[rows, choice].argmax(-1) == labels
    return float(correct.mean()), float(np.cumsum(cost)[ran - 1].mean())


def replay_frames(policy: DynamicIndex, probs: np.ndarray, horizon: int) -> tuple[np.ndarray, np.ndarray]:
    """(exits run, answering exit) of every frame of ``probs`` (N, n, C): what ``run_on_trace`` gives frame by
    frame (the same comparisons, in float64), for all frames at once (operating points and fits replay the
    calibration traces dozens of times; frame by frame that took 0.35 s a model load, holding the GIL)."""
    sol = policy.solutions[min(horizon, len(policy.solutions)) - 1]
    n_frames, n = probs.shape[0], sol.sigma.shape[0]
    p = probs[:, :n].astype(np.float64)
    if policy.statistic == "margin":
        top2 = np.partition(p, -2, axis=-1)[..., -2:]
        stat = top2[..., 1] - top2[..., 0]
    else:
        stat = p.max(-1)
    states = np.stack([np.searchsorted(policy.bin_edges[k], stat[:, k], side="right") for k in range(n)], 1)
    if policy.agreement:
        label = p.argmax(-1)
        states[:, 1:] += np.where(label[:, 1:] == label[:, :-1], policy.bin_edges.shape[1] + 1, 0)
    floor = min(policy.min_exit, n) - 1
    rows = np.arange(n_frames)
    best = np.full(n_frames, np.inf)
    choice = np.zeros(n_frames, int)
    ran = np.zeros(n_frames, int)
    active = np.ones(n_frames, bool)
    for k in range(n):
        s = states[:, k]
        r = sol.weighted_loss[k, s]
        if k < floor:
            choice[active] = k
            continue
        better = active & (r <= best)
        best[better], choice[better] = r[better], k
        stop = active & (best <= sol.sigma[k, s])
        ran[stop] = k + 1
        active &= ~stop
    ran[active] = n  # sigma is +inf at the horizon's last exit: never reached
    if policy.answer_loss is not None:
        table, last = policy.answer_loss, ran - 1
        many = ran >= 2
        answer = last.copy()
        s_last = states[rows, last]
        for j in range(n - 2, -1, -1):
            ok = many & (j < last) & (j >= np.minimum(floor, last))
            cand = table[j, last, states[:, j], s_last]
            cur = table[answer, last, states[rows, answer], s_last]
            take = ok & (cand < cur)
            answer[take] = j
        choice = np.where(many, answer, choice)
    return ran, choice


def lam_for_target(chain: FittedChain, probs: np.ndarray, labels: np.ndarray, target_accuracy: float,
                   min_exit: int = 1) -> tuple[float, float, float]:
    """The lam of the cheapest policy whose accuracy on the calibration traces reaches the target.

    Returns (lam, accuracy, cost); if no lam reaches the target, the most accurate one, with a warning.
    """
    best: tuple[float, float, float] | None = None
    most_accurate = (0.0, -1.0, 0.0)
    for lam in LAM_GRID:
        acc, cost = replay_index(build_policy(chain, lam, min_exit), probs, labels, chain.cost)
        if acc >= target_accuracy and (best is None or cost < best[2]):
            best = (lam, acc, cost)
        if acc > most_accurate[1]:
            most_accurate = (lam, acc, cost)
    if best is None:
        log.warning("no lam reaches accuracy %.3f on the calibration traces; using the most accurate (%.3f)",
                    target_accuracy, most_accurate[1])
        return most_accurate
    return best


# --- saving and loading ----------------------------------------------------------------------------------------
