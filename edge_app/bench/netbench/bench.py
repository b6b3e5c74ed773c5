"""``edge-app bench-network``: every policy through the real browser and an impaired network path.

For each trace and policy: the app serves in the app namespace (one config per policy, written to the
output folder), the bridge replays the trace in the middle namespace, and headless Chromium in the client
namespace sends a labelled, stamped demo video in probe mode.  The trace's t = 0 is ``--lead`` seconds
after the app listens, so that the page is connected and RTCP has measured the path before anything changes.
From the page's records each frame gets: its stamping time, the delay the bridge applied then, the
server's RTT estimate and compute budget, the exits run and the exit used, the answer and the video's
ground-truth label, and whether the result reached the page within ``total_budget_ms`` of stamping.
Writes per run ``frames.csv``, a PNG time series and the logs; per trace ``summary.md`` and
``summary.json``.  Needs root (namespaces), Debian's chromium and the demo split (python -m exporter data).
"""

from __future__ import annotations

import bisect
import contextlib
import csv
import json
import logging
import os
import subprocess
import sys
import time
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

import numpy as np

from edge_app.bench.netbench import netns
from edge_app.bench.netbench.trace import Step, Trace, load_trace
from edge_app.bench.testvideo import LabelledVideo, write_y4m

log = logging.getLogger(__name__)
REPO = Path(__file__).resolve().parents[3]
PORT = 8080
VIDEO_IMAGES = 600  # demo test images in the camera's video (3 frames each)
RECOVERY_S = 3.0  # good-network frames this soon after the path came back are reported apart (summary.md)

POLICIES: dict[str, dict[str, Any]] = {
    "dynamic-index": {"kind": "dynamic-index"},
    "fixed-3 (no truncation)": {"kind": "fixed", "fixed_exit": 3, "truncate": False},
    "fixed-1": {"kind": "fixed", "fixed_exit": 1},
    "budget-greedy": {"kind": "budget-greedy"},
    "confidence-0.9": {"kind": "confidence", "threshold": 0.9},
}
SLUG = {"dynamic-index": "dynamic-index", "fixed-3 (no truncation)": "fixed-3", "fixed-1": "fixed-1",
        "budget-greedy": "budget-greedy", "confidence-0.9": "confidence-0.9"}


@dataclass(frozen=True)
class BenchOptions:
    total_budget_ms: float = 300.0
    safety_margin_ms: float = 40.0
    segment_ms: tuple[float, float, float] | None = (25.0, 25.0, 25.0)  # emulated device; None: real speed
    lead_s: float = 8.0
    model: Path = REPO / "models" / "default"
    video_npz: Path = REPO / "data" / "demo" / "test.npz"
    video_images: int = VIDEO_IMAGES


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

    @property
    def correct(self) -> bool:
        return self.answer == self.label

    @property
    def downlink_ms(self) -> float:  # result sent by the server -> at the page
        return self.to_result_ms - self.to_server_ms - self.server_ms


LOOPBACK = "loopback"  # the trace name that runs app and browser on this machine's loopback, no bridge
LOOPBACK_TRACE = Trace(LOOPBACK, (Step(0.0, 0.0),), hold_s=40.0)


def config_text(policy: dict[str, Any], opts: BenchOptions, addr: str = netns.APP_ADDR) -> str:
    pol = "".join(f"{k} = {json.dumps(v)}\n" for k, v in policy.items())
    return (f'[server]\nhost = "{addr}"\nport = {PORT}\nice_host_addresses = ["{addr}"]\n\n'
            f'[model]\npath = "{opts.model}"\nproviders = ["cpu"]\n{_emulation(opts)}\n'
            f"[policy]\n{pol}\n"
            f"[budget]\ntotal_budget_ms = {opts.total_budget_ms}\nsafety_margin_ms = {opts.safety_margin_ms}\n")


def _emulation(opts: BenchOptions) -> str:
    return "" if opts.segment_ms is None else f"emulated_segment_ms = {list(opts.segment_ms)}\n"


def demo_video(npz: Path, images: int = VIDEO_IMAGES) -> LabelledVideo:
    """The labelled video the fake camera plays: the first ``images`` demo test images, 3 frames each (600: one
    minute at 30 fps).  With 150 images a policy's accuracy gap to full depth moved by +-2 points with the choice
    of images alone (replayed offline on the VP8 test traces); with 600, by about +-1."""
    if not npz.exists():
        raise FileNotFoundError(f"{npz}: no demo split (make it with: python -m exporter data)")
    with np.load(npz) as z:
        return LabelledVideo(z["images"][:images], z["labels"][:images], hold=3)


