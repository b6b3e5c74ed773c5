"""``edge-app bench-viewers``: the server CPU of one camera watched by 1 and by N video viewers, with the
camera's annotated video encoded once for all of them (``[server] share_camera_encoder``, the default) and
with one encoder per viewer, in one run.

A real ``edge-app serve`` process analyses one RTSP camera (GStreamer's test server on loopback, 640x480 H.264 at
30 fps). aiortc peers in this process watch it (annotated video back and the results); the server process's CPU
is read from /proc over each window. The peers' VP8 decode runs on the same cores.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

import aiohttp
from aiortc import RTCPeerConnection, RTCSessionDescription
from aiortc.mediastreams import MediaStreamError

from edge_app.bench.rtsp_camera import RtspServer, free_port, gst_rtsp_available
from edge_app.bench.sessions import _cpu_s, peer_video, wait_healthy
from edge_app.bench.testvideo import write_jpegs

REPO = Path(__file__).resolve().parents[2]


class Viewer:
    """An aiortc peer watching a camera: video back (frames decoded and counted) and the results. ``picture``:
    "annotated" (the analysis drawn in) or "camera" (its own picture, forwarded where it can be; the server says
    which in a ``video`` message, kept in ``pictures``)."""

    def __init__(self, picture: str = "annotated") -> None:
        self.pc = RTCPeerConnection()
        self.pc.addTransceiver("video", direction="recvonly")
        self.picture = picture
        self.pictures: list[str] = []
        self.frames = 0
        self.sizes: set[tuple[int, int]] = set()
        self.results = 0
        self._tasks: set[asyncio.Future[None]] = set()
        channel = self.pc.createDataChannel("results", ordered=False, maxRetransmits=0)

        @channel.on("message")
        def on_message(message: str) -> None:
            msg = json.loads(message)
            if msg["type"] == "ping":
                channel.send(json.dumps({"type": "pong", "id": msg["id"]}))
            self.results += msg["type"] == "result"
            if msg["type"] == "video":
                self.pictures.append(msg["picture"])

        @self.pc.on("track")
        def on_track(track: Any) -> None:
            async def pull() -> None:
                with contextlib.suppress(MediaStreamError):
                    while True:
                        frame = await track.recv()
                        self.frames += 1
                        self.sizes.add((frame.width, frame.height))
            self._tasks.add(asyncio.ensure_future(pull()))

    async def join(self, http: aiohttp.ClientSession, base: str, camera: str = "cam") -> None:
        await self.pc.setLocalDescription(await self.pc.createOffer())
        body = {"sdp": self.pc.localDescription.sdp, "type": "offer", "camera": camera, "video": self.picture}
        async with http.post(f"{base}/offer", json=body) as r:
            answer = await r.json()
            if r.status != 200:
                raise RuntimeError(f"offer refused: {answer}")
        await self.pc.setRemoteDescription(RTCSessionDescription(answer["sdp"], answer["type"]))


async def _measure(shared: bool, viewers: int, window_s: float, camera_url: str, model: Path, out: Path
                   ) -> dict[str, Any]:
    port = free_port()
    cfg = out / f"config-{'shared' if shared else 'own'}-{viewers}.toml"
    cfg.write_text(f'[server]\nport = {port}\nmax_sessions = 16\nice_host_addresses = ["127.0.0.1"]\n'
                   f'share_camera_encoder = {"true" if shared else "false"}\n\n[model]\npath = "{model}"\n\n'
                   f'[[cameras]]\nname = "cam"\nurl = "{camera_url}"\n')
    log = (out / f"server-{'shared' if shared else 'own'}-{viewers}.log").open("wb")
    server = subprocess.Popen([sys.executable, "-m", "edge_app", "serve", "--config", str(cfg)], cwd=REPO,
                              stdout=log, stderr=subprocess.STDOUT)
    base = f"http://127.0.0.1:{port}"
    peers = [Viewer() for _ in range(viewers)]
    try:
        async with aiohttp.ClientSession() as http:
            await wait_healthy(http, base)
            for p in peers:
                await p.join(http, base)
            await asyncio.sleep(4.0)  # connect, the first keyframes, the encoders' rate settling
            f0, c0, t0 = [p.frames for p in peers], _cpu_s(server.pid), time.monotonic()
            async with http.get(f"{base}/status") as r:
                a0 = next(c for c in (await r.json())["cameras"])["frames_analysed"]
            await asyncio.sleep(window_s)
            wall = time.monotonic() - t0
            cpu = 100 * (_cpu_s(server.pid) - c0) / wall
            async with http.get(f"{base}/status") as r:
                cam = next(c for c in (await r.json())["cameras"])
        fps = [(p.frames - f) / wall for p, f in zip(peers, f0, strict=True)]
        return {"shared": shared, "viewers": viewers, "server_cpu_pct": cpu, "viewer_fps_min": min(fps),
                "analysed_fps": (cam["frames_analysed"] - a0) / wall, "encoders": cam["encoders"]}
    finally:
        for p in peers:
            await p.pc.close()
        server.terminate()
        with contextlib.suppress(subprocess.TimeoutExpired):
            server.wait(10)
        log.close()


async def bench(model: Path, viewers: int, window_s: float, npz: Path | None, out: Path) -> str:
    if not gst_rtsp_available():
        raise SystemExit("needs GStreamer's RTSP server for the system Python (see README, set-up)")
    out.mkdir(parents=True, exist_ok=True)
    camera = RtspServer(write_jpegs(out / "camera-frames", peer_video(npz)), free_port(), size="640x480")
    camera.start()
    rows = []
    try:
        for shared in (True, False):
            for n in (1, viewers):
                rows.append(await _measure(shared, n, window_s, camera.url, model, out))
    finally:
        camera.stop()
    lines = [f"one RTSP camera (640x480 H.264, 30 fps), {window_s:g} s windows; server CPU in % of one core", "",
             "| encoding | viewers | server CPU % | vs 1 viewer | frames analysed/s | slowest viewer fps | encoders |",
             "|---|---|---|---|---|---|---|"]
    for shared in (True, False):
        mine = [r for r in rows if r["shared"] == shared]
        for r in mine:
            enc = ", ".join(f"{e['codec']} x{e['viewers']}" for e in r["encoders"]) or "one per viewer"
            lines.append(f"| {'once for all viewers' if shared else 'once per viewer'} | {r['viewers']} | "
                         f"{r['server_cpu_pct']:.0f} | {r['server_cpu_pct'] / mine[0]['server_cpu_pct']:.2f}× | "
                         f"{r['analysed_fps']:.1f} | {r['viewer_fps_min']:.1f} | {enc} |")
    return "\n".join(lines)
