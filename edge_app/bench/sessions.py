"""``edge-app bench-sessions``: how many browser sessions this box serves at once, and what happens beyond.

A real ``edge-app serve`` process with ``[server] max_sessions = N``; aiortc peers in this process, each
sending a labelled 640x480 video at 30 fps and receiving the annotated video and per-frame results,
are added one at a time.  For each count the results of every session are collected for a window:
results per second per session (30 = every frame analysed), the server-side latency p50/p95
(frame arrival to annotated frame ready), deadline misses and the server process's CPU use.  Then
one more peer than ``max_sessions`` asks to join: it must get 503, and the running sessions are
measured once more.  The peers' own VP8 encode and decode run on the same cores, so on a small box
the limit found is lower than it would be with the browsers elsewhere.  ``--cameras K`` adds K RTSP
cameras (GStreamer test servers on loopback, 640x480 H.264 at 30 fps), analysed all the while.
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
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import aiohttp
import numpy as np
from aiortc import RTCPeerConnection, RTCSessionDescription
from aiortc.mediastreams import MediaStreamError

from edge_app.bench.peer import results_channel
from edge_app.bench.rtsp_camera import RtspServer, free_port, gst_rtsp_available
from edge_app.bench.testvideo import LabelledVideo, LabelledVideoTrack, write_jpegs

log = logging.getLogger(__name__)
REPO = Path(__file__).resolve().parents[2]


@dataclass
class Peer:
    pc: RTCPeerConnection
    results: list[tuple[float, dict[str, Any]]] = field(default_factory=list)
    tasks: list[asyncio.Task[None]] = field(default_factory=list)


def _cpu_s(pid: int) -> float:
    """CPU seconds of the server: every process in its process group (the control process and its workers)."""
    from edge_app.bench.triton import group_cpu_s

    return group_cpu_s(pid)


def peer_video(npz: Path | None) -> LabelledVideo:
    """40 labelled demo frames (3 video frames each) from ``npz``, or random frames when it is absent."""
    if npz is not None and npz.exists():
        with np.load(npz) as z:
            return LabelledVideo(z["images"][:40], z["labels"][:40], hold=3)
    rng = np.random.default_rng(0)
    return LabelledVideo(rng.integers(0, 256, (40, 96, 96, 3), dtype=np.uint8), np.zeros(40, int), hold=3)


async def wait_healthy(http: aiohttp.ClientSession, base: str, timeout_s: float = 30.0) -> None:
    """Until the server at ``base`` answers /healthz (a server process just started)."""
    for _ in range(int(timeout_s * 10)):
        with contextlib.suppress(aiohttp.ClientError):
            async with http.get(f"{base}/healthz") as r:
                if r.status == 200:
                    return
        await asyncio.sleep(0.1)


async def _join(base: str, video: LabelledVideo, http: aiohttp.ClientSession, results_only: bool = False
                ) -> tuple[Peer | None, int, str]:
    pc = RTCPeerConnection()
    peer = Peer(pc)
    # results only: the page's default (sendonly: nothing rendered or encoded for it); else annotated video back
    track = LabelledVideoTrack(video)
    pc.addTransceiver(track, direction="sendonly" if results_only else "sendrecv")
    results_channel(pc, lambda msg: peer.results.append((time.monotonic(), msg)),
                    lambda msg: setattr(track, "scale_down", float(msg["scale_down"])))  # as the page does

    @pc.on("track")
    def on_track(track: Any) -> None:
        async def pull() -> None:
            with contextlib.suppress(MediaStreamError):
                while True:
                    await track.recv()

        peer.tasks.append(asyncio.create_task(pull()))

    await pc.setLocalDescription(await pc.createOffer())
    body = {"sdp": pc.localDescription.sdp, "type": "offer"}
    async with http.post(f"{base}/offer", json=body) as r:
        answer = await r.json()
        if r.status != 200:
            await pc.close()
            return None, r.status, str(answer.get("error"))
    await pc.setRemoteDescription(RTCSessionDescription(answer["sdp"], answer["type"]))
    return peer, 200, ""


def _window(peers: list[Peer], t0: float, t1: float) -> dict[str, Any]:
    per_fps, lat, missed, n = [], [], 0, 0
    for p in peers:
        rs = [m for t, m in p.results if t0 <= t < t1]
        per_fps.append(len(rs) / (t1 - t0))
        lat += [m["latency_ms"] for m in rs]
        missed += sum(not m["deadline_met"] for m in rs)
        n += len(rs)
    return {"fps_min": min(per_fps), "fps_median": float(np.median(per_fps)),
            "latency_p50_ms": float(np.percentile(lat, 50)) if lat else None,
            "latency_p95_ms": float(np.percentile(lat, 95)) if lat else None,
            "miss_rate": missed / n if n else None}


async def _camera_fps(http: aiohttp.ClientSession, base: str) -> dict[str, int]:
    async with http.get(f"{base}/status") as r:
        return {c["name"]: c["frames_analysed"] for c in (await r.json())["cameras"]}


async def _run(model: Path, max_sessions: int, window_s: float, npz: Path | None, out: Path,
               cameras: int = 0, results_only: bool = False, workers: int = 1) -> dict[str, Any]:
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
    peers: list[Peer] = []
    report: dict[str, Any] = {"max_sessions": max_sessions, "window_s": window_s, "cameras": cameras, "rows": rows,
                              "workers": workers}
    try:
        async with aiohttp.ClientSession() as http:
            await wait_healthy(http, base)
            if cameras:  # the cameras alone first
                for _ in range(100):
                    if all(v > 0 for v in (await _camera_fps(http, base)).values()):
                        break
                    await asyncio.sleep(0.2)
                f0, c0, t0 = await _camera_fps(http, base), _cpu_s(server.pid), time.monotonic()
                await asyncio.sleep(window_s)
                rows.append({"sessions": 0, "fps_min": None, "fps_median": None, "latency_p50_ms": None,
                             "latency_p95_ms": None, "miss_rate": None, **await _cams(http, base, f0, t0),
                             "server_cpu_pct": 100 * (_cpu_s(server.pid) - c0) / (time.monotonic() - t0)})
                print(_fmt_row(rows[-1]), flush=True)
            for n in range(1, max_sessions + 1):
                peer, status, reason = await _join(base, video, http, results_only)
                if peer is None:
                    raise RuntimeError(f"session {n} of {max_sessions} was refused ({status}: {reason})")
                peers.append(peer)
                await asyncio.sleep(3.0)  # the new peer's encoder ramps up
                f0, c0, t0 = await _camera_fps(http, base), _cpu_s(server.pid), time.monotonic()
                await asyncio.sleep(window_s)
                row = {"sessions": n, **_window(peers, t0, time.monotonic()), **await _cams(http, base, f0, t0),
                       "server_cpu_pct": 100 * (_cpu_s(server.pid) - c0) / (time.monotonic() - t0)}
                rows.append(row)
                print(_fmt_row(row), flush=True)
            _, status, reason = await _join(base, video, http, results_only)
            report["one_more"] = {"status": status, "reason": reason}
            print(f"session {max_sessions + 1}: HTTP {status} ({reason})", flush=True)
            t0 = time.monotonic()
            await asyncio.sleep(window_s)
            report["after_refusal"] = _window(peers, t0, time.monotonic())
            print("after the refusal: " + _fmt_row({"sessions": max_sessions, **report["after_refusal"],
                                                    "server_cpu_pct": float("nan")}), flush=True)
    finally:
        for p in peers:
            for t in p.tasks:
                t.cancel()
            await p.pc.close()
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
            f"{f(r.get('camera_fps_min'))} | {f(r['server_cpu_pct'], 0)} |")


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
                   cameras: int = 0, results_only: bool = False, workers: int = 1) -> dict[str, Any]:
    print("| sessions | results/s per session (slowest / median) | server latency p50 / p95 ms | misses % "
          "| frames/s analysed per camera (slowest) | server CPU % |\n|---|---|---|---|---|---|", flush=True)
    return asyncio.run(_run(model, max_sessions, window_s, npz, out, cameras, results_only, workers))


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