def camera_video(npz: Path, out: Path, images: int = VIDEO_IMAGES) -> tuple[Path, LabelledVideo]:
    """The y4m file for Chromium's fake camera (640x480 raw: ~0.46 MB a frame), written once per image count."""
    video = demo_video(npz, images)
    path = out / f"camera-{len(video.labels)}.y4m"
    if not path.exists():
        print(f"writing {path} ({video.num_frames} frames, {video.num_frames * 0.46:.0f} MB)", flush=True)
        write_y4m(path, video)
    return path, video


class AppliedDelay:
    """The bridge's log: which one-way delay was in force at a wall-clock time."""

    def __init__(self, log_path: Path | None) -> None:
        rows: list[dict[str, Any]]
        if log_path is None:  # loopback: nothing added
            rows = [{"event": "start", "wall": 0.0, "one_way_ms": 0.0}]
        else:
            rows = [json.loads(ln) for ln in log_path.read_text().splitlines() if ln.strip()]
        changes = [r for r in rows if r["event"] in ("start", "change")]
        self.walls = [r["wall"] for r in changes]
        self.rtts = [2 * r["one_way_ms"] for r in changes]
        self.summary = next((r for r in rows if r["event"] == "summary"), None)

    def rtt_at(self, wall: float) -> float:
        return float(self.rtts[max(0, bisect.bisect_right(self.walls, wall) - 1)])


def frame_records(page: dict[str, Any], applied: AppliedDelay, t0: float, duration: float, video: LabelledVideo,
                  total_ms: float) -> tuple[list[FrameRecord], int]:
    """Per-frame records of the frames stamped within the trace; and how many such frames had no result."""
    sent = {c: (t, src) for c, t, src in page["sent"]}
    displayed: dict[int, float] = {}
    for c, t in page["displays"]:
        displayed.setdefault(c, t)
    in_window = {c for c, (t, _) in sent.items() if 0 <= (t / 1e3 - t0) < duration}
    out: list[FrameRecord] = []
    answered: set[int] = set()
    for r in page["results"]:
        c = r.get("stamp")
        if c is None or c not in in_window or c in answered:
            continue
        t_ms, src = sent[c]
        if src is None:
            continue
        answered.add(c)
        to_result = r["arrival_ms"] - t_ms
        shown = displayed.get(c)
        out.append(FrameRecord(
            t_s=t_ms / 1e3 - t0, counter=c, applied_rtt_ms=applied.rtt_at(t_ms / 1e3),
            rtt_estimate_ms=r["network"]["rtt_ms"], rtt_from_prior=bool(r["network"]["rtt_from_prior"]),
            compute_budget_ms=r["budget"]["compute_ms"], exit=r["exit"], exits_run=r["exits_run"],
            horizon=r["horizon"], compute_ms=r["costs"]["actual_ms"], label=video.label_of_stamp(src),
            answer=r["raw"]["class"], smoothed=r["smoothed"]["class"], to_result_ms=to_result,
            to_display_ms=None if shown is None else shown - t_ms, to_server_ms=r["arrived_unix_ms"] - t_ms,
            server_ms=r["latency_ms"], hit=to_result <= total_ms, late_ms=r["budget"]["late_ms"],
            frame_height=int(r.get("frame_size", [0, 0])[1])))
    out.sort(key=lambda f: f.t_s)
    return out, len(in_window) - len(answered)


def session_start_ms(page: dict[str, Any]) -> float | None:
    """From the first frame the page stamped to the first result it got: connection set-up and the first
    frames' warm-up on both sides (outside the measured window, which starts ``--lead`` s later)."""
    if not page["sent"] or not page["results"]:
        return None
    return float(min(r["arrival_ms"] for r in page["results"]) - min(t for _, t, _ in page["sent"]))


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


def summarise(frames: list[FrameRecord], unanswered: int, trace: Trace, total_ms: float) -> dict[str, Any]:
    if not frames:
        return {"frames": 0, "unanswered": unanswered}
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
        "frames": len(frames), "unanswered": unanswered,
        "deadline_hit_rate": float(np.mean([f.hit for f in frames])),
        "accuracy": acc(frames), "accuracy_good": acc(good), "accuracy_bad": acc(bad),
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


