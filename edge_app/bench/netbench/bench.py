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
from edge_app.bench.netbench.report import (
    FrameRecord,
    fmt,
    latency_table,
    misses_text,
    plot_run,
    read_frames_csv,
    read_throughput,
    recovery_table,
    summarise,
    table,
    write_frames_csv,
)
from edge_app.bench.netbench.trace import Step, Trace, load_trace
from edge_app.bench.testvideo import LabelledVideo, write_y4m

log = logging.getLogger(__name__)
REPO = Path(__file__).resolve().parents[3]
PORT = 8080
VIDEO_IMAGES = 600  # demo test images in the camera's video (3 frames each)

POLICIES: dict[str, dict[str, Any]] = {
    "as shipped": {},  # config.toml's [policy]: kind = "auto" (fit-policy's held-out choice), adapt_to_load
    "as shipped, results only": {"video_back": False},
    "dynamic-index": {"kind": "dynamic-index"},
    # depth set by the deadline alone (the fitted lam, whatever the arrival rate): what a delay step does to it
    "dynamic-index, fitted lam": {"kind": "dynamic-index", "adapt_to_load": False},
    "dynamic-index, results only": {"kind": "dynamic-index", "video_back": False},
    "fixed-3 (no truncation)": {"kind": "fixed", "fixed_exit": 3, "truncate": False},
    "fixed-1": {"kind": "fixed", "fixed_exit": 1},
    "budget-greedy": {"kind": "budget-greedy"},
    "confidence-0.9": {"kind": "confidence", "threshold": 0.9},
}
SLUG = {"as shipped": "shipped", "as shipped, results only": "shipped-results",
        "dynamic-index": "dynamic-index",
        "dynamic-index, fitted lam": "dynamic-index-fitted", "dynamic-index, results only": "dynamic-index-results",
        "fixed-3 (no truncation)": "fixed-3", "fixed-1": "fixed-1",
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


LOOPBACK = "loopback"  # the trace name that runs app and browser on this machine's loopback, no bridge
LOOPBACK_TRACE = Trace(LOOPBACK, (Step(0.0, 0.0),), hold_s=40.0)


def config_text(policy: dict[str, Any], opts: BenchOptions, addr: str = netns.APP_ADDR) -> str:
    pol = "".join(f"{k} = {json.dumps(v)}\n" for k, v in policy.items())
    return (f'[server]\nhost = "{addr}"\nport = {PORT}\nice_host_addresses = ["{addr}"]\n\n'
            f'[model]\npath = "{opts.model}"\nproviders = ["cpu"]\n\n'
            f"[policy]\n{pol}\n"
            f"[budget]\ntotal_budget_ms = {opts.total_budget_ms}\nsafety_margin_ms = {opts.safety_margin_ms}\n")


def app_command(py: str, cfg: Path, opts: BenchOptions) -> list[str]:
    """``edge-app serve``, or its emulated-device twin (``edge_app.bench.serve``) when segments are padded."""
    if opts.segment_ms is None:
        return [py, "-m", "edge_app", "serve", "--config", str(cfg)]
    return [py, "-m", "edge_app.bench.serve", "--config", str(cfg), "--segment-ms",
            ",".join(f"{ms:g}" for ms in opts.segment_ms)]


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
                  total_ms: float) -> tuple[list[FrameRecord], dict[str, int]]:
    """Per-frame records of the frames stamped within the trace that got a result; and every frame stamped there,
    counted as users see it: ``sent`` (stamped by the page: the denominator), ``unanswered``, of which
    ``not_sent`` (the browser's encoder never sent them: it was asked for fewer frames, or its own rate control
    dropped them; from its ``framesSent``), ``unreadable`` (answered, but the server could not read the frame's
    stamp, so the page cannot tell which frame: as many as such answers arrived in the window) and ``lost`` (sent,
    and no answer came back: lost on the path, not decoded, or the answer itself lost)."""
    sent = {c: (t, src) for c, t, src in page["sent"]}
    displayed: dict[int, float] = {}
    for c, t in page["displays"]:
        displayed.setdefault(c, t)
    in_window = {c for c, (t, _) in sent.items() if 0 <= (t / 1e3 - t0) < duration}
    out: list[FrameRecord] = []
    answered: set[int] = set()
    for r in page["results"]:
        c = r.get("stamp_abs", r.get("stamp"))
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
            frame_height=int(r.get("frame_size", [0, 0])[1]), bitrate_bps=float(r["network"].get("bitrate_bps", 0)),
            skipped=bool(r.get("skipped"))))
    out.sort(key=lambda f: f.t_s)
    unanswered = len(in_window) - len(answered)
    not_sent = min(unanswered, max(0, len(in_window) - frames_sent_between(page.get("stats", []), in_window, sent)))
    # a result whose frame's stamp the server could not read (a frame coded too coarsely) answers a frame the page
    # cannot name: counted apart, from the results that arrived in the window without one
    unreadable = sum(1 for r in page["results"]
                     if r.get("stamp") is None and 0 <= r["arrival_ms"] / 1e3 - t0 < duration)
    unmatched = min(unanswered - not_sent, unreadable)
    return out, {"sent": len(in_window), "unanswered": unanswered, "not_sent": not_sent,
                 "unreadable": unmatched, "lost": unanswered - not_sent - unmatched}


