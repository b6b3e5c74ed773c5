"""The network benchmark's per-frame records and what is made of them: summaries, the misses' report, tables,
the time-series plot, and the per-frame CSV (``edge_app.bench.netbench.bench`` runs; this reads and writes)."""

from __future__ import annotations

import csv
import json
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

import numpy as np

from edge_app.bench.netbench.trace import Trace

RECOVERY_S = 3.0  # good-network frames this soon after the path came back are reported apart (summary.md)


@dataclass
class FrameRecord:
    t_s: float  # stamping time, seconds from the trace's t = 0
    counter: int
    applied_rtt_ms: float  # what the bridge applied at stamping time
    rtt_estimate_ms: float
    rtt_from_prior: bool
    compute_budget_ms: float
    exit: int  # 1-based exit used
    exits_run: int
    horizon: int
    compute_ms: float
    label: int
    answer: int  # raw class of the exit used
    smoothed: int
    to_result_ms: float  # stamping -> result at the page
    to_display_ms: float | None  # stamping -> annotated frame displayed
    to_server_ms: float  # stamping -> the frame decoded at the server (browser encode, uplink, decode)
    server_ms: float  # decoded at the server -> result sent (wait, pre-process, compute, annotate)
    hit: bool  # to_result_ms <= total_budget_ms
    late_ms: float = 0.0  # budget.late_ms (0 when read from a frames.csv written before it existed)
    frame_height: int = 0  # of the frame as decoded at the server (0: a frames.csv from before it was recorded)
    bitrate_bps: float = 0.0  # the server's send bitrate when it ran the frame (encoder target, or its prior)
    skipped: bool = False  # answered from the smoothed state: a newer frame replaced it at the server while busy

    @property
    def correct(self) -> bool:
        return self.answer == self.label

    @property
    def downlink_ms(self) -> float:  # result sent by the server -> at the page
        return self.to_result_ms - self.to_server_ms - self.server_ms


def unavoidable(frames: list[FrameRecord], total_ms: float) -> list[FrameRecord]:
    """Misses no exit policy could have avoided: even exit 1 run the moment the frame was decoded (no
    wait, the run's median exit-1-only compute) plus the downlink its result actually had is late,
    because the frame reached the server too late (held behind a retransmission, say) or its result
    took too long to come back."""
    alone = [f.compute_ms for f in frames if f.exits_run == 1]
    exit1_ms = float(np.median(alone)) if alone else min((f.compute_ms for f in frames), default=0.0)
    return [f for f in frames if not f.hit
            and f.to_server_ms + exit1_ms + f.downlink_ms > total_ms]


def misses_text(frames: list[FrameRecord], trace: Trace, total_ms: float) -> str:
    """Every missed frame, one line each, after the stage latencies while the network was good and bad:
    what the README's readings of a run are taken from (``misses.txt`` beside ``frames.csv``)."""
    good_rtt = min(s.rtt_ms for s in trace.steps)
    out = [f"{len(frames)} frames, deadline {total_ms:g} ms"]
    for phase, sel in (("good", [f for f in frames if f.applied_rtt_ms <= good_rtt]),
                       ("bad", [f for f in frames if f.applied_rtt_ms > good_rtt])):
        if sel:
            stages = ", ".join(f"{name} p50 / p95 / max {np.median(v):.0f} / {np.percentile(v, 95):.0f} / "
                               f"{np.max(v):.0f} ms" for name, v in
                               (("stamping -> decoded", [f.to_server_ms for f in sel]),
                                ("server", [f.server_ms for f in sel])))
            out.append(f"while {phase} ({len(sel)} frames): {stages}")
    gone = {id(f) for f in unavoidable(frames, total_ms)}
    out.append("t_s applied_rtt estimate late_ms to_server server to_result exits_run late_by unavoidable")
    out += [f"{f.t_s:.2f} {f.applied_rtt_ms:.0f} {f.rtt_estimate_ms:.0f} {f.late_ms:.0f} {f.to_server_ms:.1f} "
            f"{f.server_ms:.1f} {f.to_result_ms:.1f} {f.exits_run} {f.to_result_ms - total_ms:.1f} "
            f"{'yes' if id(f) in gone else 'no'}" for f in frames if not f.hit]
    return "\n".join(out) + "\n"


