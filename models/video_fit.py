"""Fit exit 0 on a model's calibration clips and choose lam and the hold on them (``fit-policy`` with clips).

``fit_on_video``: the frame-level chain (``models.fit``) with exit 0 fitted in front of it on the model folder's
calibration clips (``models.video``), and the (lam, hold) of the cheapest index whose accuracy on those clips, every
frame counted against the label of its moment, is within ``within`` of full depth on every frame (both smoothed as
served), and whose time to notice a change on the static clips (the changes full depth notices there) is at most
``NOTICE_FRAMES`` at p95. Exit 0's cost is measured here as the serve path pays it (``exit0_cost``).
"""

from __future__ import annotations

import time
from collections.abc import Callable
from dataclasses import replace
from pathlib import Path
from typing import Any

import numpy as np

from models.fit import LAM_GRID, FittedChain, build_policy, states_of
from models.folder import CLIPS_CALIBRATION, load_clips
from models.manifest import Manifest
from models.policies import FixedExit, run_on_trace
from models.smoothing import TemporalSmoother
from models.video import CHANGE_QUANTILES, SINCE_EDGES, Exit0Bins, Exit0Tables, change, explore, fit_exit0, thumbnail
from models.video_replay import notice, replay_index, replay_per_frame

ALPHA, HYSTERESIS = 0.5, 0.1  # [smoothing] as shipped: what the fit replays
HOLDS = (1.0, 4.0, 8.0, 16.0)  # frames a model answer is served for, tried with every lam
NOTICE_FRAMES = 3  # a change noticed within this many frames at p95 (of the changes full depth notices)


def smoother_for(manifest: Manifest, alpha: float = ALPHA, hysteresis: float = HYSTERESIS
                 ) -> Callable[[], TemporalSmoother]:
    reliability = [ex.test_accuracy for ex in manifest.exits]
    return lambda: TemporalSmoother(reliability, alpha, hysteresis)


def exit0_cost(folder: Path, tables: Exit0Tables | None = None, frames: int = 1000) -> tuple[float, float]:
    """Median ms of exit 0 (thumbnail, change, the index's decision) and of exit 1, as the serve path runs them: on
    the model inputs of 640x480 frames, segment 1 running between (it evicts what exit 0 read, as live frames do).
    ``tables``: the model's exit 0 (a stand-in of its size when it has none yet, while it is being fitted). What
    ``fit-policy`` counts as exit 0's cost, and what ``edge-app bench-policy`` prints."""
    from models.runtime import ModelRuntime

    rt = ModelRuntime.load(folder, providers=("cpu",), threads=1, warmup=3)
    if tables is None:
        bins = Exit0Bins(np.linspace(0, 1, len(CHANGE_QUANTILES)), np.asarray(SINCE_EDGES, float),
                         np.array([0.5, 0.8]))
        tables = Exit0Tables(bins, np.full(bins.count, 0.1), np.full((rt.num_exits, bins.count), 0.05), 0.9, 0.0)
    rng = np.random.default_rng(0)
    xs = [rt.preprocess(rng.integers(0, 256, (480, 640, 3), dtype=np.uint8)) for _ in range(16)]
    ref = thumbnail(xs[0])
    stage, seg1 = [], []
    for i in range(frames):
        x = xs[i % len(xs)]
        t0 = time.perf_counter()
        tables.decide(rt.num_exits, change(thumbnail(x), ref), i % 40 + 1, 0.8)
        t1 = time.perf_counter()
        rt.start(x).advance()
        stage.append(t1 - t0)
        seg1.append(time.perf_counter() - t1)
    return float(np.median(stage) * 1e3), float(np.median(seg1) * 1e3)


def fit_on_video(folder: Path, manifest: Manifest, chain: FittedChain, lam: float, min_exit: int = 1,
                 within: float = 0.01, lams: tuple[float, ...] = LAM_GRID[::3]) -> tuple[FittedChain, float,
                                                                                        dict[str, Any]]:
    """(the chain with exit 0, the lam chosen on the clips, what was found)."""
    t0 = time.perf_counter()
    clips = load_clips(folder, manifest, CLIPS_CALIBRATION)
    n = clips.probs.shape[1]
    smoother = smoother_for(manifest)
    base = build_policy(chain, lam, min_exit)

    def answer(probs: np.ndarray) -> tuple[np.ndarray, int]:
        choice = run_on_trace(base, probs, n)[1]
        return probs[choice], choice

    exit1 = states_of(clips.probs, chain.bin_edges, chain.agreement, chain.statistic)[:, 0]
    samples = explore(clips, answer, exit1, smoother)
    cost0_ms = exit0_cost(folder)[0]
    fit0 = fit_exit0(samples, chain.loss.shape[1], cost0_ms / float(sum(manifest.costs_ms)))
    full = replay_per_frame(FixedExit(n), clips, chain.cost, smoother)
    # the changes full depth itself notices, on the static clips (states held 5 s or more)
    known = notice(clips, full.served)[1] & np.isin(clips.clip[clips.changes()], clips.static_clips())
    target = full.accuracy - within
    best: tuple[float, float, float, float] | None = None  # (cost, lam, hold, accuracy)
    top = (-1.0, lams[0], HOLDS[0], 0.0)  # (accuracy, lam, hold, cost)
    for hold in HOLDS:
        held = replace(chain, exit0=replace(fit0, hold=hold))
        for candidate in lams:
            run = replay_index(build_policy(held, candidate, min_exit), clips, chain.cost, smoother)
            delays = notice(clips, run.served)[0][known]
            quick = len(delays) == 0 or float(np.percentile(delays, 95)) <= NOTICE_FRAMES
            if run.accuracy >= target and quick and (best is None or run.mean_cost < best[0]):
                best = (run.mean_cost, candidate, hold, run.accuracy)
            if run.accuracy > top[0]:
                top = (run.accuracy, candidate, hold, run.mean_cost)
    lam_chosen, hold_chosen = (best[1], best[2]) if best is not None else (top[1], top[2])
    video = replace(chain, exit0=replace(fit0, hold=hold_chosen))
    policy = build_policy(video, lam_chosen, min_exit)
    run = replay_index(policy, clips, chain.cost, smoother)
    delays = notice(clips, run.served)[0][known]
    info = {"clips": CLIPS_CALIBRATION, "frames": len(clips.labels), "fps": clips.fps, "samples": fit0.samples,
            "exit0_cost_ms": round(cost0_ms, 4), "exit0_cost": round(fit0.cost, 5),
            "full_depth_accuracy": full.accuracy, "target_accuracy": target, "lam": lam_chosen, "hold": hold_chosen,
            "accuracy": run.accuracy, "cost": run.mean_cost, "exit0_share": run.exit0_share,
            "reached_target": best is not None, "notice_frames_p50": _pct(delays, 50),
            "notice_frames_p95": _pct(delays, 95), "seconds": round(time.perf_counter() - t0, 1)}
    return video, lam_chosen, info


def _pct(values: np.ndarray, q: float) -> float | None:
    return None if len(values) == 0 else float(np.percentile(values, q))
