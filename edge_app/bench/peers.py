"""Browser-like aiortc peers for ``bench-sessions``, in processes of their own.

Each peer sends a labelled 640x480 video at 30 fps and gets per-frame results on the data channel (and the
annotated video back unless ``results_only``). The peers live in ``--peer-processes`` child processes
(``python -m edge_app.bench.peers``), driven over their stdin and stdout one JSON line at a time, so that no single
peer event loop is what limits a benchmark of the server. With ``pre_encoded`` a peer sends the clip encoded once
to VP8 (``streams.encoders.PacketEncoder``, as aiortc encodes), looped, instead of encoding every frame: a browser
encodes in hardware or on another machine, and on a small box the peers' own encoders would otherwise share the
cores with the server being measured.

Timestamps are ``time.monotonic()``, one clock for every process on the host, so the parent asks each child for
the results that arrived in a window it names.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import json
import sys
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import aiohttp
import av
import numpy as np
from aiortc import RTCPeerConnection, RTCRtpSender, RTCSessionDescription
from aiortc.mediastreams import MediaStreamError, VideoStreamTrack

from edge_app.bench.peer import results_channel
from edge_app.bench.testvideo import LabelledVideo, LabelledVideoTrack
from edge_app.bench.triton import group_cpu_s

REPO = Path(__file__).resolve().parents[2]


def peer_video(npz: Path | None) -> LabelledVideo:
    """40 labelled demo frames (3 video frames each) from ``npz``, or random frames when it is absent."""
    if npz is not None and npz.exists():
        with np.load(npz) as z:
            return LabelledVideo(z["images"][:40], z["labels"][:40], hold=3)
    rng = np.random.default_rng(0)
    return LabelledVideo(rng.integers(0, 256, (40, 96, 96, 3), dtype=np.uint8), np.zeros(40, int), hold=3)


def encode_once(video: LabelledVideo) -> list[bytes]:
    """Every frame of ``video`` as VP8, the first a keyframe, so the packets loop."""
    from streams.encoders import PacketEncoder

    enc, out = PacketEncoder("video/vp8"), []
    for i in range(video.num_frames):
        frame = av.VideoFrame.from_ndarray(video.frame(i), format="rgb24")
        frame.pts = i * 3000
        got = enc.encode(frame, keyframe=i == 0)
        if got is None:
            raise RuntimeError("the VP8 encoder held a frame back (lag-in-frames is 0)")
        out.append(bytes(got[0]))
    return out


class PreEncodedTrack(VideoStreamTrack):
    """Yields the packets of ``encode_once`` in a loop at 30 fps: the sender only packetises them."""

    def __init__(self, packets: list[bytes]) -> None:
        super().__init__()
        self.packets = packets
        self.i = 0

    async def recv(self) -> av.Packet[Any]:  # type: ignore[override]
        pts, time_base = await self.next_timestamp()
        packet = av.Packet(self.packets[self.i % len(self.packets)])
        packet.pts, packet.time_base = pts, time_base
        self.i += 1
        return packet


@dataclass
class Peer:
    pc: RTCPeerConnection
    results: list[tuple[float, dict[str, Any]]] = field(default_factory=list)
    tasks: list[asyncio.Task[None]] = field(default_factory=list)


async def join(base: str, video: LabelledVideo, http: aiohttp.ClientSession, results_only: bool = False,
               packets: list[bytes] | None = None) -> tuple[Peer | None, int, str]:
    """One peer's offer to ``base``/offer: the peer, or None with the HTTP status and the server's reason."""
    pc = RTCPeerConnection()
    peer = Peer(pc)
    # results only: the page's default (sendonly: nothing rendered or encoded for it); else annotated video back
    direction = "sendonly" if results_only else "sendrecv"
    if packets is not None:
        transceiver = pc.addTransceiver(PreEncodedTrack(packets), direction=direction)
        transceiver.setCodecPreferences([c for c in RTCRtpSender.getCapabilities("video").codecs
                                         if c.mimeType == "video/VP8"])
        results_channel(pc, lambda msg: peer.results.append((time.monotonic(), msg)))
    else:
        track = LabelledVideoTrack(video)
        pc.addTransceiver(track, direction=direction)
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


async def close(peers: list[Peer]) -> None:
    for p in peers:
        for t in p.tasks:
            t.cancel()
        await p.pc.close()


def in_window(peers: list[Peer], t0: float, t1: float) -> list[dict[str, Any]]:
    """Per peer: the results that arrived in [t0, t1), their server latencies and how many missed the deadline."""
    out = []
    for p in peers:
        rs = [m for t, m in p.results if t0 <= t < t1]
        out.append({"n": len(rs), "latency_ms": [m["latency_ms"] for m in rs],
                    "missed": sum(not m["deadline_met"] for m in rs)})
    return out


def summary(per_peer: list[dict[str, Any]], t0: float, t1: float) -> dict[str, Any]:
    per_fps = [p["n"] / (t1 - t0) for p in per_peer]
    lat = [v for p in per_peer for v in p["latency_ms"]]
    n, missed = sum(p["n"] for p in per_peer), sum(p["missed"] for p in per_peer)
    return {"fps_min": min(per_fps), "fps_median": float(np.median(per_fps)),
            "latency_p50_ms": float(np.percentile(lat, 50)) if lat else None,
            "latency_p95_ms": float(np.percentile(lat, 95)) if lat else None,
            "miss_rate": missed / n if n else None}


class PeerPool:
    """``processes`` child processes of peers; ``join`` places each new peer on the child with the fewest."""

    def __init__(self, base: str, npz: Path | None, processes: int, results_only: bool, pre_encoded: bool) -> None:
        self.args = ["--base", base, *(["--npz", str(npz)] if npz else []),
                     *(["--results-only"] if results_only else []), *(["--pre-encoded"] if pre_encoded else [])]
        self.processes = max(1, processes)
        self.children: list[asyncio.subprocess.Process] = []
        self.counts: list[int] = []

    async def start(self) -> None:
        for _ in range(self.processes):
            self.children.append(await asyncio.create_subprocess_exec(
                sys.executable, "-m", "edge_app.bench.peers", *self.args, cwd=REPO,
                stdin=asyncio.subprocess.PIPE, stdout=asyncio.subprocess.PIPE, start_new_session=True))
            self.counts.append(0)
        for c in self.children:
            await self._read(c)  # {"ready": true} once its clip is encoded

    async def _ask(self, child: asyncio.subprocess.Process, cmd: dict[str, Any]) -> dict[str, Any]:
        assert child.stdin is not None
        child.stdin.write((json.dumps(cmd) + "\n").encode())
        await child.stdin.drain()
        return await self._read(child)

    @staticmethod
    async def _read(child: asyncio.subprocess.Process) -> dict[str, Any]:
        assert child.stdout is not None
        line = await child.stdout.readline()
        if not line:
            raise RuntimeError(f"a peer process (pid {child.pid}) exited: {await child.wait()}")
        return dict(json.loads(line))

    async def join(self) -> tuple[int, str]:
        i = self.counts.index(min(self.counts))
        got = await self._ask(self.children[i], {"op": "join"})
        if got["status"] == 200:
            self.counts[i] += 1
        return int(got["status"]), str(got["reason"])

    async def window(self, t0: float, t1: float) -> dict[str, Any]:
        per_peer: list[dict[str, Any]] = []
        for c in self.children:
            per_peer += (await self._ask(c, {"op": "window", "t0": t0, "t1": t1}))["peers"]
        return summary(per_peer, t0, t1)

    def cpu_s(self) -> float:
        return sum(group_cpu_s(c.pid) for c in self.children)

    async def stop(self) -> None:
        for c in self.children:
            with contextlib.suppress(Exception):
                await asyncio.wait_for(self._ask(c, {"op": "quit"}), 15)
            if c.returncode is None:
                c.kill()
            await c.wait()


async def _child(args: argparse.Namespace) -> None:
    video = peer_video(args.npz)
    packets = encode_once(video) if args.pre_encoded else None
    loop = asyncio.get_running_loop()
    reader = asyncio.StreamReader()
    await loop.connect_read_pipe(lambda: asyncio.StreamReaderProtocol(reader), sys.stdin)

    def say(obj: dict[str, Any]) -> None:
        sys.stdout.write(json.dumps(obj) + "\n")
        sys.stdout.flush()

    peers: list[Peer] = []
    say({"ready": True})
    async with aiohttp.ClientSession() as http:
        try:
            while line := await reader.readline():
                cmd = json.loads(line)
                if cmd["op"] == "join":
                    peer, status, reason = await join(args.base, video, http, args.results_only, packets)
                    if peer is not None:
                        peers.append(peer)
                    say({"status": status, "reason": reason})
                elif cmd["op"] == "window":
                    say({"peers": in_window(peers, cmd["t0"], cmd["t1"])})
                else:
                    say({"bye": True})
                    break
        finally:
            await close(peers)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__)
    ap.add_argument("--base", required=True)
    ap.add_argument("--npz", type=Path)
    ap.add_argument("--results-only", action="store_true")
    ap.add_argument("--pre-encoded", action="store_true")
    asyncio.run(_child(ap.parse_args()))


if __name__ == "__main__":
    main()
