"""The impairment path and the whole product under it, in network namespaces (root; .ci/run runs these).

* The bridge alone: UDP echo between the app and client namespaces sees the trace's delay (within a
  millisecond or two), keeps order without jitter, and loses about the trace's share of packets.
* The product: headless Chromium in the client namespace, the app in the app namespace, the short
  step trace (20 -> 150 -> 20 ms RTT) in between.  The server's RTT estimate follows the step within a
  few seconds both ways, and the exits get shallower while the delay is high and deeper after.
"""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
import time
from pathlib import Path

import numpy as np
import pytest
from support.live import skip_or_fail

from edge_app.bench.netbench import netns
from edge_app.bench.netbench.bench import BenchOptions, run_one
from edge_app.bench.netbench.trace import load_trace

REPO = Path(__file__).resolve().parents[1]
pytestmark = [pytest.mark.netns, pytest.mark.slow, pytest.mark.live]

ECHO = """
import socket, sys, time
if sys.argv[1] == "server":
    s = socket.socket(socket.AF_INET, socket.SOCK_DGRAM); s.bind(("0.0.0.0", 9999)); s.settimeout(30)
    while True:
        d, a = s.recvfrom(2000); s.sendto(d, a)
s = socket.socket(socket.AF_INET, socket.SOCK_DGRAM); s.settimeout(0.05)
n, gap = int(sys.argv[2]), float(sys.argv[3])
sent = {}
got = []
def take(d):
    if d == b"warm":  # a late answer to a retried warm-up echo
        return
    j = int.from_bytes(d[:4], "big"); got.append((j, (time.perf_counter() - sent[j]) * 1e3))
s.settimeout(0.5)  # one echo first, so that ARP is resolved before the measured ones (retried: lossy traces)
for _ in range(20):
    s.sendto(b"warm", (sys.argv[4], 9999))
    try:
        if s.recvfrom(2000)[0] == b"warm":
            break
    except socket.timeout:
        pass
for i in range(n):
    sent[i] = time.perf_counter(); s.sendto(i.to_bytes(4, "big") + b"x" * 96, (sys.argv[4], 9999))
    end = time.perf_counter() + gap
    while time.perf_counter() < end:
        s.settimeout(max(1e-4, end - time.perf_counter()))
        try:
            take(s.recvfrom(2000)[0])
        except socket.timeout:
            pass
s.settimeout(1.0)
try:
    while True:
        take(s.recvfrom(2000)[0])
except socket.timeout:
    pass
print(" ".join(f"{j}:{ms:.3f}" for j, ms in got))
"""


SINK = """
import socket, sys, time
s = socket.socket(socket.AF_INET, socket.SOCK_DGRAM); s.bind(("0.0.0.0", 9998)); s.settimeout(1.5)
first = last = None; total = 0
try:
    while True:
        d, _ = s.recvfrom(2000); last = time.perf_counter(); first = first or last; total += len(d)
except socket.timeout:
    pass
print(f"{total} {(last or 0) - (first or 0):.4f}")
"""
BLAST = """
import socket, sys, time
s = socket.socket(socket.AF_INET, socket.SOCK_DGRAM)
for i in range(int(sys.argv[1])):
    s.sendto(b"x" * 1000, (sys.argv[2], 9998))
    time.sleep(0.0005)  # ~16 Mbit/s offered, well above the limit
"""


def _need_netns() -> None:
    try:
        netns.check_available()
    except netns.NetnsUnavailable as exc:
        skip_or_fail(f"{exc} (.ci/run runs as root and installs iproute2 and ethtool)")


def _echo(ns: netns.Namespaces, trace: Path, count: int, gap_s: float, tmp: Path) -> list[tuple[int, float]]:
    script = tmp / "echo.py"
    script.write_text(ECHO)
    server = subprocess.Popen(["ip", "netns", "exec", ns.app, sys.executable, str(script), "server"])
    bridge = subprocess.Popen(["ip", "netns", "exec", ns.mid, sys.executable, "-m", "edge_app.bench.netbench.bridge",
                               netns.MID_TO_APP, netns.MID_TO_CLI, "--trace", str(trace), "--log",
                               str(tmp / "bridge.jsonl")], cwd=REPO)
    try:
        time.sleep(0.5)
        out = subprocess.run(["ip", "netns", "exec", ns.cli, sys.executable, str(script), "client", str(count),
                              str(gap_s), netns.APP_ADDR], capture_output=True, text=True, timeout=60, check=True)
    finally:
        bridge.terminate()
        server.kill()
        bridge.wait(10)
        server.wait(10)
    return [(int(a), float(b)) for a, b in (p.split(":") for p in out.stdout.split())]


