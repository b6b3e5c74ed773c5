"""Fit the dynamic index from calibration traces, choose lam, save and load the tables.

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

import json
import logging
import time
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np

from models.chain import ChainSolution, solve_horizons
from models.errors import PolicyError
from models.folder import POLICY_FILE, load_traces, policy_meta, trace_names
from models.manifest import read_manifest
from models.policies import (
    BudgetGreedy,
    ConfidenceThreshold,
    DynamicIndex,
    EntropyThreshold,
    ExitPolicy,
    FixedExit,
    Patience,
    run_on_trace,
)

log = logging.getLogger(__name__)

POLICY_FORMAT = 1
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
    sols = solve_horizons(chain.p1, list(chain.transitions), chain.loss, chain.cost, lam)
    return DynamicIndex(chain.bin_edges, sols, agreement=chain.agreement, answer_loss=chain.answer_loss,
                        min_exit=min_exit, statistic=chain.statistic)


# --- choosing lam ----------------------------------------------------------------------------------------------

LAM_GRID = tuple(float(r / (1 + r)) for r in np.logspace(-3, 3, 61))


def replay_index(policy: DynamicIndex, probs: np.ndarray, labels: np.ndarray, cost: np.ndarray,
                 horizon: int | None = None) -> tuple[float, float]:
    """(accuracy, mean normalised cost) of ``policy`` on traces."""
    horizon = horizon or probs.shape[1]
    cum = np.cumsum(cost)
    correct, paid = 0, 0.0
    for i in range(probs.shape[0]):
        ran, choice = run_on_trace(policy, probs[i], horizon)
        correct += int(probs[i, choice].argmax() == labels[i])
        paid += cum[ran - 1]
    return correct / len(labels), paid / len(labels)


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


def _finite_or_none(a: np.ndarray) -> Any:
    return [[None if not np.isfinite(v) else float(v) for v in row] for row in a]


def save_policy(folder: Path, chain: FittedChain, policy: DynamicIndex, calibration_sha256: str,
                extra: dict[str, Any]) -> Path:
    data = {
        "format_version": POLICY_FORMAT,
        "kind": "dynamic-index",
        "lam": policy.lam,
        "min_exit": policy.min_exit,
        "bins": chain.bins,
        "loss_kind": chain.loss_kind,
        "agreement": chain.agreement,
        "statistic": chain.statistic,
        "calibration_sha256": calibration_sha256,
        "bin_edges": chain.bin_edges.tolist(),
        "p1": chain.p1.tolist(),
        "transitions": chain.transitions.tolist(),
        "loss": chain.loss.tolist(),
        "cost": chain.cost.tolist(),
        "sigma_by_horizon": [_finite_or_none(s.sigma) for s in policy.solutions],
        "answer_loss": None if policy.answer_loss is None else [
            _finite_or_none(policy.answer_loss[j, k]) for j in range(chain.loss.shape[0])
            for k in range(chain.loss.shape[0])],
        "expected_objective_by_horizon": [s.expected_objective for s in policy.solutions],
        **extra,
    }
    path = folder / POLICY_FILE
    path.write_text(json.dumps(data, indent=1) + "\n")
    return path


def load_policy(folder: Path, n_exits: int, calibration_sha256: str | None = None) -> DynamicIndex:
    """The saved tables, checked against the model; no refitting."""
    path = folder / POLICY_FILE
    if not path.is_file():
        raise PolicyError(f"{path} is missing: fit it with 'edge-app fit-policy --model {folder}'")
    try:
        d = json.loads(path.read_text())
        if d.get("format_version") != POLICY_FORMAT:
            raise PolicyError(f"{path}: format_version {d.get('format_version')} is not {POLICY_FORMAT}")
        edges = np.asarray(d["bin_edges"], float).reshape(n_exits, d["bins"] - 1)
        lam = float(d["lam"])
        R = lam * np.asarray(d["loss"], float)
        m = len(d["p1"])
        sols = []
        for K, (sig, obj) in enumerate(zip(d["sigma_by_horizon"], d["expected_objective_by_horizon"],
                                           strict=True), 1):
            sigma = np.array([[np.inf if v is None else v for v in row] for row in sig], float)
            if sigma.shape != (K, m):
                raise PolicyError(f"{path}: sigma table for horizon {K} has shape {sigma.shape}")
            sols.append(ChainSolution(sigma, float(obj), R[:K], lam))
        answer = None
        if d.get("answer_loss") is not None:  # absent in tables written before it existed: marginal recall
            answer = np.array([[np.inf if v is None else v for v in row] for block in d["answer_loss"]
                               for row in block], float).reshape(n_exits, n_exits, m, m)
    except (KeyError, TypeError, ValueError, json.JSONDecodeError) as exc:
        raise PolicyError(f"{path} is not a valid policy table ({exc}); refit with 'edge-app fit-policy'") from exc
    if len(sols) != n_exits:
        raise PolicyError(f"{path} has tables for {len(sols)} exits, the model has {n_exits}")
    if calibration_sha256 and d.get("calibration_sha256") != calibration_sha256:
        raise PolicyError(f"{path} was fitted on other calibration traces than the model's; refit it")
    statistic = str(d.get("statistic", "confidence"))  # tables written before it existed: confidence bins
    if statistic not in STATISTICS:
        raise PolicyError(f"{path}: statistic {statistic!r} is not one of {STATISTICS}; refit with 'edge-app "
                          "fit-policy'")
    return DynamicIndex(edges, sols, agreement=bool(d.get("agreement", False)), answer_loss=answer,
                        min_exit=int(d.get("min_exit", 1)), statistic=statistic)


def fit_policy(folder: Path, bins: int = 8, lam: float | None = None, target_accuracy: float | None = None,
               loss_kind: str = "auto", traces: str = "auto", min_exit: int = 1) -> dict[str, Any]:
    """Fit on the calibration traces, choose lam, write ``policy.json``; returns what was chosen.

    ``traces``: which calibration traces (``trace_names``); the VP8-coded ones when the folder has them.
    ``min_exit``: the policy's floor (``DynamicIndex``); lam is chosen with it in force."""
    manifest = read_manifest(folder)
    t0 = time.perf_counter()
    cal_name = trace_names(manifest, traces)[0]
    probs, labels = load_traces(folder, manifest, cal_name)
    final_acc = float((probs[:, -1].argmax(-1) == labels).mean())
    kinds = LOSS_KINDS if loss_kind == "auto" else (loss_kind,)
    target = None if lam is not None else (final_acc - 0.01 if target_accuracy is None else target_accuracy)
    best: tuple[float, float, float, FittedChain] | None = None
    for kind in kinds:  # "auto": the loss kind whose policy is cheaper at the target, on the calibration traces
        chain = fit_chain(probs, labels, manifest.costs_ms, bins=bins, loss_kind=kind)
        if lam is None:
            assert target is not None
            k_lam, acc, cost = lam_for_target(chain, probs, labels, target, min_exit)
        else:
            k_lam = lam
            acc, cost = replay_index(build_policy(chain, lam, min_exit), probs, labels, chain.cost)
        if best is None or (acc >= (target or 0.0) and cost < best[2]):
            best = (k_lam, acc, cost, chain)
    assert best is not None
    lam, acc, cost, chain = best
    policy = build_policy(chain, lam, min_exit)
    default = _default_policy(probs, labels, manifest.costs_ms, chain, policy, target)
    seconds = time.perf_counter() - t0
    info = {"lam": lam, "min_exit": policy.min_exit, "loss_kind": chain.loss_kind, "calibration_traces": cal_name,
            "target_accuracy": target, "calibration_accuracy": acc,
            "calibration_cost": cost, "calibration_final_exit_accuracy": final_acc, "calibration_frames": len(labels),
            "fit_seconds": round(seconds, 3), "default": default}
    path = save_policy(folder, chain, policy, manifest.traces[cal_name].sha256, info)
    log.info("wrote %s: fitted on %s traces, lam=%.4f, calibration accuracy %.4f at cost %.3f of full depth "
             "(%.2fs)", path, cal_name, lam, acc, cost, seconds)
    return info


