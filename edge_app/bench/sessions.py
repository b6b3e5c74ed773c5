"""``edge-app bench-sessions``: how many browser sessions this box serves at once, and what happens beyond.

A real ``edge-app serve`` process (``--workers N``: its control process and N media workers) with ``[server]
max_sessions = M``; aiortc peers (``edge_app.bench.peers``, in ``--peer-processes`` processes of their own), each
sending a labelled 640x480 video at 30 fps and receiving per-frame results (and the annotated video unless
``--results-only``), are added one at a time.  For each count the results of every session are collected for a
window: results per second per session (30 = every frame analysed), the server-side latency p50/p95 (frame arrival
to result), deadline misses, and the CPU use of the server's processes and of the peers'.  Then one more peer than
``max_sessions`` asks to join: it must get 503, and the running sessions are measured once more.  The peers run on
the same cores; their VP8 encoders are the largest part of their cost, and ``--pre-encoded`` takes it away (the
clip encoded once, as a browser's hardware encoder or a browser on another machine would spare this box).
``--cameras K`` adds K RTSP cameras (GStreamer test servers on loopback, 640x480 H.264 at 30 fps), analysed all the
while.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import logging
import os
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

import aiohttp

from edge_app.bench.peers import PeerPool, peer_video
from edge_app.bench.rtsp_camera import RtspServer, free_port, gst_rtsp_available
from edge_app.bench.testvideo import write_jpegs
from edge_app.bench.triton import group_cpu_s

log = logging.getLogger(__name__)
REPO = Path(__file__).resolve().parents[2]


async def wait_healthy(http: aiohttp.ClientSession, base: str, timeout_s: float = 30.0) -> None:
    """Until the server at ``base`` answers /healthz (a server process just started)."""
    for _ in range(int(timeout_s * 10)):
        with contextlib.suppress(aiohttp.ClientError):
            async with http.get(f"{base}/healthz") as r:
                if r.status == 200:
                    return
        await asyncio.sleep(0.1)


async def _camera_fps(http: aiohttp.ClientSession, base: str) -> dict[str, int]:
    async with http.get(f"{base}/status") as r:
        return {c["name"]: c["frames_analysed"] for c in (await r.json())["cameras"]}


async def _run(model: Path, max_sessions: int, window_s: float, npz: Path | None, out: Path,
               cameras: int = 0, results_only: bool = False, workers: int = 1, peer_processes: int = 1,
               pre_encoded: bool = False) -> dict[str, Any]:
    out.mkdir(parents=True, exist_ok=True)
    port = free_port()
    video = peer_video(npz)
    rtsp: list[RtspServer] = []
    if cameras:
        if not gst_rtsp_available():
            raise FileNotFoundError("--cameras needs GStreamer's RTSP server for the system Python "
                                    "(apt-get install python3-gi gir1.2-gst-rtsp-server-1.0 gstreamer1.0-plugins-"
                                    "{base,good,ugly})")
        frames = write_jpegs(out / "camera-frames", video)
        for _ in range(cameras):
            rtsp.append(RtspServer(frames, free_port()))
            rtsp[-1].start()
    cams = "".join(f'\n[[cameras]]\nname = "cam{i + 1}"\nurl = "{c.url}"\n' for i, c in enumerate(rtsp))
    cfg = out / "config.toml"
    cfg.write_text(f'[server]\nport = {port}\nmax_sessions = {max_sessions}\nice_host_addresses = ["127.0.0.1"]\n'
                   f'max_offers_per_minute = 1000\n\n[model]\npath = "{model}"\n{cams}')
    server_log = (out / "server.log").open("wb")
    server = subprocess.Popen([sys.executable, "-m", "edge_app", "serve", "--config", str(cfg), "--workers",
                               str(workers)], cwd=REPO, stdout=server_log, stderr=subprocess.STDOUT,
                              start_new_session=True)
    base = f"http://127.0.0.1:{port}"
    rows: list[dict[str, Any]] = []
    pool = PeerPool(base, npz, peer_processes, results_only, pre_encoded)
    report: dict[str, Any] = {"max_sessions": max_sessions, "window_s": window_s, "cameras": cameras, "rows": rows,
                              "workers": workers, "peer_processes": peer_processes, "pre_encoded": pre_encoded}

    def cpu() -> tuple[float, float]:
        return group_cpu_s(server.pid), pool.cpu_s()  # the control process and its workers: one process group

    def cpu_pct(c0: tuple[float, float], t0: float) -> dict[str, float]:
        (s1, p1), dt = cpu(), time.monotonic() - t0
        return {"server_cpu_pct": 100 * (s1 - c0[0]) / dt, "peers_cpu_pct": 100 * (p1 - c0[1]) / dt}

    try:
        async with aiohttp.ClientSession() as http:
            await wait_healthy(http, base)
            await pool.start()
            if cameras:  # the cameras alone first
                for _ in range(100):
                    if all(v > 0 for v in (await _camera_fps(http, base)).values()):
                        break
                    await asyncio.sleep(0.2)
                f0, c0, t0 = await _camera_fps(http, base), cpu(), time.monotonic()
                await asyncio.sleep(window_s)
                rows.append({"sessions": 0, "fps_min": None, "fps_median": None, "latency_p50_ms": None,
                             "latency_p95_ms": None, "miss_rate": None, **await _cams(http, base, f0, t0),
                             **cpu_pct(c0, t0)})
                print(_fmt_row(rows[-1]), flush=True)
            for n in range(1, max_sessions + 1):
                status, reason = await pool.join()
                if status != 200:
                    raise RuntimeError(f"session {n} of {max_sessions} was refused ({status}: {reason})")
                await asyncio.sleep(3.0)  # the new peer's encoder ramps up
                f0, c0, t0 = await _camera_fps(http, base), cpu(), time.monotonic()
                await asyncio.sleep(window_s)
                t1 = time.monotonic()
                row = {"sessions": n, **await pool.window(t0, t1), **await _cams(http, base, f0, t0),
                       **cpu_pct(c0, t0)}
                rows.append(row)
                print(_fmt_row(row), flush=True)
            status, reason = await pool.join()
            report["one_more"] = {"status": status, "reason": reason}
            print(f"session {max_sessions + 1}: HTTP {status} ({reason})", flush=True)
            t0 = time.monotonic()
            await asyncio.sleep(window_s)
            report["after_refusal"] = await pool.window(t0, time.monotonic())
            print("after the refusal: " + _fmt_row({"sessions": max_sessions, **report["after_refusal"],
                                                    "server_cpu_pct": float("nan")}), flush=True)
    finally:
        await pool.stop()
        server.terminate()
        try:
            server.wait(15)
        except subprocess.TimeoutExpired:
            os.killpg(server.pid, 9)  # the control process and its workers
        server_log.close()
        for c in rtsp:
            c.stop()
    (out / "report.json").write_text(json.dumps(report, indent=1))
    _plot(rows, out / "sessions.png")
    return report


async def _cams(http: aiohttp.ClientSession, base: str, f0: dict[str, int], t0: float) -> dict[str, Any]:
    f1, dt = await _camera_fps(http, base), time.monotonic() - t0
    rates = [(f1[k] - f0.get(k, 0)) / dt for k in f1]
    return {"camera_fps_min": min(rates) if rates else None}


def _fmt_row(r: dict[str, Any]) -> str:
    def f(v: float | None, d: int = 1) -> str:
        return "–" if v is None else f"{v:.{d}f}"

    return (f"| {r['sessions']} | {f(r['fps_min'])} / {f(r['fps_median'])} | {f(r['latency_p50_ms'])} / "
            f"{f(r['latency_p95_ms'])} | {f(None if r['miss_rate'] is None else 100 * r['miss_rate'])} | "
            f"{f(r.get('camera_fps_min'))} | {f(r['server_cpu_pct'], 0)} | {f(r.get('peers_cpu_pct'), 0)} |")


def _plot(rows: list[dict[str, Any]], path: Path) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    rows = [r for r in rows if r["fps_min"] is not None]
    n = [r["sessions"] for r in rows]
    fig, ax = plt.subplots(1, 2, figsize=(10, 3.6))
    ax[0].plot(n, [r["fps_min"] for r in rows], "o-", label="slowest session")
    ax[0].plot(n, [r["fps_median"] for r in rows], "s--", label="median session")
    ax[0].axhline(30, color="#9ca3af", lw=0.8)
    ax[0].set_xlabel("concurrent sessions")
    ax[0].set_ylabel("results per second per session")
    ax[0].legend(fontsize=8)
    ax[1].plot(n, [r["latency_p50_ms"] for r in rows], "o-", label="p50")
    ax[1].plot(n, [r["latency_p95_ms"] for r in rows], "s--", label="p95")
    ax[1].set_xlabel("concurrent sessions")
    ax[1].set_ylabel("server latency, ms")
    ax[1].legend(fontsize=8)
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)


def bench_sessions(model: Path, max_sessions: int, window_s: float, npz: Path | None, out: Path,
                   cameras: int = 0, results_only: bool = False, workers: int = 1, peer_processes: int = 1,
                   pre_encoded: bool = False) -> dict[str, Any]:
    print("| sessions | results/s per session (slowest / median) | server latency p50 / p95 ms | misses % "
          "| frames/s analysed per camera (slowest) | server CPU % | peers CPU % |\n|---|---|---|---|---|---|---|",
          flush=True)
    return asyncio.run(_run(model, max_sessions, window_s, npz, out, cameras, results_only, workers,
                            peer_processes, pre_encoded))


def full_rate(rows: list[dict[str, Any]]) -> int:
    """The most sessions at which every session got every frame's result (29.5/s or more), on time (< 1 % late)."""
    ok = [r["sessions"] for r in rows if r["fps_min"] is not None and r["fps_min"] >= 29.5
          and (r["miss_rate"] or 0.0) < 0.01]
    best = 0
    for n in sorted(ok):  # the counts from 1 up, without a gap
        if n != best + 1:
            break
        best = n
    return best


