"""``edge-app evaluate``: every policy replayed on the test traces: a table, Pareto fronts (matplotlib), JSON."""

from __future__ import annotations

import json
import logging
from pathlib import Path
from typing import Any

from models.evaluate import PolicyPoint, cheapest_reaching, dominance, pareto_front, sweep
from models.fit import fit_chain
from models.folder import load_traces, policy_meta, trace_names
from models.manifest import read_manifest

log = logging.getLogger(__name__)

BASELINES_COMPARED = ("confidence", "patience")


def _by_policy(points: list[PolicyPoint]) -> dict[str, list[PolicyPoint]]:
    out: dict[str, list[PolicyPoint]] = {}
    for p in points:
        key = "fixed" if p.policy.startswith("fixed-") else p.policy
        out.setdefault(key, []).append(p)
    return out


def evaluate(folder: Path, out: Path, bins: int = 8, loss_kind: str | None = None, traces: str = "auto"
             ) -> dict[str, Any]:
    """Replay every policy on the test traces at every horizon; write table, plot and JSON into ``out``.

    ``loss_kind`` defaults to the one the model's saved policy was fitted with; ``traces`` picks clean or
    VP8-coded calibration and test traces (``trace_names``).
    """
    manifest = read_manifest(folder)
    loss_kind = loss_kind or str(policy_meta(folder)["loss_kind"])
    cal_name, test_name = trace_names(manifest, traces)
    cal_p, cal_y = load_traces(folder, manifest, cal_name)
    test_p, test_y = load_traces(folder, manifest, test_name)
    chain = fit_chain(cal_p, cal_y, manifest.costs_ms, bins=bins, loss_kind=loss_kind)
    n = test_p.shape[1]
    out.mkdir(parents=True, exist_ok=True)
    by_horizon = {h: sweep(chain, test_p, test_y, h) for h in range(1, n + 1)}
    full = by_horizon[n]
    final_acc = float((test_p[:, -1].argmax(-1) == test_y).mean())
    groups = _by_policy(full)
    summary: dict[str, Any] = {"model": manifest.name, "loss_kind": loss_kind, "traces": [cal_name, test_name],
                               "test_frames": len(test_y),
                               "final_exit_accuracy": final_acc,
                               "costs_normalised": chain.cost.tolist(), "within_1_point": {}, "dominance": {}}
    for name, pts in groups.items():
        best = cheapest_reaching(pts, final_acc - 0.01)
        summary["within_1_point"][name] = None if best is None else best.as_dict()
    for name in BASELINES_COMPARED:
        summary["dominance"][name] = dominance(groups["dynamic-index"], groups[name], final_acc)
    summary["deadline"] = _deadline_summary(by_horizon)
    (out / "points.json").write_text(json.dumps(
        {"summary": summary, "points": {str(h): [p.as_dict() for p in pts] for h, pts in by_horizon.items()}},
        indent=1) + "\n")
    table = format_table(full, groups, summary)
    (out / "table.txt").write_text(table + "\n")
    plot_fronts(by_horizon, out / "pareto.png", final_acc, manifest.name)
    return {"summary": summary, "table": table}


def _deadline_summary(by_horizon: dict[int, list[PolicyPoint]]) -> dict[str, Any]:
    """Per horizon: each policy's cheapest point within 1 point of that horizon's deepest exit."""
    res: dict[str, Any] = {}
    for h, pts in by_horizon.items():
        deepest = next(p for p in pts if p.policy == f"fixed-{h}")
        res[str(h)] = {}
        for name, group in _by_policy(pts).items():
            best = cheapest_reaching(group, deepest.accuracy - 0.01)
            res[str(h)][name] = None if best is None else {
                "accuracy": round(best.accuracy, 4), "mean_cost": round(best.mean_cost, 4), "param": best.param}
    return res