def test_bridge_applies_delay_in_order_and_loss(tmp_path: Path) -> None:
    _need_netns()
    (tmp_path / "delay.csv").write_text("t_s,rtt_ms\n0,40\n")
    (tmp_path / "loss.csv").write_text("t_s,rtt_ms,loss_pct\n0,10,30\n")
    with netns.namespaces() as ns:
        got = _echo(ns, tmp_path / "delay.csv", 100, 0.005, tmp_path)  # 5 ms apart: several in flight
        lossy = _echo(ns, tmp_path / "loss.csv", 300, 0.002, tmp_path)
    assert [j for j, _ in got] == list(range(100)), "no loss and no reordering without jitter"
    rtt = np.array([ms for _, ms in got])
    print(f"bridge: 40 ms trace RTT measured p50 {np.median(rtt):.2f} ms, max {rtt.max():.2f} ms; "
          f"30 % loss per direction: {len(lossy)} of 300 echoes came back")
    assert 40.0 <= np.median(rtt) < 42.5 and rtt.max() < 50
    # two crossings at 30 % each: about 49 % of echoes return; 300 trials keep it within 0.38..0.60
    assert 0.38 * 300 < len(lossy) < 0.60 * 300
    assert not [n for n in subprocess.run(["ip", "netns", "list"], capture_output=True, text=True).stdout.split()
                if n.startswith(netns.PREFIX) and n.endswith(f"-{os.getpid()}")], "namespaces are removed"


def test_bridge_rate_limit_is_a_tbf(tmp_path: Path) -> None:
    _need_netns()
    (tmp_path / "rate.csv").write_text("t_s,rtt_ms,rate_kbit\n0,10,2000\n")
    (tmp_path / "sink.py").write_text(SINK)
    (tmp_path / "blast.py").write_text(BLAST)
    with netns.namespaces() as ns:
        bridge = subprocess.Popen(["ip", "netns", "exec", ns.mid, sys.executable, "-m",
                                   "edge_app.bench.netbench.bridge", netns.MID_TO_APP, netns.MID_TO_CLI,
                                   "--trace", str(tmp_path / "rate.csv"), "--log", str(tmp_path / "bridge.jsonl")],
                                  cwd=REPO)
        try:
            time.sleep(0.5)
            qdisc = subprocess.run(["ip", "netns", "exec", ns.mid, "tc", "qdisc", "show", "dev", netns.MID_TO_APP],
                                   capture_output=True, text=True, check=True).stdout
            sink = subprocess.Popen(["ip", "netns", "exec", ns.app, sys.executable, str(tmp_path / "sink.py")],
                                    stdout=subprocess.PIPE, text=True)
            time.sleep(0.3)
            subprocess.run(["ip", "netns", "exec", ns.cli, sys.executable, str(tmp_path / "blast.py"), "1500",
                            netns.APP_ADDR], check=True, timeout=60)
            out, _ = sink.communicate(timeout=30)
        finally:
            bridge.terminate()
            bridge.wait(10)
    total, span = out.split()
    kbit_s = int(total) * 8 / float(span) / 1e3
    print(f"bridge: tbf 2000 kbit -> {kbit_s:.0f} kbit/s of UDP payload received; qdisc: {qdisc.strip()}")
    assert "tbf" in qdisc and "rate 2Mbit" in qdisc
    assert 1500 < kbit_s < 2100, "payload rate near the limit (headers take the rest)"


