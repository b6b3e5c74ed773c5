"""``edge-app bench-soak``: offers that never connect, against a real ``edge-app serve`` process.

Sends ``offers`` offers spread evenly over ``seconds`` from peers that are gone before the answer comes (a tab
closed mid-connect: their candidates point at closed loopback ports, and, as Chromium and Firefox do, they send no
``a=end-of-candidates``), with ``max_sessions`` slots and no offer rate limit in the way.  While it runs it samples
the server's threads, open file descriptors and RSS from ``/proc``; at the end it waits for every session to be
closed, then connects a real aiortc peer and counts the results it gets.

Prints one table and writes ``report.json``; exits non-zero if a session is left, a resource grew past the noise
bounds, or the real client got no results.
"""

from __future__ import annotations

import asyncio
import json
import os
import subprocess
import sys
import time
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

import aiohttp
from aiortc import RTCPeerConnection, RTCSessionDescription, VideoStreamTrack

from edge_app import protocol
from streams.rtc_settings import restrict_host_addresses

MAX_THREAD_GROWTH = 8  # the default executor and aioice's resolver may start a few threads on first use
MAX_FD_GROWTH = 8
MAX_RSS_GROWTH_MB = 40.0


@dataclass
class Sample:
    t_s: float
    sessions: int
    threads: int
    fds: int
    rss_mb: float


@dataclass
class SoakReport:
    offers: int
    seconds: float
    max_sessions: int
    connect_timeout_s: float
    answered: int = 0
    refused_503: int = 0
    other: dict[str, int] = field(default_factory=dict)
    max_sessions_seen: int = 0
    sessions_left: int = -1
    closed_by_reason: dict[str, int] = field(default_factory=dict)
    drain_s: float = 0.0
    start: Sample | None = None
    end: Sample | None = None
    real_client_results: int = 0
    real_client_connect_s: float | None = None
    samples: list[Sample] = field(default_factory=list)

    def problems(self) -> list[str]:
        out = []
        if self.sessions_left != 0:
            out.append(f"{self.sessions_left} session(s) left open")
        if self.max_sessions_seen > self.max_sessions:
            out.append(f"{self.max_sessions_seen} sessions at once with max_sessions = {self.max_sessions}")
        if self.start and self.end:
            if self.end.threads - self.start.threads > MAX_THREAD_GROWTH:
                out.append(f"threads grew {self.start.threads} -> {self.end.threads}")
            if self.end.fds - self.start.fds > MAX_FD_GROWTH:
                out.append(f"file descriptors grew {self.start.fds} -> {self.end.fds}")
            if self.end.rss_mb - self.start.rss_mb > MAX_RSS_GROWTH_MB:
                out.append(f"RSS grew {self.start.rss_mb:.0f} -> {self.end.rss_mb:.0f} MB")
        if self.real_client_results < 10:
            out.append(f"the real client got {self.real_client_results} results afterwards")
        return out

    def table(self) -> str:
        s, e = self.start, self.end
        assert s is not None and e is not None
        rows = [
            ("offers sent", f"{self.offers} over {self.seconds:.0f} s"),
            ("answered / refused 503 / other", f"{self.answered} / {self.refused_503} / {self.other or 0}"),
            ("most sessions at once", f"{self.max_sessions_seen} (max_sessions = {self.max_sessions})"),
            ("sessions closed, by reason", json.dumps(self.closed_by_reason)),
            ("sessions left", f"{self.sessions_left} ({self.drain_s:.1f} s after the last offer)"),
            ("threads start -> end", f"{s.threads} -> {e.threads}"),
            ("open fds start -> end", f"{s.fds} -> {e.fds}"),
            ("RSS start -> end", f"{s.rss_mb:.1f} -> {e.rss_mb:.1f} MB"),
            ("real client afterwards", f"{self.real_client_results} results, connected in "
                                       f"{self.real_client_connect_s or float('nan'):.2f} s"),
        ]
        width = max(len(k) for k, _ in rows)
        return "\n".join(f"{k:<{width}}  {v}" for k, v in rows)


def proc_sample(pid: int, t_s: float, sessions: int) -> Sample:
    status = Path(f"/proc/{pid}/status").read_text()
    fields = dict(line.split(":", 1) for line in status.splitlines() if ":" in line)
    rss_kb = float(fields["VmRSS"].split()[0])
    return Sample(round(t_s, 2), sessions, int(fields["Threads"]), len(os.listdir(f"/proc/{pid}/fd")),
                  round(rss_kb / 1024, 1))


async def dead_offer_sdp() -> str:
    """An offer whose peer is closed before any answer: its loopback candidates lead nowhere."""
    pc = RTCPeerConnection()
    pc.addTransceiver("video", direction="sendrecv")
    pc.createDataChannel("results")
    await pc.setLocalDescription(await pc.createOffer())
    sdp = pc.localDescription.sdp
    await pc.close()
    return "\r\n".join(line for line in sdp.split("\r\n") if line != "a=end-of-candidates")


async def _sessions(http: aiohttp.ClientSession, base: str) -> dict[str, Any]:
    async with http.get(f"{base}/status") as r:
        out: dict[str, Any] = await r.json()
        return out