def summarise(frames: list[FrameRecord], counts: dict[str, int], trace: Trace, total_ms: float) -> dict[str, Any]:
    """``counts``: every frame the page stamped in the window (``sent``: the denominator of the on-time rate),
    and why those without an answer had none (``frame_records``)."""
    unanswered = counts["unanswered"]
    sent = counts.get("sent", len(frames) + unanswered)
    every = {"sent": sent, "unanswered": unanswered, "not_sent": counts.get("not_sent"), "lost": counts.get("lost"),
             "unreadable": counts.get("unreadable"),
             "on_time_of_sent": sum(f.hit for f in frames) / sent if sent else None,
             "late": sum(not f.hit for f in frames), "skipped": sum(f.skipped for f in frames)}
    if not frames:
        return {"frames": 0, **every}
    good_rtt = min(s.rtt_ms for s in trace.steps)
    good = [f for f in frames if f.applied_rtt_ms <= good_rtt + 1e-6]
    bad = [f for f in frames if f.applied_rtt_ms > good_rtt + 1e-6]
    after = [f for f in frames if any(w <= f.t_s < w + 1.0 for w in trace.worsenings())]
    recoveries = trace.recoveries()
    recovering: list[FrameRecord] = []
    settled: list[FrameRecord] = []
    for f in good:
        (recovering if any(r <= f.t_s < r + RECOVERY_S for r in recoveries) else settled).append(f)
    res = np.array([f.to_result_ms for f in frames])
    disp = np.array([f.to_display_ms for f in frames if f.to_display_ms is not None])

    def acc(fs: list[FrameRecord]) -> float | None:
        return float(np.mean([f.correct for f in fs])) if fs else None

    def pct(a: np.ndarray, q: float) -> float | None:
        return float(np.percentile(a, q)) if len(a) else None

    def mean_exits_run(fs: list[FrameRecord]) -> float | None:
        return float(np.mean([f.exits_run for f in fs])) if fs else None

    def median_height(fs: list[FrameRecord]) -> float | None:
        heights = [f.frame_height for f in fs if f.frame_height > 0]  # 0: not recorded
        return float(np.median(heights)) if heights else None

    return {
        "frames": len(frames), **every,
        "deadline_hit_rate": float(np.mean([f.hit for f in frames])),
        "accuracy": acc(frames), "accuracy_good": acc(good), "accuracy_bad": acc(bad),
        # the frames the model itself answered while the path was good (not reused, not skipped)
        "accuracy_good_analysed": acc([f for f in good if f.exits_run > 0]),
        # good network split: the RECOVERY_S after the path came back, and the rest (settled)
        "frames_recovering": len(recovering), "accuracy_recovering": acc(recovering),
        "accuracy_settled": acc(settled),
        "mean_exits_run_recovering": mean_exits_run(recovering), "mean_exits_run_settled": mean_exits_run(settled),
        "reused_recovering": int(sum(f.exits_run == 0 for f in recovering)),
        "frame_height_recovering": median_height(recovering), "frame_height_settled": median_height(settled),
        "smoothed_accuracy": float(np.mean([f.smoothed == f.label for f in frames])),
        "hit_rate_good": float(np.mean([f.hit for f in good])) if good else None,
        "hit_rate_bad": float(np.mean([f.hit for f in bad])) if bad else None,
        "mean_compute_ms": float(np.mean([f.compute_ms for f in frames])),
        "mean_exit": float(np.mean([f.exit for f in frames])),
        "mean_exit_good": float(np.mean([f.exit for f in good])) if good else None,
        "mean_exit_bad": float(np.mean([f.exit for f in bad])) if bad else None,
        "misses_after_worsening": int(sum(not f.hit for f in after)), "frames_after_worsening": len(after),
        "misses_exit1_only": int(sum(not f.hit and f.exits_run == 1 for f in frames)),
        "misses_unavoidable": len(unavoidable(frames, total_ms)),
        "misses": int(sum(not f.hit for f in frames)),
        "reused": int(sum(f.exits_run == 0 for f in frames)),  # answered from the smoothed state, no exit ran
        "to_result_p50_ms": pct(res, 50), "to_result_p95_ms": pct(res, 95),
        "to_display_p50_ms": pct(disp, 50), "to_display_p95_ms": pct(disp, 95),
        "to_server_p50_ms": pct(np.array([f.to_server_ms for f in frames]), 50),
        "server_p50_ms": pct(np.array([f.server_ms for f in frames]), 50),
        "downlink_p50_ms": pct(np.array([f.downlink_ms for f in frames]), 50),
        # the same per phase: a policy that analyses more of its frames while the network is bad (budget-greedy on
        # step) has an overall median from the bad phase, which is not a delay of its own
        **{f"{key}_p50_{phase}_ms": pct(np.array([getattr(f, attr) for f in sel]), 50)
           for phase, sel in (("good", good), ("bad", bad))
           for key, attr in (("to_server", "to_server_ms"), ("server", "server_ms"), ("downlink", "downlink_ms"))},
        "display_after_result_p50_ms": pct(np.array([f.to_display_ms - f.to_result_ms for f in frames
                                                     if f.to_display_ms is not None]), 50),
    }