def frames_sent_between(stats: list[list[float]], window: set[int], sent: dict[int, tuple[float, Any]]) -> int:
    """How many of the frames stamped in ``window`` the browser's encoder sent: its ``framesSent`` between the
    window's first and last stamping times, interpolated between the page's samples (about one a second). Without
    samples, all of them."""
    if not window or len(stats) < 2:
        return len(window)
    times = [s[0] for s in stats]
    counts = [s[3] for s in stats]
    first, last = sent[min(window)][0], sent[max(window)][0]
    return round(float(np.interp(last, times, counts) - np.interp(first, times, counts))) + 1


def session_start_ms(page: dict[str, Any]) -> float | None:
    """From the first frame the page stamped to the first result it got: connection set-up and the first
    frames' warm-up on both sides (outside the measured window, which starts ``--lead`` s later)."""
    if not page["sent"] or not page["results"]:
        return None
    return float(min(r["arrival_ms"] for r in page["results"]) - min(t for _, t, _ in page["sent"]))


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
    settings = dict(POLICIES[policy])
    video_back = settings.pop("video_back", True)  # the page's choice: annotated video back, or results only
    cfg.write_text(config_text(settings, opts, addr))
    py = sys.executable
    env = {**os.environ, "PYTHONUNBUFFERED": "1"}

    def inside(which: str) -> list[str]:
        return [] if ns is None else ["ip", "netns", "exec", getattr(ns, which)]

    bridge_log: Path | None = None
    bridge: subprocess.Popen[bytes] | None = None
    with (out / "app.log").open("wb") as app_log, (out / "driver.log").open("wb") as drv_log:
        app = subprocess.Popen([*inside("app"), *app_command(py, cfg, opts)],
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
                                  "--url", f"http://{addr}:{PORT}/?probe=1{'&video=1' if video_back else ''}",
                                  "--camera", str(camera),
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
    frames, counts = frame_records(page, applied, t0, trace.duration_s, video, opts.total_budget_ms)
    write_frames_csv(frames, out / "frames.csv")
    (out / "counts.json").write_text(json.dumps(counts))
    summary = summarise(frames, counts, trace, opts.total_budget_ms)
    summary["bridge"] = applied.summary
    summary["session_start_ms"] = session_start_ms(page)
    if frames:
        plot_run(frames, trace, policy, opts.total_budget_ms, out / "timeseries.png", read_throughput(bridge_log))
        (out / "misses.txt").write_text(misses_text(frames, trace, opts.total_budget_ms))
    return summary


def retabulate(out: Path, traces: list[str], policies: list[str], opts: BenchOptions) -> None:
    """Summaries, tables and plots again from the per-frame CSVs of an earlier run (no browser, no root)."""
    for tr_name in traces:
        trace = LOOPBACK_TRACE if tr_name == LOOPBACK else load_trace(tr_name)
        stem = Path(trace.name).stem
        old = json.loads((out / stem / "summary.json").read_text())
        per: dict[str, dict[str, Any]] = {}
        for pol in policies:
            frames = read_frames_csv(out / stem / SLUG[pol] / "frames.csv")
            counts_file = out / stem / SLUG[pol] / "counts.json"
            gone = old[pol]["unanswered"]
            counts = json.loads(counts_file.read_text()) if counts_file.exists() else \
                {"sent": old[pol].get("sent", len(frames) + gone), "unanswered": gone}
            per[pol] = {**summarise(frames, counts, trace, opts.total_budget_ms),
                        "bridge": old[pol].get("bridge"), "session_start_ms": old[pol].get("session_start_ms")}
            if frames:
                run_dir = out / stem / SLUG[pol]
                plot_run(frames, trace, pol, opts.total_budget_ms, run_dir / "timeseries.png",
                         read_throughput(run_dir / "bridge.jsonl"))
                (out / stem / SLUG[pol] / "misses.txt").write_text(misses_text(frames, trace, opts.total_budget_ms))
        _write_summary(out, stem, per, opts)


def _write_summary(out: Path, stem: str, per: dict[str, dict[str, Any]], opts: BenchOptions) -> None:
    device = ("model at real speed" if opts.segment_ms is None
              else "emulated segments " + "/".join(f"{ms:g}" for ms in opts.segment_ms) + " ms")
    md = (f"## {stem} (total budget {opts.total_budget_ms:.0f} ms, {device}, "
          f"margin {opts.safety_margin_ms:g} ms)\n\n{table(per)}\n\n"
          f"Latency by stage, p50 ms:\n\n{latency_table(per)}\n\nAccuracy while the network is good, of the frames the "
          "model answered itself (not reused, not skipped): " + ", ".join(
              f"{name} {fmt(s.get('accuracy_good_analysed'), 100)} %" for name, s in per.items()) + "\n")
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
                      f"{fmt(s.get('deadline_hit_rate'), 100)} %, accuracy {fmt(s.get('accuracy'), 100)} % "
                      f"({time.monotonic() - started:.0f} s)", flush=True)
            _write_summary(out, trace_path.stem, per, opts)
            report["traces"][trace_path.stem] = per
    (out / "report.json").write_text(json.dumps(report, indent=1))
    return report
