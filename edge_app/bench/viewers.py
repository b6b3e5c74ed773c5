"""``edge-app bench-viewers``: the server CPU of one camera watched by 1 and by N video viewers, in one run, three
ways: the camera's own H.264 forwarded with no transcode (viewers that draw the analysis themselves, as the page
does), its annotated video encoded once for all viewers (``[server] share_camera_encoder``, the default), and one
encoder per viewer.

A real ``edge-app serve`` process analyses one RTSP camera (GStreamer's test server on loopback, 640x480 H.264 at
30 fps). aiortc peers in this process watch it (video back and the results); the server process's CPU is read from
/proc over each window. The peers' decode runs on the same cores.
"""

from __future__ import annotations

import asyncio
import contextlib
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

import aiohttp
from aiortc import RTCPeerConnection, RTCSessionDescription
from aiortc.mediastreams import MediaStreamError

from edge_app import protocol
from edge_app.bench.peers import peer_video
from edge_app.bench.rtsp_camera import RtspServer, free_port, gst_rtsp_available
from edge_app.bench.sessions import wait_healthy
from edge_app.bench.testvideo import write_jpegs
from edge_app.bench.triton import group_cpu_s

REPO = Path(__file__).resolve().parents[2]


class Viewer:
    """An aiortc peer watching a camera: video back (frames decoded and counted) and the results. ``picture``:
    "annotated" (the analysis drawn in) or "camera" (its own picture, forwarded where it can be; the server says
    which in a ``video`` message, kept in ``pictures``). ``keep_results``: every result message is kept in
    ``messages`` with its arrival time (``received_s``, monotonic)."""

    def __init__(self, picture: str = "annotated", keep_results: bool = False) -> None:
        self.pc = RTCPeerConnection()
        self.pc.addTransceiver("video", direction="recvonly")
        self.picture = picture
        self.pictures: list[str] = []
        self.frames = 0
        self.sizes: set[tuple[int, int]] = set()
        self.results = 0
        self.messages: list[dict[str, Any]] = []
        self._tasks: set[asyncio.Future[None]] = set()
        channel = self.pc.createDataChannel("results", ordered=False, maxRetransmits=0)

        @channel.on("message")
        def on_message(message: str) -> None:
            msg = protocol.parse(message)
            if isinstance(msg, protocol.Ping):
                channel.send(protocol.Pong(msg.id).encode())
            elif isinstance(msg, protocol.Result):
                self.results += 1
                if keep_results:
                    self.messages.append({**msg.data, "received_s": time.monotonic()})
            elif isinstance(msg, protocol.Video):
                self.pictures.append(msg.picture)

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


MODES = {"passthrough": "camera's own H.264, no transcode", "shared": "annotated, encoded once for all viewers",
         "own": "annotated, encoded once per viewer"}


async def first_camera(http: aiohttp.ClientSession, base: str) -> dict[str, Any]:
    async with http.get(f"{base}/status") as r:
        return dict(next(c for c in (await r.json())["cameras"]))


async def _measure(mode: str, viewers: int, window_s: float, camera_url: str, model: Path, out: Path
                   ) -> dict[str, Any]:
    port = free_port()
    cfg = out / f"config-{mode}-{viewers}.toml"
    cfg.write_text(f'[server]\nport = {port}\nmax_sessions = 16\nice_host_addresses = ["127.0.0.1"]\n'
                   f'share_camera_encoder = {"false" if mode == "own" else "true"}\n\n[model]\npath = "{model}"\n\n'
                   f'[[cameras]]\nname = "cam"\nurl = "{camera_url}"\n')
    log = (out / f"server-{mode}-{viewers}.log").open("wb")
    server = subprocess.Popen([sys.executable, "-m", "edge_app", "serve", "--config", str(cfg)], cwd=REPO,
                              stdout=log, stderr=subprocess.STDOUT)
    base = f"http://127.0.0.1:{port}"
    peers = [Viewer("camera" if mode == "passthrough" else "annotated") for _ in range(viewers)]
    try:
        async with aiohttp.ClientSession() as http:
            await wait_healthy(http, base)
            t_end = time.monotonic() + 30
            while mode == "passthrough" and not (await first_camera(http, base))["passthrough"]["possible"]:
                if time.monotonic() > t_end:
                    raise RuntimeError(f"the camera's H.264 cannot be forwarded: {await first_camera(http, base)}")
                await asyncio.sleep(0.2)
            for p in peers:
                await p.join(http, base)
            await asyncio.sleep(4.0)  # connect, the first keyframes, the encoders' rate settling
            f0, c0, t0 = [p.frames for p in peers], group_cpu_s(server.pid), time.monotonic()
            a0 = (await first_camera(http, base))["frames_analysed"]
            await asyncio.sleep(window_s)
            wall = time.monotonic() - t0
            cpu = 100 * (group_cpu_s(server.pid) - c0) / wall
            cam = await first_camera(http, base)
        fps = [(p.frames - f) / wall for p, f in zip(peers, f0, strict=True)]
        pictures = {p.pictures[-1] if p.pictures else "?" for p in peers}
        return {"mode": mode, "viewers": viewers, "server_cpu_pct": cpu, "viewer_fps_min": min(fps),
                "analysed_fps": (cam["frames_analysed"] - a0) / wall, "encoders": cam["encoders"],
                "passthrough_viewers": cam["passthrough"]["viewers"], "pictures": pictures}
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
        for mode in MODES:
            for n in (1, viewers):
                rows.append(await _measure(mode, n, window_s, camera.url, model, out))
    finally:
        camera.stop()
    lines = [f"one RTSP camera (640x480 H.264, 30 fps), {window_s:g} s windows; server CPU in % of one core", "",
             "| video | viewers | server CPU % | vs 1 viewer | frames analysed/s | slowest viewer fps | sent as |",
             "|---|---|---|---|---|---|---|"]
    for mode, words in MODES.items():
        mine = [r for r in rows if r["mode"] == mode]
        for r in mine:
            sent = ", ".join([*(f"forwarded x{r['passthrough_viewers']}" for _ in [1] if r["passthrough_viewers"]),
                              *(f"{e['codec']} encoder x{e['viewers']}" for e in r["encoders"])]) or "one per viewer"
            lines.append(f"| {words} | {r['viewers']} | {r['server_cpu_pct']:.0f} | "
                         f"{r['server_cpu_pct'] / mine[0]['server_cpu_pct']:.2f}× | {r['analysed_fps']:.1f} | "
                         f"{r['viewer_fps_min']:.1f} | {sent} |")
    return "\n".join(lines)