def read_throughput(bridge_log: Path | None) -> list[dict[str, float]]:
    """The bridge's once-a-second throughput records: {"t_s", "down", "up"} in kbit/s (down: app -> browser)."""
    if bridge_log is None or not bridge_log.is_file():
        return []
    out = []
    for line in bridge_log.read_text().splitlines():
        rec = json.loads(line)
        if rec.get("event") == "throughput":
            rates = [v for k, v in rec.items() if "->" in k]
            if len(rates) == 2:
                out.append({"t_s": float(rec["t_s"]), "down": float(rates[0]), "up": float(rates[1])})
    return out


def plot_run(frames: list[FrameRecord], trace: Trace, policy: str, total_ms: float, path: Path,
             throughput: list[dict[str, float]] | None = None) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    t = np.array([f.t_s for f in frames])
    fig, axes = plt.subplots(5, 1, figsize=(11, 10.5), sharex=True, gridspec_kw={"height_ratios": [2, 2, 1.2, 2, 1.6]})
    ax = list(axes)
    ax[0].step([s.t_s for s in trace.steps] + [trace.duration_s], [s.rtt_ms for s in trace.steps]
               + [trace.steps[-1].rtt_ms], where="post", color="#9ca3af", lw=3, label="trace RTT")
    ax[0].plot(t, [f.applied_rtt_ms for f in frames], color="#111827", lw=1, label="applied RTT (bridge log)")
    ax[0].plot(t, [f.rtt_estimate_ms for f in frames], color="#2563eb", lw=1.2, label="server RTT estimate (RTCP)")
    ax[0].set_ylabel("ms")
    ax[0].legend(loc="upper right", fontsize=8)
    ax[1].plot(t, [f.compute_budget_ms for f in frames], color="#16a34a", lw=1, label="compute budget")
    ax[1].plot(t, [f.compute_ms for f in frames], color="#dc2626", lw=0.8, label="compute used")
    ax[1].set_ylabel("ms")
    ax[1].set_ylim(bottom=min(0, min((f.compute_budget_ms for f in frames), default=0)))
    ax[1].legend(loc="upper right", fontsize=8)
    ax[2].scatter(t, [f.exit for f in frames], s=4, color="#7c3aed", label="exit used")
    ax[2].set_yticks([0, 1, 2, 3], ["reused", "1", "2", "3"])
    ax[2].set_ylabel("exit")
    ax[2].set_ylim(-0.5, 3.5)
    ax[3].plot(t, [f.to_result_ms for f in frames], color="#6b7280", lw=0.8, label="stamping -> result at page")
    ax[3].axhline(total_ms, color="#f59e0b", ls="--", lw=1, label=f"deadline {total_ms:.0f} ms")
    miss = [f for f in frames if not f.hit]
    ax[3].scatter([f.t_s for f in miss], [f.to_result_ms for f in miss], s=10, color="#dc2626", zorder=3,
                  label=f"misses ({len(miss)})")
    ax[3].set_ylabel("ms")
    ax[3].legend(loc="upper right", fontsize=8)
    caps = [(s.t_s, s.rate_kbit) for s in trace.steps]
    ax[4].step([c[0] for c in caps] + [trace.duration_s], [c[1] or np.nan for c in caps] + [caps[-1][1] or np.nan],
               where="post", color="#9ca3af", lw=3, label="rate cap (per direction)")
    if throughput:
        ax[4].plot([r["t_s"] for r in throughput], [r["down"] for r in throughput], color="#0891b2", lw=1.2,
                   label="sent to the browser (bridge)")
        ax[4].plot([r["t_s"] for r in throughput], [r["up"] for r in throughput], color="#a16207", lw=1,
                   label="received from the browser (bridge)")
    ax[4].set_ylabel("kbit/s")
    ax[4].set_xlabel("seconds into the trace")
    ax[4].legend(loc="upper right", fontsize=8)
    for a in ax:
        for w in trace.worsenings():
            a.axvline(w, color="#fca5a5", lw=0.8)
    s = summarise(frames, {"unanswered": 0}, trace, total_ms)
    fig.suptitle(f"{policy} on {Path(trace.name).stem}: deadline hit {100 * s['deadline_hit_rate']:.1f} %, "
                 f"accuracy {100 * s['accuracy']:.1f} %, mean compute {s['mean_compute_ms']:.1f} ms")
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)


