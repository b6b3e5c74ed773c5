"""A model folder's exit policy on disk: ``policy.json`` written and read back (checked against the model and its
calibration), ``fit_policy`` (what ``edge-app fit-policy`` runs) and ``configured_policy`` (``[policy]`` -> the
policy served)."""

from __future__ import annotations

import json
import logging
import time
from collections.abc import Sequence
from dataclasses import replace
from pathlib import Path
from typing import Any

import numpy as np

from models.chain import ChainSolution
from models.errors import PolicyError
from models.fit import LOSS_KINDS, STATISTICS, FittedChain, build_policy, fit_chain, lam_for_target, replay_index
from models.folder import CLIPS_CALIBRATION, POLICY_FILE, load_traces, policy_meta, trace_names
from models.manifest import read_manifest
from models.policies import (
    BudgetGreedy,
    ConfidenceThreshold,
    DynamicIndex,
    EntropyThreshold,
    ExitPolicy,
    FixedExit,
    Patience,
)
from models.video import MAX_SINCE, Exit0Fit, exit0_from_json, exit0_to_json

log = logging.getLogger(__name__)

POLICY_FORMAT = 1


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
        "exit0": None if chain.exit0 is None or policy.exit0 is None else exit0_to_json(chain.exit0, policy.exit0),
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
        exit0 = None if d.get("exit0") is None else exit0_from_json(d["exit0"], lam)[1]
    except (KeyError, TypeError, ValueError, json.JSONDecodeError) as exc:
        raise PolicyError(f"{path} is not a valid policy table ({exc}); refit with 'edge-app fit-policy'") from exc
    if exit0 is not None and exit0.sigma.shape[0] != n_exits:
        raise PolicyError(f"{path}: exit 0 has tables for {exit0.sigma.shape[0]} horizons, the model has {n_exits}")
    if len(sols) != n_exits:
        raise PolicyError(f"{path} has tables for {len(sols)} exits, the model has {n_exits}")
    if calibration_sha256 and d.get("calibration_sha256") != calibration_sha256:
        raise PolicyError(f"{path} was fitted on other calibration traces than the model's; refit it")
    statistic = str(d.get("statistic", "confidence"))  # tables written before it existed: confidence bins
    if statistic not in STATISTICS:
        raise PolicyError(f"{path}: statistic {statistic!r} is not one of {STATISTICS}; refit with 'edge-app "
                          "fit-policy'")
    return DynamicIndex(edges, sols, agreement=bool(d.get("agreement", False)), answer_loss=answer,
                        min_exit=int(d.get("min_exit", 1)), statistic=statistic, exit0=exit0)


def stored_exit0(meta: dict[str, Any]) -> Exit0Fit | None:
    """Exit 0's fit as ``policy.json`` keeps it (``models.folder.policy_meta``'s header; None: fitted without
    video), to re-solve at another lam."""
    if meta.get("exit0") is None:
        return None
    try:
        return exit0_from_json(meta["exit0"], float(meta["lam"]))[0]
    except (KeyError, TypeError, ValueError) as exc:
        raise PolicyError(f"policy.json's exit 0 is not valid ({exc}); refit with 'edge-app fit-policy'") from exc


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
    video = None
    if CLIPS_CALIBRATION in manifest.traces:  # exit 0 in front, fitted on clips, lam chosen on them
        from models.video_fit import fit_on_video

        chain, lam, video = fit_on_video(folder, manifest, chain, lam, min_exit)
        policy = build_policy(chain, lam, min_exit)
        default = {"kind": "dynamic-index", "why": (
            f"fitted on video with exit 0: on the calibration clips {100 * video['accuracy']:.2f} % (full depth on "
            f"every frame {100 * video['full_depth_accuracy']:.2f} %) at {video['cost']:.3f} of full depth, a change "
            f"noticed within {video['notice_frames_p95'] or 0:.0f} frames at p95; a per-frame rule cannot skip a frame "
            "(edge-app compare-video compares them on held-out clips)"), "per_frame": default}
    seconds = time.perf_counter() - t0
    info = {"lam": lam, "min_exit": policy.min_exit, "loss_kind": chain.loss_kind, "calibration_traces": cal_name,
            "target_accuracy": target, "calibration_accuracy": acc,
            "calibration_cost": cost, "calibration_final_exit_accuracy": final_acc, "calibration_frames": len(labels),
            "fit_seconds": round(seconds, 3), "default": default, "video": video}
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
    chain = replace(fit_chain(probs, labels, manifest.costs_ms, loss_kind=str(meta["loss_kind"])),
                    exit0=stored_exit0(meta))
    floor = int(meta.get("min_exit", 1))
    lam = lam if lam is not None else lam_for_target(chain, probs, labels, target_accuracy or 1.0, floor)[0]
    return build_policy(chain, lam, floor)


def describe_policy(policy: ExitPolicy, folder: Path, kind: str, lam: float | None = None,
                    target_accuracy: float | None = None) -> dict[str, Any]:
    """What ``/status`` shows of the policy served (``configured_policy``'s answer for the same arguments): its kind,
    its parameters, and where they came from."""
    if isinstance(policy, DynamicIndex):
        params: dict[str, Any] = {"lam": round(policy.lam, 6), "min_exit": policy.min_exit,
                                  "bins": int(policy.bin_edges.shape[1]) + 1, "statistic": policy.statistic}
        if policy.exit0 is not None:
            params["exit0"] = {"states": policy.exit0.bins.count, "max_since_frames": MAX_SINCE,
                               "cost_share_of_full_depth": round(policy.exit0.cost, 5)}
    else:
        params = {k: round(v, 6) if isinstance(v, float) else v for k, v in vars(policy).items() if k != "name"}
    source = f"[policy] kind = {kind!r}"
    if kind in ("auto", "dynamic-index"):
        meta = policy_meta(folder)
        fitted = f"{folder / POLICY_FILE}, fitted on the {meta.get('calibration_traces')} calibration traces"
        default = meta.get("default") or {}
        why = default.get("why") if kind == "auto" else None
        if isinstance(policy, ConfidenceThreshold):
            source = f"{fitted}: fit-policy's choice on held-out calibration frames ([policy] kind = 'auto')"
            held = default.get("held_out") or {}
            if "cost_difference_interval" in held:
                lo, hi = held["cost_difference_interval"]
                why = (f"as accurate as the index ({held.get('confidence', {}).get('accuracy')}) and cheaper by "
                       f"{held['cost_difference']:.3f} [{lo:.3f}, {hi:.3f}] of full depth on "
                       f"{held.get('frames')} held-out frames")
        elif lam is not None or target_accuracy is not None:
            key = f"lam = {lam}" if lam is not None else f"target_accuracy = {target_accuracy}"
            source = f"refitted at load on the model's calibration traces for [policy] {key}"
        else:
            source = fitted + ("" if kind != "auto" else " ([policy] kind = 'auto': the index)")
        if why:
            params["why"] = why
    return {"kind": policy.name, **params, "from": source}