def test_rtt_estimate_and_exits_follow_a_delay_step(tmp_path: Path,
                                                   demo_test_split: tuple[np.ndarray, np.ndarray]) -> None:
    _need_netns()
    if shutil.which("/usr/bin/chromium") is None:
        skip_or_fail("needs Debian's chromium (apt-get install chromium; .ci/run does)")
    from edge_app.bench.netbench.bench import camera_video

    demo = tmp_path / "test.npz"  # the demo recipe's test split, as `python -m exporter data` writes it
    np.savez(demo, images=demo_test_split[0], labels=demo_test_split[1])

    trace = load_trace("short-step")  # 20 ms RTT, 150 ms from t=10 s, 20 ms from t=22 s, ends at 32 s
    opts = BenchOptions(lead_s=10.0, video_npz=demo, video_images=150)  # RTT and depth, not accuracy: a short video
    camera, _ = camera_video(demo, tmp_path, opts.video_images)
    with netns.namespaces() as ns:
        summary = run_one(ns, Path(trace.name), trace, "dynamic-index, fitted lam", opts, tmp_path / "run", camera)
    import csv
    import json

    counts = json.loads((tmp_path / "run" / "counts.json").read_text())
    print(f"every frame stamped: {counts}; answered {summary['frames']} ({summary['skipped']} skipped at the "
          f"server), on time {100 * summary['on_time_of_sent']:.1f} % of those stamped")
    page = json.loads((tmp_path / "run" / "page.json").read_text())  # what the page showed across the step
    assert page["page_errors"] == [], page["page_errors"]
    assert "bad" not in str((page["health"] or ["", ""])[0]).split(), page["health"]
    assert counts["sent"] == summary["frames"] + counts["unanswered"], "every frame stamped is answered or counted"
    assert counts["unanswered"] == counts["not_sent"] + counts["unreadable"] + counts["lost"], \
        "each unanswered frame has a reason"
    assert summary["late"] + round(summary["on_time_of_sent"] * counts["sent"]) == summary["frames"]
    rows = [r for r in csv.DictReader((tmp_path / "run" / "frames.csv").open()) if r["skipped"] != "True"]
    t = np.array([float(r["t_s"]) for r in rows])
    est = np.array([float(r["rtt_estimate_ms"]) for r in rows])
    applied = np.array([float(r["applied_rtt_ms"]) for r in rows])
    exit_used = np.array([int(r["exit"]) for r in rows])
    allowed = np.array([int(r["horizon"]) for r in rows])
    late = np.array([float(r["late_ms"]) for r in rows])

    def part(a: np.ndarray, lo: float, hi: float) -> np.ndarray:
        return a[(t >= lo) & (t < hi)]

    # t_s is the browser's stamping time; the estimate is the server's when it runs that frame, 75 ms and a
    # transport later. By then reports that straddle the fall at 22 s (sender report out under 150 ms, receiver
    # report back under 20 ms) can already have pulled it down: a CI run read 119.5 ms for a frame stamped
    # just before 22 s. So the "during" window ends half a second before the fall.
    during_w = (13.0, 21.5)
    before_w = (3.0, 9.5)  # the same at the rise: a frame stamped just before 10 s ran after reports of the step

    print(f"netns step: {summary['frames']} frames, deadline hit {100 * summary['deadline_hit_rate']:.1f} %, "
          f"RTT estimate median before/during/after {np.median(part(est, 3, 10)):.0f}/"
          f"{np.median(part(est, *during_w)):.0f}/{np.median(part(est, 26, 32)):.0f} ms, mean exit "
          f"{part(exit_used, 3, 10).mean():.2f}/{part(exit_used, *during_w).mean():.2f}/"
          f"{part(exit_used, 26, 32).mean():.2f}, exits allowed {part(allowed, 3, 10).mean():.2f}/"
          f"{part(allowed, *during_w).mean():.2f}/{part(allowed, 26, 32).mean():.2f}, late_ms median before "
          f"{np.median(part(late, 3, 10)):.0f}, first 0.5 s after the rise {np.median(part(late, 10.0, 10.5)):.0f}; "
          f"{tmp_path / 'run'}")
    assert summary["frames"] > 300, summary
    # the window starts --lead s after the app listens: the session's start-up is outside it
    assert 0 < summary["session_start_ms"] < 1e3 * opts.lead_s, summary["session_start_ms"]
    assert t.min() < 0.5 and (tmp_path / "run" / "app.log").read_text().count("serving on") == 1
    assert set(np.unique(applied)) == {20.0, 150.0}, "the bridge applied both delays"
    # the estimate follows the step within 3 s up and 4 s down (the trend term may overshoot by ~50 %
    # for a few seconds after the rise: a worsening is projected one second ahead)
    before = part(est, *before_w)  # a loaded CI box has read one short blip of ~51 ms on the 20 ms path
    assert np.median(before) < 40 and np.mean(before < 50) >= 0.9 and before.max() < 80, (np.median(before),
                                                                                           before.max())
    during = part(est, *during_w)
    assert np.all(during > 120) and np.median(during) < 200 and during.max() < 300, (np.median(during), during.max())
    after = part(est, 26, 32)  # back down within 4 s; a loaded CI box once read two late pings in a row there
    assert np.median(after) < 40 and np.mean(after < 50) >= 0.9 and after.max() < 80, (np.median(after), after.max())
    # before any RTT sample shows the step, the frames themselves do: they arrive ~65 ms later. An RTCP sample
    # made wholly over the slowed path needs >= 150 ms, so the first three frames after the step (~100 ms) are
    # read before one; a report that straddled the step may have moved the estimate part way (one run under
    # load read 29 -> 50 ms there). Later in the first 0.5 s it depends on when reports happen to go: a CI run's
    # estimate rose within 0.1 s, and late_ms, which counts only what the estimate does not, fell to ~33 ms.
    assert np.median(part(late, 3, 10)) < 25, np.median(part(late, 3, 10))
    first = (t >= 10.0) & (t < 10.5) & (applied == 150.0)
    unseen = np.flatnonzero(first)[:3]
    assert len(unseen) == 3 and np.median(late[unseen]) > 35, (late[unseen], est[unseen])
    # ...and from then on every frame's budget covers the step, by late_ms or by the estimate or by both
    rtt_low = float(np.median(part(est, 3, 10)))
    covered = late[first] + np.maximum(0.0, est[first] - rtt_low) / 2
    assert np.all(covered > 45), (covered, late[first], est[first])
    # shallower while the delay is high, deeper again after
    before, during, after = (part(allowed, *w).mean() for w in ((3, 10), during_w, (26, 32)))
    assert before > 2.5 and during < 2.0 and after > 2.5, (before, during, after)
    used = [part(exit_used, *w).mean() for w in ((3, 10), during_w, (26, 32))]
    assert used[1] < used[0] and used[1] < used[2], used