def format_table(full: list[PolicyPoint], groups: dict[str, list[PolicyPoint]], summary: dict[str, Any]) -> str:
    lines = [f"model {summary['model']}, dynamic index with loss {summary['loss_kind']}, "
             f"{summary['test_frames']} test frames ({' / '.join(summary['traces'])} traces), final exit accuracy "
             f"{summary['final_exit_accuracy']:.4f}; costs normalised to full depth {summary['costs_normalised']}",
             "",
             "Pareto points per policy (all exits allowed):",
             f"{'policy':<15}{'param':>9}{'accuracy':>10}{'agree-final':>12}{'cost':>8}{'exits':>7}  usage"]
    for pts in groups.values():
        for p in pareto_front(pts):
            param = "" if p.param is None else f"{p.param:.4g}"
            lines.append(f"{p.policy:<15}{param:>9}{p.accuracy:>10.4f}{p.agreement_with_final:>12.4f}"
                         f"{p.mean_cost:>8.3f}{p.mean_exits_run:>7.2f}  "
                         + " ".join(f"{u:.2f}" for u in p.exit_usage))
    lines += ["", "Cheapest point within 1 point of the final exit's accuracy:"]
    for name, best in summary["within_1_point"].items():
        lines.append(f"  {name:<15} " + ("never reaches it" if best is None else
                                         f"cost {best['mean_cost']:.3f}, accuracy {best['accuracy']:.4f}, "
                                         f"param {best['param']}"))
    lines += ["", "Dynamic index vs baselines at accuracy levels within 2 points of the final exit:"]
    for name, d in summary["dominance"].items():
        verdict = "never costlier" if not d["worse_at"] else (
            f"costlier at {len(d['worse_at'])} levels (by at most {d['worst_excess_cost']:.3f} where it reaches "
            f"them; {d['levels_ours_never_reaches']} levels it never reaches): {d['worse_at'][:6]}...")
        lines.append(f"  vs {name:<12} {d['levels_not_worse']}/{d['levels']} levels not costlier; {verdict}")
    lines += ["", "Deadline sweep (horizon K = exits that fit): cheapest cost within 1 point of exit K:"]
    for h, res in summary["deadline"].items():
        cells = ", ".join(f"{k} {'-' if v is None else format(v['mean_cost'], '.3f')}" for k, v in res.items())
        lines.append(f"  K={h}: {cells}")
    return "\n".join(lines)


def plot_fronts(by_horizon: dict[int, list[PolicyPoint]], path: Path, final_acc: float, title: str) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    horizons = [h for h in sorted(by_horizon) if h > 1]
    fig, axes = plt.subplots(1, len(horizons), figsize=(6.5 * len(horizons), 5), squeeze=False)
    styles = {"dynamic-index": ("tab:red", "-", "o"), "confidence": ("tab:blue", "--", "s"),
              "entropy": ("tab:cyan", ":", "^"), "patience": ("tab:green", "none", "D"),
              "fixed": ("black", "none", "x"), "budget-greedy": ("tab:gray", "none", "P"),
              "prophet": ("tab:purple", "none", "*")}
    for ax, h in zip(axes[0], horizons, strict=True):
        for name, pts in _by_policy(by_horizon[h]).items():
            front = pareto_front(pts) if name not in ("fixed", "patience") else sorted(pts, key=lambda p: p.mean_cost)
            colour, ls, marker = styles.get(name, ("gray", "-", "."))
            ax.plot([p.mean_cost for p in front], [100 * p.accuracy for p in front], color=colour, linestyle=ls,
                    marker=marker, markersize=5 if name != "prophet" else 12, label=name, linewidth=1.6)
        ax.axhline(100 * final_acc, color="black", linewidth=0.6, alpha=0.5)
        ax.axhline(100 * (final_acc - 0.01), color="black", linewidth=0.6, alpha=0.3, linestyle="--")
        ax.set_xlabel("mean compute per frame (1.0 = full depth)")
        ax.set_ylabel("test accuracy (%)")
        ax.set_title(f"{title}: exits 1..{h} allowed")
        ax.grid(alpha=0.3)
        accs = [100 * p.accuracy for p in by_horizon[h]]
        ax.set_ylim(max(min(accs), 100 * final_acc - 25), min(100.0, max(accs) + 1))
        ax.legend(loc="lower right", fontsize=8)
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)