def plot_run(frames: list[FrameRecord], trace: Trace, policy: str, total_ms: float, path: Path) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    t = np.array([f.t_s for f in frames])
    fig, ax = plt.subplots(4, 1, figsize=(11, 8.5), sharex=True, gridspec_kw={"height_ratios": [2, 2, 1.2, 2]})
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
    ax[3].set_xlabel("seconds into the trace")
    ax[3].legend(loc="upper right", fontsize=8)
    for a in ax:
        for w in trace.worsenings():
            a.axvline(w, color="#fca5a5", lw=0.8)
    s = summarise(frames, 0, trace, total_ms)
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


def _wait_exit(p: subprocess.Popen[bytes], timeout: float) -> None:
    try:
        p.wait(timeout)
    except subprocess.TimeoutExpired:
        p.kill()
        p.wait(5)


def wait_listening(app: subprocess.Popen[bytes], log_path: Path, timeout_s: float = 120.0) -> None:
    """Until the app's log says it is listening (model loaded, sockets bound); an app that exits or takes
    longer than ``timeout_s`` is an error that quotes its log."""
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        if "serving on" in log_path.read_text(errors="replace"):
            return
        if app.poll() is not None:
            break
        time.sleep(0.2)
    tail = log_path.read_text(errors="replace")[-2000:]
    state = f"exited with {app.returncode}" if app.poll() is not None else f"not listening after {timeout_s:.0f} s"
    raise RuntimeError(f"the app {state}; {log_path}:\n{tail}")


def run_one(ns: netns.Namespaces | None, trace_path: Path, trace: Trace, policy: str, opts: BenchOptions,
            out: Path, camera: Path) -> dict[str, Any]:
    """One policy on one trace; ``ns`` None runs app and browser on loopback with no bridge."""
    out.mkdir(parents=True, exist_ok=True)
    addr = netns.APP_ADDR if ns is not None else "127.0.0.1"
    cfg = out / "config.toml"
    cfg.write_text(config_text(POLICIES[policy], opts, addr))
    py = sys.executable
    env = {**os.environ, "PYTHONUNBUFFERED": "1"}

    def inside(which: str) -> list[str]:
        return [] if ns is None else ["ip", "netns", "exec", getattr(ns, which)]

    bridge_log: Path | None = None
    bridge: subprocess.Popen[bytes] | None = None
    with (out / "app.log").open("wb") as app_log, (out / "driver.log").open("wb") as drv_log:
        app = subprocess.Popen([*inside("app"), py, "-m", "edge_app", "serve", "--config", str(cfg)],
                               stdout=app_log, stderr=subprocess.STDOUT, env=env, cwd=REPO)
        try:
            wait_listening(app, out / "app.log")
        except RuntimeError:
            app.terminate()
            _wait_exit(app, 15)
            raise
        # counted from a listening app, so the session has started and settled before the trace does
        t0 = time.time() + opts.lead_s
        if ns is not None:
            bridge_log = out / "bridge.jsonl"
            bridge_log.unlink(missing_ok=True)
            bridge = subprocess.Popen([*inside("mid"), py, "-m", "edge_app.bench.netbench.bridge",
                                       netns.MID_TO_APP, netns.MID_TO_CLI, "--trace", str(trace_path),
                                       "--start-at", repr(t0), "--log", str(bridge_log)], env=env, cwd=REPO)
        try:
            until = t0 + trace.duration_s + 1.5  # the last frames' results are still on their way
            drv = subprocess.run([*inside("cli"), py, "-m", "edge_app.bench.netbench.driver",
                                  "--url", f"http://{addr}:{PORT}/?probe=1", "--camera", str(camera),
                                  "--until", repr(until), "--out", str(out / "page.json"),
                                  "--screenshot", str(out / "page.png")],
                                 stdout=drv_log, stderr=subprocess.STDOUT, env=env, cwd=REPO,
                                 timeout=opts.lead_s + trace.duration_s + 90, check=False)
        finally:
            if bridge is not None:
                bridge.terminate()
                _wait_exit(bridge, 10)
            app.terminate()
            _wait_exit(app, 15)
    if drv.returncode != 0 or not (out / "page.json").exists():
        tail = (out / "driver.log").read_text(errors="replace")[-2000:]
        raise RuntimeError(f"{policy}: the browser run failed (exit {drv.returncode}); {out / 'driver.log'}:\n{tail}")
    page = json.loads((out / "page.json").read_text())
    applied = AppliedDelay(bridge_log)
    video = demo_video(opts.video_npz, opts.video_images)
    frames, unanswered = frame_records(page, applied, t0, trace.duration_s, video, opts.total_budget_ms)
    write_frames_csv(frames, out / "frames.csv")
    summary = summarise(frames, unanswered, trace, opts.total_budget_ms)
    summary["bridge"] = applied.summary
    summary["session_start_ms"] = session_start_ms(page)
    if frames:
        plot_run(frames, trace, policy, opts.total_budget_ms, out / "timeseries.png")
        (out / "misses.txt").write_text(misses_text(frames, trace, opts.total_budget_ms))
    return summary