def bench_compare(model: Path, max_video: int, max_results: int, window_s: float, npz: Path | None, out: Path
                  ) -> str:
    """Annotated video back, then results only, in one run: sessions at full rate and server CPU per session."""
    video = bench_sessions(model, max_video, window_s, npz, out / "video")
    results = bench_sessions(model, max_results, window_s, npz, out / "results-only", results_only=True)
    nv, nr = full_rate(video["rows"]), full_rate(results["rows"])

    def per_session(rows: list[dict[str, Any]], n: int) -> float:
        return float(next(r["server_cpu_pct"] for r in rows if r["sessions"] == n) / n)

    lines = [f"sessions at full rate and on time: annotated video back {nv}, results only {nr}"
             + (f" ({nr / nv:.2f}x)" if nv else "")]
    if nv and nr:
        n = min(nv, nr)
        v1, r1 = per_session(video["rows"], 1), per_session(results["rows"], 1)
        vn, rn = per_session(video["rows"], n), per_session(results["rows"], n)
        lines.append(f"server CPU per session: 1 session {r1:.1f} vs {v1:.1f} % of a core ({r1 / v1:.2f}x); "
                     f"{n} sessions {rn:.1f} vs {vn:.1f} % ({rn / vn:.2f}x)")
    return "\n".join(lines)