def write_frames_csv(frames: list[FrameRecord], path: Path) -> None:
    with path.open("w", newline="") as f:
        w = csv.writer(f)
        fields = list(asdict(frames[0]).keys()) if frames else []
        w.writerow([*fields, "correct"])
        for fr in frames:
            w.writerow([getattr(fr, k) for k in fields] + [fr.correct])


def latency_table(results: dict[str, dict[str, Any]]) -> str:
    """Where the time goes, the median of each stage over frames (so the columns need not add up); the first three
    stages also per phase, since policies analyse different shares of their frames in each."""
    rows = ["| policy | stamping → decoded at server: all (good / bad) | server (wait, compute, annotate): all "
            "(good / bad) | result back to page: all (good / bad) | stamping → result (p50 / p95) "
            "| result → frame displayed | session start: first stamp → first result |", "|---|---|---|---|---|---|---|"]

    def stage(s: dict[str, Any], key: str) -> str:
        return (f"{fmt(s[f'{key}_p50_ms'], 1, 0)} ({fmt(s.get(f'{key}_p50_good_ms'), 1, 0)} / "
                f"{fmt(s.get(f'{key}_p50_bad_ms'), 1, 0)})")

    for name, s in results.items():
        if not s.get("frames"):
            continue
        rows.append(f"| {name} | {stage(s, 'to_server')} | {stage(s, 'server')} | {stage(s, 'downlink')} | "
                    f"{fmt(s['to_result_p50_ms'], 1, 0)} / {fmt(s['to_result_p95_ms'], 1, 0)} "
                    f"| {fmt(s['display_after_result_p50_ms'], 1, 0)} | {fmt(s.get('session_start_ms'), 1, 0)} |")
    return "\n".join(rows)


