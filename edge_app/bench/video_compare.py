"""``edge-app compare-video``: the dynamic index with exit 0 against the rules people use, on labelled video.

On the model's test clips (``edge_app.bench.clips``: held-out images, other seeds), every frame counted against
the label of its moment and answered with the source's smoothed answer as served, each family is replayed at
every parameter (``models.video_replay``):

- the index with exit 0 (fitted on the calibration clips: ``models.video_fit``), at every lam and hold, and the
  point served (the lam and hold ``fit-policy`` chose on the calibration clips) apart;
- the per-frame confidence threshold (the model on every frame: what ``auto`` serves today);
- a motion gate plus threshold: the model when the picture changed by more than the gate since the frame it last
  analysed, else the last answer; every gate (quantiles of the change the calibration clips show) with every
  threshold: the gate tuned;
- a fixed refresh: the model every k frames with a threshold, the last answer between;
- full depth on every frame (the accuracy to stay near).

Fronts (the cheapest mean cost reaching each accuracy level) are compared with a block bootstrap: blocks of
``BLOCK_S`` seconds of one clip, resampled whole (consecutive frames are not independent). For each family, the
time to notice a state change at its cheapest point within 1 point of full depth. Static clips (states held 10-120
s) and the busy clip (a new picture every second, as the demo camera shows) are reported apart.
"""

from __future__ import annotations

import json
import time
from collections.abc import Callable
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Any

import numpy as np

from models.compare import Family, compare, front, levels_below
from models.evaluate import DEFAULT_THRESHOLDS
from models.fit import LAM_GRID, FittedChain, build_policy, fit_chain
from models.folder import CLIPS_TEST, load_clips, load_traces, policy_meta
from models.manifest import read_manifest
from models.policies import ConfidenceThreshold, FixedExit
from models.policy_store import stored_exit0
from models.video import Clips
from models.video_fit import HOLDS, smoother_for
from models.video_replay import VideoRun, notice, replay_gated, replay_index, replay_per_frame, replay_refresh

BLOCK_S = 10.0
GATE_THRESHOLDS = (0.5, 0.7, 0.8, 0.9, 0.95)
REFRESH = (2, 3, 5, 8, 12, 20, 30, 60)


@dataclass(frozen=True)
class Point:
    family: str
    params: dict[str, float]
    run: VideoRun


def _subset(clips: Clips, keep: np.ndarray) -> Clips:
    mask = np.isin(clips.clip, keep)
    return Clips(clips.probs[mask], clips.labels[mask], clips.thumbs[mask], clips.clip[mask], clips.fps)


def _family(name: str, points: list[Point]) -> Family:
    return Family(name, tuple(float(i) for i in range(len(points))), np.stack([p.run.cost for p in points]),
                  np.stack([p.run.correct for p in points]))


