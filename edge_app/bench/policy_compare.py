"""``edge-app compare-policies``: does the dynamic index earn its place? Fronts with paired-bootstrap intervals.

For the model's chain, fitted on the calibration traces in each state variant (the bins of max softmax or of the
margin between the top two classes, with or without an isotonic error per bin), and for the tuned thresholds
(confidence, entropy), every parameter is replayed on the test traces; ``models.compare`` gives, at each accuracy
level within 2 points of the final exit, the index's cost minus the threshold's with a 95 % paired-bootstrap
interval over the test frames, and the same for the area between the fronts. Twice: with the segment costs the
manifest measured, and with segment 3 three times dearer (contention, another model, a remote server's queue),
for which the index is re-solved from the same tables while the threshold keeps its rule. Also the time a
re-solve takes, against exit 1's cost.
"""

from __future__ import annotations

import json
import time
from pathlib import Path
from typing import Any

import numpy as np

from models.compare import Family, compare, index_family, levels_below, threshold_families
from models.fit import build_policy, fit_chain
from models.folder import load_traces, policy_meta, trace_names
from models.manifest import read_manifest

VARIANTS: dict[str, tuple[str, bool, int]] = {  # name -> (statistic, isotonic, bins)
    "confidence": ("confidence", False, 8), "confidence, isotonic": ("confidence", True, 8),
    "margin": ("margin", False, 8), "margin, isotonic": ("margin", True, 8),
    "confidence, 16 bins, isotonic": ("confidence", True, 16), "margin, 16 bins, isotonic": ("margin", True, 16),
    "confidence, 32 bins, isotonic": ("confidence", True, 32), "margin, 32 bins, isotonic": ("margin", True, 32)}


def _row(name: str, res: dict[str, Any]) -> str:
    points = ", ".join(f"{d:+.3f}" for d in res["unsettled_point"]) or "–"
    return (f"| {name} | {res['b']} | {res['levels_both']} | {res['cheaper']} | {res['includes_0']} | "
            f"{res['costlier']} | {res['unsettled']} ({points}) | "
            f"{res['area']:+.4f} [{res['area_lo']:+.4f}, {res['area_hi']:+.4f}] |")


def compare_policies(folder: Path, out: Path, resamples: int = 1000, traces: str = "auto",
                     variants: list[str] | None = None) -> dict[str, Any]:
    manifest = read_manifest(folder)
    cal_name, test_name = trace_names(manifest, traces)
    cal, cal_labels = load_traces(folder, manifest, cal_name)
    test, test_labels = load_traces(folder, manifest, test_name)
    meta = policy_meta(folder)
    base_ms = np.asarray(manifest.costs_ms, float)
    scenarios = {"as measured": base_ms / base_ms.sum(),
                 "segment 3 x3": np.array([base_ms[0], base_ms[1], 3 * base_ms[2]]) / base_ms.sum()}
    final = float((test[:, -1].argmax(-1) == test_labels).mean())
    levels = levels_below(final)
    report: dict[str, Any] = {"model": manifest.name, "traces": [cal_name, test_name], "final_accuracy": final,
                              "resamples": resamples, "scenarios": {}}
    lines = [f"{manifest.name}: {len(test_labels)} {test_name} frames, final exit {100 * final:.2f} %, "
             f"{len(levels)} accuracy levels within 2 points; difference = index cost - threshold cost (units of "
             f"full depth as measured), 95 % paired-bootstrap interval over frames ({resamples} resamples)", ""]
    for scenario, costs in scenarios.items():
        started = time.perf_counter()
        thresholds = threshold_families(test, test_labels, costs)
        rows = []
        results: dict[str, Any] = {}
        for name in variants or list(VARIANTS):
            statistic, isotonic, bins = VARIANTS[name]
            chain = fit_chain(cal, cal_labels, list(base_ms), bins=bins, loss_kind=str(meta["loss_kind"]),
                              statistic=statistic, isotonic=isotonic)
            fam: Family = index_family(chain, test, test_labels, costs, name=f"index ({name})")
            for other in thresholds:
                res = compare(fam, other, levels, resamples)
                results[f"{name} vs {other.name}"] = res
                rows.append(_row(name, res))
        report["scenarios"][scenario] = {"costs": costs.tolist(), "comparisons": results,
                                         "seconds": round(time.perf_counter() - started, 1)}
        lines += [f"### {scenario}: segment costs {np.round(costs, 3).tolist()} of full depth", "",
                  "| index states | vs | levels both reach | index cheaper (interval < 0) | interval includes 0 | "
                  "index costlier (interval > 0) | no interval: a front misses the level in > 10 % of resamples "
                  "(point differences) | area between fronts [95 % interval] |", "|---|---|---|---|---|---|---|---|",
                  *rows, ""]
    report["resolve"] = resolve_timing(cal, cal_labels, list(base_ms), str(meta["loss_kind"]), float(meta["lam"]))
    r = report["resolve"]
    lines.append(f"Re-solving the index for new segment costs (same tables, {r['horizons']} horizons): median "
                 f"{r['median_us']:.0f} us over {r['runs']} runs = {100 * r['share_of_exit1']:.1f} % of one exit-1 "
                 f"run ({r['exit1_us']:.0f} us); done when the shares move, not per frame")
    out.mkdir(parents=True, exist_ok=True)
    (out / "compare.json").write_text(json.dumps(report, indent=1))
    (out / "compare.md").write_text("\n".join(lines) + "\n")
    print("\n".join(lines), flush=True)
    return report


def resolve_timing(probs: np.ndarray, labels: np.ndarray, costs_ms: list[float], loss_kind: str, lam: float,
                   runs: int = 50) -> dict[str, Any]:
    """How long re-solving the chain for new costs takes (``build_policy``: every horizon's table)."""
    chain = fit_chain(probs, labels, costs_ms, loss_kind=loss_kind)
    times = []
    for _ in range(runs):
        t0 = time.perf_counter()
        build_policy(chain, lam)
        times.append((time.perf_counter() - t0) * 1e6)
    median = float(np.median(times))
    return {"median_us": median, "runs": runs, "horizons": len(costs_ms), "exit1_us": costs_ms[0] * 1e3,
            "share_of_exit1": median / (costs_ms[0] * 1e3)}
