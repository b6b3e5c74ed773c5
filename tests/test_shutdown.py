"""``edge-app serve`` as a real process: SIGTERM closes peers within the bounded time; a second exits at once."""

from __future__ import annotations

import asyncio
import os
import signal
import socket
import subprocess
import sys
import time
from pathlib import Path

import aiohttp
import pytest
from aiortc import RTCPeerConnection
from support.live import DEFAULT_MODEL
from test_live_session import VideoFileTrack, collect, connect

from edge_app.bench.rtsp_camera import free_port
from edge_app.bench.testvideo import LabelledVideo

pytestmark = [pytest.mark.slow, pytest.mark.live]
REPO = Path(__file__).resolve().parents[1]


async def _start(tmp_path: Path, shutdown_timeout_s: float = 3.0, extra: str = "") -> tuple[subprocess.Popen[str], str]:
    port = free_port()
    cfg = tmp_path / "config.toml"
    cfg.write_text(f'[server]\nport = {port}\nice_host_addresses = ["127.0.0.1"]\nshutdown_timeout_s = '
                   f'{shutdown_timeout_s}\n\n[model]\npath = "{DEFAULT_MODEL}"\nwarmup_runs = 1\n{extra}')
    proc = subprocess.Popen([sys.executable, "-m", "edge_app", "serve", "--config", str(cfg)], cwd=REPO,
                            stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True,
                            env={**os.environ, "PYTHONUNBUFFERED": "1"})
    base = f"http://127.0.0.1:{port}"
    async with aiohttp.ClientSession() as http:
        for _ in range(200):
            try:
                async with http.get(f"{base}/healthz") as r:
                    if r.status == 200:
                        return proc, base
            except aiohttp.ClientError:
                pass
            if proc.poll() is not None:
                break
            await asyncio.sleep(0.1)
    proc.kill()
    raise AssertionError(f"the server did not start: {proc.communicate()[0][-2000:]}")


async def _session(base: str, images_labels: tuple) -> RTCPeerConnection:  # type: ignore[type-arg]
    images, labels = images_labels
    pc = RTCPeerConnection()
    pc.addTrack(VideoFileTrack(LabelledVideo(images[:20], labels[:20], hold=3)))
    collect(pc, [], [], [])
    await connect(base, pc)
    for _ in range(100):
        async with aiohttp.ClientSession() as http, http.get(f"{base}/status") as r:
            if [s for s in (await r.json())["sessions"] if s["state"] == "connected"]:
                return pc
        await asyncio.sleep(0.1)
    raise AssertionError("the session did not connect")


async def test_sigterm_closes_peers_within_the_bound(tmp_path: Path, demo_test_split: tuple) -> None:  # type: ignore[type-arg]
    proc, base = await _start(tmp_path)
    pc = await _session(base, demo_test_split)
    try:
        t0 = time.monotonic()
        proc.send_signal(signal.SIGTERM)
        out, _ = await asyncio.to_thread(proc.communicate, timeout=20)
        took = time.monotonic() - t0
        for _ in range(50):  # the server closed the peer connection: the client sees it go
            if pc.connectionState in ("closed", "failed"):
                break
            await asyncio.sleep(0.1)
        state = pc.connectionState
    finally:
        await pc.close()
        if proc.poll() is None:
            proc.kill()
    print(f"SIGTERM -> exit in {took:.2f} s (bound: shutdown_timeout_s 3 + HTTP)")
    assert proc.returncode == 0, out[-2000:]
    assert took < 3.0 + 5.0, out[-2000:]
    assert "SIGTERM: shutting down" in out and "shutdown: closing 1 session(s)" in out, out[-2000:]
    assert "shutdown: done (0 session(s) left open)" in out and "stopped in" in out, out[-2000:]
    assert state in ("closed", "failed"), state


async def test_a_second_signal_exits_at_once(tmp_path: Path, demo_test_split: tuple) -> None:  # type: ignore[type-arg]
    # a camera that accepts the connection and then says nothing: its reader is stuck, so the graceful
    # shutdown has to wait (up to shutdown_timeout_s = 30) and the second signal is what ends it
    stalled = socket.socket()
    stalled.bind(("127.0.0.1", 0))
    stalled.listen(4)
    url = f"rtsp://127.0.0.1:{stalled.getsockname()[1]}/stalled"
    proc, base = await _start(tmp_path, shutdown_timeout_s=30.0,
                              extra=f'\n[[cameras]]\nname = "stalled"\nurl = "{url}"\n')
    pc = await _session(base, demo_test_split)
    try:
        proc.send_signal(signal.SIGTERM)
        await asyncio.sleep(1.0)
        assert proc.poll() is None, "still shutting down: the stalled camera holds it"
        proc.send_signal(signal.SIGTERM)
        t0 = time.monotonic()
        out, _ = await asyncio.to_thread(proc.communicate, timeout=20)
        took = time.monotonic() - t0
    finally:
        await pc.close()
        stalled.close()
        if proc.poll() is None:
            proc.kill()
    assert "SIGTERM again: exiting now" in out, out[-2000:]
    assert proc.returncode == 128 + signal.SIGTERM, (proc.returncode, out[-2000:])
    assert took < 2.0