def _blocks(clips: Clips) -> np.ndarray:
    per = max(1, int(BLOCK_S * clips.fps))
    out = np.empty(len(clips.clip), int)
    for start, end in clips.spans():
        out[start:end] = start + (np.arange(end - start) // per)
    return out


def replay_all(clips: Clips, chain: FittedChain, costs: np.ndarray, gates: np.ndarray,
               smoother: Callable[[], Any], measure_cost: float) -> dict[str, list[Point]]:
    n = clips.probs.shape[1]
    out: dict[str, list[Point]] = {"index with exit 0": [], "threshold, every frame": [],
                                   "motion gate + threshold": [], "refresh + threshold": []}
    assert chain.exit0 is not None
    for hold in HOLDS:
        held = replace(chain, exit0=replace(chain.exit0, hold=hold))
        for lam in LAM_GRID[::3]:
            out["index with exit 0"].append(Point("index with exit 0", {"lam": lam, "hold": hold},
                                                  replay_index(build_policy(held, lam), clips, costs, smoother)))
    for t in DEFAULT_THRESHOLDS:
        out["threshold, every frame"].append(Point("threshold, every frame", {"threshold": t}, replay_per_frame(
            ConfidenceThreshold(t), clips, costs, smoother)))
    for g in gates:
        for t in GATE_THRESHOLDS:
            out["motion gate + threshold"].append(Point("motion gate + threshold", {"gate": float(g), "threshold": t},
                                                        replay_gated(ConfidenceThreshold(t), clips, costs, smoother,
                                                                     float(g), measure_cost)))
    for k in REFRESH:
        for t in GATE_THRESHOLDS:
            out["refresh + threshold"].append(Point("refresh + threshold", {"every": k, "threshold": t},
                                                    replay_refresh(ConfidenceThreshold(t), clips, costs, smoother,
                                                                   k)))
    out["full depth, every frame"] = [Point("full depth, every frame", {}, replay_per_frame(FixedExit(n), clips,
                                                                                             costs, smoother))]
    return out


def _cheapest(points: list[Point], level: float) -> Point | None:
    ok = [p for p in points if p.run.accuracy >= level - 1e-12]
    return min(ok, key=lambda p: p.run.mean_cost) if ok else None


def _notice_row(clips: Clips, name: str, p: Point | None, known: np.ndarray) -> str:
    """Time to notice, over the changes full depth itself notices (``known``: the model knows the new picture)."""
    if p is None:
        return f"| {name} | never reaches it | | | | |"
    delays, seen = notice(clips, p.run.served)
    delays, seen = delays[known], seen[known]
    ms = 1e3 / clips.fps
    p50, p95 = (np.percentile(delays, [50, 95]) if len(delays) else (np.nan, np.nan))
    params = ", ".join(f"{k} {v:.4g}" for k, v in p.params.items()) or "–"
    return (f"| {name} | {params} | {100 * p.run.accuracy:.2f} % | {p.run.mean_cost:.3f} | "
            f"{100 * p.run.exit0_share:.1f} % | {p50:.0f} / {p95:.0f} frames ({p50 * ms:.0f} / {p95 * ms:.0f} ms); "
            f"{int((~seen).sum())} of {len(seen)} never |")


def compare_video(folder: Path, out: Path, resamples: int = 1000) -> dict[str, Any]:
    started = time.perf_counter()
    manifest = read_manifest(folder)
    meta = policy_meta(folder)
    cal, cal_labels = load_traces(folder, manifest, str(meta["calibration_traces"]))
    exit0 = stored_exit0(meta)
    fitted = meta.get("video")
    if exit0 is None or not isinstance(fitted, dict):
        raise ValueError(f"{folder / 'policy.json'} has no exit 0: make clips (edge-app clip-traces) and fit it "
                         "(edge-app fit-policy)")
    video_chain = replace(fit_chain(cal, cal_labels, manifest.costs_ms, loss_kind=str(meta["loss_kind"])),
                          exit0=exit0)  # as served: the stored exit 0 (and hold); the index at every lam
    lam = float(meta["lam"])
    clips = load_clips(folder, manifest, CLIPS_TEST)
    smoother = smoother_for(manifest)
    gates = np.quantile(np.abs(np.diff(clips.thumbs, axis=0)).mean(axis=(1, 2)), np.linspace(0.3, 0.995, 14))
    report: dict[str, Any] = {"model": manifest.name, "fit": fitted, "resamples": resamples, "block_s": BLOCK_S,
                              "sets": {}}
    lines = [f"{manifest.name}: exit 0 fitted on {fitted['frames']} calibration-clip frames ({fitted['samples']} "
             f"samples; served: lam {lam:.4g} and hold {fitted['hold']:g}, chosen there: "
             f"{100 * fitted['accuracy']:.2f} % at {fitted['cost']:.3f} of full "
             f"depth); exit 0 costs {fitted['exit0_cost_ms']:.3f} ms = {100 * fitted['exit0_cost']:.2f} % of full "
             f"depth. Test clips: held-out images and seeds, VP8 and H.264. Difference = index cost - other cost (full "
             f"depth = 1), 95 % block-bootstrap interval ({resamples} resamples of {BLOCK_S:.0f} s blocks).", ""]
    static = clips.static_clips()  # the same split as the fit's time to notice (states held 5 s or more)
    kinds = {"static (states held 10-120 s)": static,
             "busy (a new picture every second)": np.setdiff1d(np.unique(clips.clip), static)}
    for kind, keep in kinds.items():
        if not len(keep):
            continue
        sub = _subset(clips, keep)
        points = replay_all(sub, video_chain, video_chain.cost, gates, smoother, exit0.cost)
        full = points["full depth, every frame"][0].run
        levels = levels_below(full.accuracy)
        fams = {name: _family(name, pts) for name, pts in points.items() if name != "full depth, every frame"}
        rows, results = [], {}
        for other in ("motion gate + threshold", "threshold, every frame", "refresh + threshold"):
            res = compare(fams["index with exit 0"], fams[other], levels, resamples, blocks=_blocks(sub))
            results[other] = res
            rows.append(_compare_row(other, res))
        level = full.accuracy - 0.01
        known = notice(sub, full.served)[1]
        served = Point("index with exit 0, as served", {"lam": lam}, replay_index(build_policy(video_chain, lam), sub,
                                                                                video_chain.cost, smoother))
        notice_rows = [_notice_row(sub, name, _cheapest(pts, level), known) for name, pts in points.items()]
        notice_rows.insert(0, _notice_row(sub, served.family, served, known))
        report["sets"][kind] = {"frames": len(sub.labels), "changes": len(sub.changes()),
                                "full_depth_accuracy": full.accuracy, "comparisons": results,
                                "fronts": {n: front(f, np.ones(len(sub.labels)), levels).tolist()
                                           for n, f in fams.items()}, "levels": levels.tolist()}
        lines += [f"### {kind}: {len(sub.labels)} frames at {sub.fps:g} fps, {len(sub.changes())} state changes; "
                  f"full depth on every frame {100 * full.accuracy:.2f} %", "",
                  "| index with exit 0 vs | levels both reach | index cheaper (interval < 0) | interval includes 0 | "
                  "index costlier (interval > 0) | no interval (point differences) | area between fronts [95 %] |",
                  "|---|---|---|---|---|---|---|", *rows, "",
                  f"At the cheapest point of each family within 1 point of full depth ({100 * level:.2f} %):", "",
                  "| family | parameters | accuracy | cost (full depth = 1) | answered with the last answer | "
                  f"time to notice a change ({int(known.sum())} that full depth notices), p50 / p95 |",
                  "|---|---|---|---|---|---|", *notice_rows, ""]
    report["seconds"] = round(time.perf_counter() - started, 1)
    out.mkdir(parents=True, exist_ok=True)
    (out / "compare-video.json").write_text(json.dumps(report, indent=1, default=float))
    (out / "compare-video.md").write_text("\n".join(lines) + "\n")
    print("\n".join(lines), flush=True)
    return report


def _compare_row(name: str, res: dict[str, Any]) -> str:
    points = ", ".join(f"{d:+.3f}" for d in res["unsettled_point"]) or "–"
    return (f"| {name} | {res['levels_both']} | {res['cheaper']} | {res['includes_0']} | {res['costlier']} | "
            f"{res['unsettled']} ({points}) | {res['area']:+.4f} [{res['area_lo']:+.4f}, {res['area_hi']:+.4f}] |")