def latency_table(results: dict[str, dict[str, Any]]) -> str:
    """Where the time goes, the median of each stage over frames (so the columns need not add up); the first three
    stages also per phase, since policies analyse different shares of their frames in each."""
    rows = ["| policy | stamping → decoded at server: all (good / bad) | server (wait, compute, annotate): all "
            "(good / bad) | result back to page: all (good / bad) | stamping → result (p50 / p95) "
            "| result → frame displayed | session start: first stamp → first result |", "|---|---|---|---|---|---|---|"]

    def stage(s: dict[str, Any], key: str) -> str:
        return (f"{_fmt(s[f'{key}_p50_ms'], 1, 0)} ({_fmt(s.get(f'{key}_p50_good_ms'), 1, 0)} / "
                f"{_fmt(s.get(f'{key}_p50_bad_ms'), 1, 0)})")

    for name, s in results.items():
        if not s.get("frames"):
            continue
        rows.append(f"| {name} | {stage(s, 'to_server')} | {stage(s, 'server')} | {stage(s, 'downlink')} | "
                    f"{_fmt(s['to_result_p50_ms'], 1, 0)} / {_fmt(s['to_result_p95_ms'], 1, 0)} "
                    f"| {_fmt(s['display_after_result_p50_ms'], 1, 0)} | {_fmt(s.get('session_start_ms'), 1, 0)} |")
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
        rows.append(f"| {name} | {s['frames_recovering']} | {_fmt(s['accuracy_recovering'], 100)} | "
                    f"{_fmt(s['mean_exits_run_recovering'], 1, 2)} | {s['reused_recovering']} | "
                    f"{_fmt(s.get('frame_height_recovering'), 1, 0)} | {_fmt(s['accuracy_settled'], 100)} | "
                    f"{_fmt(s['mean_exits_run_settled'], 1, 2)} | {_fmt(s.get('frame_height_settled'), 1, 0)} |")
    return "\n".join(rows)


def _fmt(v: float | None, scale: float = 1.0, digits: int = 1) -> str:
    return "–" if v is None else f"{v * scale:.{digits}f}"


def table(results: dict[str, dict[str, Any]]) -> str:
    head = ("| policy | frames | deadline hit % | hit % (good / bad) | accuracy % | accuracy good / bad % "
            "| mean compute ms | mean exit (good / bad) | misses in 1st s after worsening | result p50 / p95 ms "
            "| display p50 / p95 ms | no result | misses (with exit 1 alone) | misses no policy could avoid "
            "| answers reused |")
    rows = [head, "|" + "---|" * 15]
    for name, s in results.items():
        if not s.get("frames"):
            rows.append(f"| {name} | 0 | – | – | – | – | – | – | – | – | – | {s.get('unanswered', '–')} | – | – | – |")
            continue
        rows.append(
            f"| {name} | {s['frames']} | {_fmt(s['deadline_hit_rate'], 100)} | {_fmt(s['hit_rate_good'], 100)} / "
            f"{_fmt(s['hit_rate_bad'], 100)} | {_fmt(s['accuracy'], 100)} | {_fmt(s['accuracy_good'], 100)} / "
            f"{_fmt(s['accuracy_bad'], 100)} | {_fmt(s['mean_compute_ms'])} | {_fmt(s['mean_exit_good'], 1, 2)} / "
            f"{_fmt(s['mean_exit_bad'], 1, 2)} | {s['misses_after_worsening']} of {s['frames_after_worsening']} | "
            f"{_fmt(s['to_result_p50_ms'], 1, 0)} / {_fmt(s['to_result_p95_ms'], 1, 0)} | "
            f"{_fmt(s['to_display_p50_ms'], 1, 0)} / {_fmt(s['to_display_p95_ms'], 1, 0)} | {s['unanswered']} | "
            f"{s['misses']} ({s['misses_exit1_only']}) | {s['misses_unavoidable']} | {s.get('reused', 0)} |")
    return "\n".join(rows)