async def real_client(base: str, timeout_s: float = 20.0) -> tuple[int, float | None]:
    """Connect an aiortc peer that sends video; (results received in a few seconds, seconds to connect)."""
    pc = RTCPeerConnection()
    results: list[dict[str, Any]] = []
    channel = pc.createDataChannel("results", ordered=False, maxRetransmits=0)

    @channel.on("message")
    def on_message(message: str) -> None:
        msg = protocol.parse(message)
        if isinstance(msg, protocol.Ping):
            channel.send(protocol.Pong(msg.id).encode())
        elif isinstance(msg, protocol.Result):
            results.append(msg.data)

    pc.addTrack(VideoStreamTrack())
    t0 = time.monotonic()
    connected: float | None = None
    try:
        await pc.setLocalDescription(await pc.createOffer())
        async with aiohttp.ClientSession() as http, http.post(
                f"{base}/offer", json={"sdp": pc.localDescription.sdp, "type": "offer"}) as r:
            answer = await r.json()
            if r.status != 200:
                return 0, None
        await pc.setRemoteDescription(RTCSessionDescription(answer["sdp"], answer["type"]))
        while time.monotonic() - t0 < timeout_s and len(results) < 60:
            if connected is None and pc.connectionState == "connected":
                connected = time.monotonic() - t0
            await asyncio.sleep(0.05)
    finally:
        await pc.close()
    return len(results), connected


async def soak(base: str, pid: int, offers: int, seconds: float, max_sessions: int, connect_timeout_s: float,
               progress: bool = True) -> SoakReport:
    report = SoakReport(offers, seconds, max_sessions, connect_timeout_s)
    sdp = await dead_offer_sdp()
    t0 = time.monotonic()
    async with aiohttp.ClientSession() as http:
        report.start = proc_sample(pid, 0.0, len((await _sessions(http, base))["sessions"]))
        report.samples.append(report.start)

        async def one(i: int) -> int:
            await asyncio.sleep(max(0.0, t0 + i * seconds / offers - time.monotonic()))
            async with http.post(f"{base}/offer", json={"sdp": sdp, "type": "offer"}) as r:
                await r.read()
                return r.status

        async def watch() -> None:
            next_print = 0.0
            while True:
                now = time.monotonic() - t0
                n = len((await _sessions(http, base))["sessions"])
                report.max_sessions_seen = max(report.max_sessions_seen, n)
                if now >= next_print:
                    sample = proc_sample(pid, now, n)
                    report.samples.append(sample)
                    if progress:
                        print(f"  t={now:5.1f} s  sessions {n}  threads {sample.threads}  fds {sample.fds}  "
                              f"RSS {sample.rss_mb:.1f} MB", flush=True)
                    next_print = now + max(2.0, seconds / 12)
                await asyncio.sleep(0.2)

        watcher = asyncio.create_task(watch())
        codes = await asyncio.gather(*[one(i) for i in range(offers)])
        t_last = time.monotonic()
        while time.monotonic() - t_last < connect_timeout_s + 15:
            if not (await _sessions(http, base))["sessions"]:
                break
            await asyncio.sleep(0.2)
        report.drain_s = time.monotonic() - t_last
        watcher.cancel()
        await asyncio.gather(watcher, return_exceptions=True)
        status = await _sessions(http, base)
        report.sessions_left = len(status["sessions"])
        report.closed_by_reason = status.get("sessions_closed", {})
        await asyncio.sleep(1.0)  # let the closed sessions' sockets and threads go
        report.end = proc_sample(pid, time.monotonic() - t0, report.sessions_left)
        report.samples.append(report.end)
    report.answered = codes.count(200)
    report.refused_503 = codes.count(503)
    for c in codes:
        if c not in (200, 503):
            report.other[str(c)] = report.other.get(str(c), 0) + 1
    report.real_client_results, report.real_client_connect_s = await real_client(base)
    return report


def write_config(folder: Path, model: Path, port: int, max_sessions: int, connect_timeout_s: float) -> Path:
    cfg = folder / "config.toml"
    cfg.write_text(f'[server]\nport = {port}\nmax_sessions = {max_sessions}\nmax_offers_per_minute = 100000\n'
                   f'connect_timeout_s = {connect_timeout_s}\nice_host_addresses = ["127.0.0.1"]\n'
                   f'[model]\npath = "{model}"\n')
    return cfg


def free_port() -> int:
    import socket

    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def bench_soak(model: Path, offers: int, seconds: float, max_sessions: int, connect_timeout_s: float,
               out: Path) -> SoakReport:
    """Start ``edge-app serve`` in a subprocess, soak it, stop it; the report is also written to out/."""
    out.mkdir(parents=True, exist_ok=True)
    port = free_port()
    cfg = write_config(out, model.resolve(), port, max_sessions, connect_timeout_s)
    log_path = out / "server.log"
    with log_path.open("wb") as log:
        server = subprocess.Popen([sys.executable, "-m", "edge_app", "serve", "--config", str(cfg)],
                                  stdout=log, stderr=subprocess.STDOUT)
    try:
        t_end = time.monotonic() + 60
        while "serving on" not in log_path.read_text(errors="replace"):
            if server.poll() is not None or time.monotonic() > t_end:
                raise RuntimeError(f"the server did not start; its log:\n{log_path.read_text()[-3000:]}")
            time.sleep(0.2)
        restrict_host_addresses(["127.0.0.1"])  # this process's own peers stay on loopback too
        report = asyncio.run(soak(f"http://127.0.0.1:{port}", server.pid, offers, seconds, max_sessions,
                                  connect_timeout_s))
    finally:
        restrict_host_addresses(None)
        server.terminate()
        server.wait(30)
    (out / "report.json").write_text(json.dumps(asdict(report), indent=1))
    return report