def _default_policy(probs: np.ndarray, labels: np.ndarray, costs_ms: Sequence[float], chain: FittedChain,
                    policy: DynamicIndex, target: float | None) -> dict[str, Any]:
    """What ``[policy] kind = "auto"`` serves: the index or a tuned confidence threshold, whichever held-out
    calibration frames favour (``models.select``); the threshold tuned on every calibration frame."""
    from models.select import choose_default, tuned_threshold

    if policy.min_exit > 1:  # a floor from a taught model's check: only the index keeps it
        return {"kind": "dynamic-index", "why": f"the policy has a floor (exit {policy.min_exit}) a threshold lacks"}
    choice = choose_default(probs, labels, costs_ms, {"bins": chain.bins, "loss_kind": chain.loss_kind,
                                                      "statistic": chain.statistic}, policy.min_exit)
    if choice["kind"] == "confidence":
        goal = target if target is not None else replay_index(policy, probs, labels, chain.cost)[0]
        choice["threshold"] = tuned_threshold(probs, labels, chain.cost, goal)
    return choice


# --- the policy a configuration asks for -----------------------------------------------------------------------

POLICY_KINDS = ("auto", "dynamic-index", "fixed", "confidence", "entropy", "patience", "budget-greedy")


def configured_policy(folder: Path, kind: str, lam: float | None = None, target_accuracy: float | None = None,
                      threshold: float = 0.9, fixed_exit: int = 3) -> ExitPolicy:
    """The exit policy ``[policy]`` asks for; the dynamic index comes from the model's ``policy.json``, refitted in
    memory on the model's calibration traces when ``lam`` or ``target_accuracy`` is set. ``auto``: what
    ``fit-policy`` chose on held-out calibration frames (``models.select``; the index for a table without a
    choice)."""
    manifest = read_manifest(folder)
    if kind == "auto":
        default = policy_meta(folder).get("default") or {}
        if default.get("kind") == "confidence" and lam is None and target_accuracy is None:
            return ConfidenceThreshold(float(default["threshold"]))
        kind = "dynamic-index"
    n = len(manifest.exits)
    simple: dict[str, ExitPolicy] = {"fixed": FixedExit(min(fixed_exit, n)),
                                     "confidence": ConfidenceThreshold(threshold),
                                     "entropy": EntropyThreshold(1 - threshold), "patience": Patience(1),
                                     "budget-greedy": BudgetGreedy()}
    if kind in simple:
        return simple[kind]
    if kind != "dynamic-index":
        raise PolicyError(f"unknown policy kind {kind!r}; choose from {POLICY_KINDS}")
    meta = policy_meta(folder)
    cal_name = str(meta["calibration_traces"])
    if cal_name not in manifest.traces:
        raise PolicyError(f"{folder / POLICY_FILE} was fitted on {cal_name!r} traces, which the model's manifest does "
                          f"not list; refit it with 'edge-app fit-policy --model {folder}'")
    if lam is None and target_accuracy is None:
        return load_policy(folder, n, manifest.traces[cal_name].sha256)
    probs, labels = load_traces(folder, manifest, cal_name)
    chain = fit_chain(probs, labels, manifest.costs_ms, loss_kind=str(meta["loss_kind"]))
    floor = int(meta.get("min_exit", 1))
    lam = lam if lam is not None else lam_for_target(chain, probs, labels, target_accuracy or 1.0, floor)[0]
    return build_policy(chain, lam, floor)