def test_a_rate_cap_results_only_stay_on_time_and_video_back_backs_off(
        tmp_path: Path, demo_test_split: tuple[np.ndarray, np.ndarray]) -> None:
    """The short rate-cap trace (30 ms RTT; 250 kbit/s each way from 8 s to 22 s) through Chromium and the bridge.

    Results only: the server asks the page for fewer uplink bits as soon as its frames queue, the session is never
    dropped, and once the cut has taken hold results are on time.  Annotated video back: the encoder's target
    falls below the cap within about 2 s of it (read from the results' smoothed send bitrate, which lags the
    target by up to a second)."""
    _need_netns()
    if shutil.which("/usr/bin/chromium") is None:
        skip_or_fail("needs Debian's chromium (apt-get install chromium; .ci/run does)")
    import csv

    from edge_app.bench.netbench.bench import camera_video

    demo = tmp_path / "test.npz"
    np.savez(demo, images=demo_test_split[0], labels=demo_test_split[1])
    trace = load_trace("short-ratecap")
    opts = BenchOptions(lead_s=10.0, video_npz=demo, video_images=150)
    camera, _ = camera_video(demo, tmp_path, opts.video_images)
    runs = {}
    for policy in ("dynamic-index, results only", "dynamic-index"):
        out = tmp_path / policy.replace(", ", "-").replace(" ", "-")
        with netns.namespaces() as ns:
            run_one(ns, Path(trace.name), trace, policy, opts, out, camera)
        rows = list(csv.DictReader((out / "frames.csv").open()))
        runs[policy] = (out, {k: np.array([float(r[k]) if k != "hit" else r[k] == "True" for r in rows])
                              for k in ("t_s", "hit", "to_result_ms", "bitrate_bps")})
    out, r = runs["dynamic-index, results only"]
    log = (out / "app.log").read_text()
    settled = (r["t_s"] >= 12) & (r["t_s"] < 28)
    print(f"rate cap, results only: {len(r['t_s'])} frames answered, on time {100 * r['hit'].mean():.1f} % "
          f"(from 12 s: {100 * r['hit'][settled].mean():.1f} % of {settled.sum()}); uplink requests "
          f"{log.count('asking the browser')} ({log.count('kbit/s, 1/')} with a cap)")
    assert "peer-gone" not in log and "closed (shutdown)" in log, "the session lasts to the end"
    assert log.count("kbit/s, 1/") >= 1, "the server asked for fewer bits (not only the size the analysis uses)"
    assert settled.sum() >= 150 and r["hit"][settled].mean() >= 0.95, "results flow, and on time, under the cap"
    _, v = runs["dynamic-index"]
    below = v["t_s"][(v["t_s"] >= 8) & (v["bitrate_bps"] < 250_000)]  # the server's (smoothed) send bitrate
    print(f"rate cap, video back: encoder target before {np.median(v['bitrate_bps'][v['t_s'] < 8]):.0f} bit/s, "
          f"first under 250 kbit/s at {below.min() if below.size else float('nan'):.2f} s")
    assert below.size and below.min() < 11.0, "the encoder's target falls below the cap within about 2 s"