def read_frames_csv(path: Path) -> list[FrameRecord]:
    kinds = {"counter": int, "exit": int, "exits_run": int, "horizon": int, "label": int, "answer": int,
             "frame_height": int,
             "smoothed": int, "rtt_from_prior": lambda v: v == "True", "hit": lambda v: v == "True",
             "to_display_ms": lambda v: None if v in ("", "None") else float(v)}
    with path.open() as f:
        return [FrameRecord(**{k: kinds.get(k, float)(v) for k, v in row.items() if k != "correct"})  # type: ignore[operator]
                for row in csv.DictReader(f)]


def retabulate(out: Path, traces: list[str], policies: list[str], opts: BenchOptions) -> None:
    """Summaries, tables and plots again from the per-frame CSVs of an earlier run (no browser, no root)."""
    for tr_name in traces:
        trace = LOOPBACK_TRACE if tr_name == LOOPBACK else load_trace(tr_name)
        stem = Path(trace.name).stem
        old = json.loads((out / stem / "summary.json").read_text())
        per: dict[str, dict[str, Any]] = {}
        for pol in policies:
            frames = read_frames_csv(out / stem / SLUG[pol] / "frames.csv")
            per[pol] = {**summarise(frames, old[pol]["unanswered"], trace, opts.total_budget_ms),
                        "bridge": old[pol].get("bridge"), "session_start_ms": old[pol].get("session_start_ms")}
            if frames:
                plot_run(frames, trace, pol, opts.total_budget_ms, out / stem / SLUG[pol] / "timeseries.png")
                (out / stem / SLUG[pol] / "misses.txt").write_text(misses_text(frames, trace, opts.total_budget_ms))
        _write_summary(out, stem, per, opts)


def _write_summary(out: Path, stem: str, per: dict[str, dict[str, Any]], opts: BenchOptions) -> None:
    device = ("model at real speed" if opts.segment_ms is None
              else "emulated segments " + "/".join(f"{ms:g}" for ms in opts.segment_ms) + " ms")
    md = (f"## {stem} (total budget {opts.total_budget_ms:.0f} ms, {device}, "
          f"margin {opts.safety_margin_ms:g} ms)\n\n{table(per)}\n\n"
          f"Latency by stage, p50 ms:\n\n{latency_table(per)}\n")
    if any(s.get("frames_recovering") for s in per.values()):
        md += f"\nWhile the network is good, just after it came back and once settled:\n\n{recovery_table(per)}\n"
    (out / stem / "summary.md").write_text(md)
    (out / stem / "summary.json").write_text(json.dumps(per, indent=1))
    print("\n" + md, flush=True)


def bench_network(traces: list[str], policies: list[str], opts: BenchOptions, out: Path) -> dict[str, Any]:
    out.mkdir(parents=True, exist_ok=True)
    camera, _ = camera_video(opts.video_npz, out, opts.video_images)
    report: dict[str, Any] = {"options": {k: str(v) for k, v in asdict(opts).items()}, "traces": {}}
    with contextlib.ExitStack() as stack:
        ns: netns.Namespaces | None = None
        for tr_name in traces:
            if tr_name == LOOPBACK:
                trace, trace_path, run_ns = LOOPBACK_TRACE, Path(LOOPBACK), None
            else:
                trace = load_trace(tr_name)
                trace_path = Path(trace.name)
                if ns is None:
                    ns = stack.enter_context(netns.namespaces())
                run_ns = ns
            per: dict[str, dict[str, Any]] = {}
            for i, pol in enumerate(policies, 1):
                started = time.monotonic()
                print(f"[{trace_path.stem}] {i}/{len(policies)} {pol}: {opts.lead_s + trace.duration_s:.0f} s ...",
                      flush=True)
                per[pol] = run_one(run_ns, trace_path, trace, pol, opts, out / trace_path.stem / SLUG[pol], camera)
                s = per[pol]
                print(f"    {s.get('frames', 0)} frames, deadline hit "
                      f"{_fmt(s.get('deadline_hit_rate'), 100)} %, accuracy {_fmt(s.get('accuracy'), 100)} % "
                      f"({time.monotonic() - started:.0f} s)", flush=True)
            _write_summary(out, trace_path.stem, per, opts)
            report["traces"][trace_path.stem] = per
    (out / "report.json").write_text(json.dumps(report, indent=1))
    return report