def recovery_table(results: dict[str, dict[str, Any]]) -> str:
    """Accuracy while the network is good, split at RECOVERY_S after each return to the best round trip."""
    rows = [f"| policy | good-network frames in the {RECOVERY_S:g} s after a recovery | accuracy there % | "
            "exits run there | reused there | frame height there (median px) | accuracy once settled % | "
            "exits run once settled | frame height once settled |",
            "|---|---|---|---|---|---|---|---|---|"]
    for name, s in results.items():
        if not s.get("frames") or "frames_recovering" not in s:
            continue
        rows.append(f"| {name} | {s['frames_recovering']} | {fmt(s['accuracy_recovering'], 100)} | "
                    f"{fmt(s['mean_exits_run_recovering'], 1, 2)} | {s['reused_recovering']} | "
                    f"{fmt(s.get('frame_height_recovering'), 1, 0)} | {fmt(s['accuracy_settled'], 100)} | "
                    f"{fmt(s['mean_exits_run_settled'], 1, 2)} | {fmt(s.get('frame_height_settled'), 1, 0)} |")
    return "\n".join(rows)


def fmt(v: float | None, scale: float = 1.0, digits: int = 1) -> str:
    return "–" if v is None else f"{v * scale:.{digits}f}"


def table(results: dict[str, dict[str, Any]]) -> str:
    """Every frame the browser stamped is in the first columns' denominator ("frames sent"); the hit rates after
    them are of answered frames, for the phases."""
    head = ("| policy | frames sent | answered on time % of sent | late | unanswered (not sent by the browser / "
            "answered, stamp unreadable / lost) | skipped at the server (answered from the smoothed state) "
            "| hit % of answered | hit % of answered (good / bad) | accuracy % | accuracy good / bad % "
            "| mean compute ms | mean exit (good / bad) | misses in 1st s after worsening | result p50 / p95 ms "
            "| display p50 / p95 ms | misses (with exit 1 alone) | misses no policy could avoid "
            "| answers reused |")
    rows = [head, "|" + "---|" * 18]
    for name, s in results.items():
        every = (f"| {name} | {s.get('sent', '–')} | {fmt(s.get('on_time_of_sent'), 100)} | {s.get('late', '–')} | "
                 f"{s.get('unanswered', '–')} ({s.get('not_sent', '–')} / {s.get('unreadable', '–')} / "
                 f"{s.get('lost', '–')}) | "
                 f"{s.get('skipped', '–')} ")
        if not s.get("frames"):
            rows.append(every + "| – " * 12 + "|")
            continue
        rows.append(
            every + f"| {fmt(s['deadline_hit_rate'], 100)} | {fmt(s['hit_rate_good'], 100)} / "
            f"{fmt(s['hit_rate_bad'], 100)} | {fmt(s['accuracy'], 100)} | {fmt(s['accuracy_good'], 100)} / "
            f"{fmt(s['accuracy_bad'], 100)} | {fmt(s['mean_compute_ms'])} | {fmt(s['mean_exit_good'], 1, 2)} / "
            f"{fmt(s['mean_exit_bad'], 1, 2)} | {s['misses_after_worsening']} of {s['frames_after_worsening']} | "
            f"{fmt(s['to_result_p50_ms'], 1, 0)} / {fmt(s['to_result_p95_ms'], 1, 0)} | "
            f"{fmt(s['to_display_p50_ms'], 1, 0)} / {fmt(s['to_display_p95_ms'], 1, 0)} | "
            f"{s['misses']} ({s['misses_exit1_only']}) | {s['misses_unavoidable']} | {s.get('reused', 0)} |")
    return "\n".join(rows)


def read_frames_csv(path: Path) -> list[FrameRecord]:
    kinds = {"counter": int, "exit": int, "exits_run": int, "horizon": int, "label": int, "answer": int,
             "frame_height": int, "skipped": lambda v: v == "True",
             "smoothed": int, "rtt_from_prior": lambda v: v == "True", "hit": lambda v: v == "True",
             "to_display_ms": lambda v: None if v in ("", "None") else float(v)}
    with path.open() as f:
        return [FrameRecord(**{k: kinds.get(k, float)(v) for k, v in row.items() if k != "correct"})  # type: ignore[operator]
                for row in csv.DictReader(f)]
