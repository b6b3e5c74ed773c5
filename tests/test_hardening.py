"""Peers that never connect, bursts of offers, hostile offers, CORS, and a port already in use.

Each test here failed on the code before the hardening: sessions that never connected stayed for ever and held
the box at capacity; a burst of offers overshot ``max_sessions``; deeply nested JSON and a BUNDLE group naming a
missing m-section answered 500; a tiny ``a=max-message-size`` made every result raise; 30 offered video tracks were
all decoded; a port in use printed a traceback after "serving on".
"""

from __future__ import annotations

import asyncio
import json
import re
import socket
import subprocess
import sys
import threading
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import aiohttp
import pytest
from aiortc import RTCPeerConnection, RTCSessionDescription, VideoStreamTrack
from support.live import REPO, results_channel
from test_bad_input import _offer_sdp

from edge_app.config import AppConfig


async def dead_offer(video: bool = True, channel: bool = True) -> str:
    """An offer from a peer that is closed before the answer comes (a tab closed mid-connect): it never connects."""
    return await _offer_sdp(video, channel)  # the offering peer is closed as soon as it has made the offer


async def post_offer(http: aiohttp.ClientSession, base: str, body: Any, raw: bytes | None = None
                     ) -> tuple[int, dict[str, Any]]:
    data = raw if raw is not None else json.dumps(body).encode()
    async with http.post(f"{base}/offer", data=data, headers={"Content-Type": "application/json"}) as r:
        return r.status, await r.json()


async def get_json(http: aiohttp.ClientSession, url: str) -> dict[str, Any]:
    async with http.get(url) as r:
        out: dict[str, Any] = await r.json()
        return out


async def metric(http: aiohttp.ClientSession, base: str, name: str, **labels: str) -> float:
    async with http.get(f"{base}/metrics") as r:
        text = await r.text()
    want = ",".join(f'{k}="{v}"' for k, v in labels.items())
    m = re.search(rf"^{name}{{{want}}} (\S+)$" if labels else rf"^{name} (\S+)$", text, re.M)
    return float(m.group(1)) if m else 0.0


@pytest.mark.live
async def test_a_session_that_never_connects_is_closed_and_frees_its_slot(
        app_config: Callable[..., AppConfig], serve: Any) -> None:
    cfg = app_config(server={"connect_timeout_s": 2.0, "max_sessions": 1})
    async with serve(cfg) as base, aiohttp.ClientSession() as http:
        sdp = await dead_offer()
        status, answer = await post_offer(http, base, {"sdp": sdp, "type": "offer"})
        assert status == 200, answer
        during = (await get_json(http, f"{base}/status"))["sessions"]
        assert len(during) == 1 and during[0]["state"] != "connected" and during[0]["age_s"] < 2, during
        refused, body = await post_offer(http, base, {"sdp": sdp, "type": "offer"})
        assert refused == 503 and "at capacity" in body["error"]
        t0 = time.monotonic()
        while (await get_json(http, f"{base}/status"))["sessions"] and time.monotonic() - t0 < 10:
            await asyncio.sleep(0.1)
        took = time.monotonic() - t0
        after = await get_json(http, f"{base}/status")
        closed = await metric(http, base, "edge_sessions_closed_total", reason="connect-timeout")
        again, _ = await post_offer(http, base, {"sdp": await dead_offer(), "type": "offer"})
    print(f"unconnectable session closed {took:.1f} s after the check (connect_timeout_s = 2)")
    assert after["sessions"] == [] and after["sessions_closed"] == {"connect-timeout": 1}, after
    assert closed == 1.0
    assert again == 200, "the freed slot takes a new offer"


@pytest.mark.live
async def test_a_burst_of_offers_never_overshoots_max_sessions(app_config: Callable[..., AppConfig],
                                                               serve: Any) -> None:
    cfg = app_config(server={"max_sessions": 4, "max_offers_per_minute": 1000, "connect_timeout_s": 30.0})
    async with serve(cfg) as base, aiohttp.ClientSession() as http:
        sdp = await dead_offer()
        results = await asyncio.gather(*[post_offer(http, base, {"sdp": sdp, "type": "offer"}) for _ in range(20)])
        sessions = (await get_json(http, f"{base}/status"))["sessions"]
    codes = sorted(code for code, _ in results)
    assert codes.count(200) == 4 and codes.count(503) == 16, codes
    assert len(sessions) == 4


def _munge(sdp: str, old: str, new: str) -> str:
    assert re.search(old, sdp), f"the offer has no {old!r}"
    return re.sub(old, new, sdp)


@pytest.mark.live
async def test_hostile_offers_get_400_with_a_reason_and_are_counted(app_config: Callable[..., AppConfig],
                                                                    serve: Any) -> None:
    async with serve(app_config()) as base, aiohttp.ClientSession() as http:
        good = await dead_offer()
        before = await metric(http, base, "edge_offers_total", outcome="bad-request")
        before_400 = await metric(http, base, "edge_offers_total", outcome="refused-400")
        nested = await post_offer(http, base, None, raw=b"[" * 100_000 + b"]" * 100_000)
        bundle = await post_offer(http, base, {"sdp": _munge(good, r"a=group:BUNDLE ([^\r\n]*)",
                                                             r"a=group:BUNDLE \1 ghost"), "type": "offer"})
        tiny = await post_offer(http, base, {"sdp": _munge(good, r"a=max-message-size:\d+", "a=max-message-size:100"),
                                             "type": "offer"})
        extra = await post_offer(http, base, {"sdp": good, "type": "offer", "video_transform": "none",
                                              "nested": {"a": [1, 2]}})
        after = await metric(http, base, "edge_offers_total", outcome="bad-request")
        after_400 = await metric(http, base, "edge_offers_total", outcome="refused-400")
        errors = await metric(http, base, "edge_offers_total", outcome="error")
    assert nested[0] == 400 and "nested too deeply" in nested[1]["error"], nested
    assert bundle[0] == 400 and "ghost" in bundle[1]["error"] and "BUNDLE" in bundle[1]["error"], bundle
    assert tiny[0] == 400 and "max-message-size:100" in tiny[1]["error"], tiny
    assert extra[0] == 200, "unknown keys are ignored (aiortc's example client sends video_transform)"
    assert after - before == 1 and after_400 - before_400 == 2 and errors == 0


@pytest.mark.live
async def test_only_the_track_the_app_uses_is_received(app_config: Callable[..., AppConfig], serve: Any) -> None:
    """30 offered video tracks and an audio track: one is analysed, the rest are answered inactive, not decoded."""
    from aiortc.mediastreams import AudioStreamTrack

    async with serve(app_config()) as base:
        threads_before = threading.active_count()
        pc = RTCPeerConnection()
        results: list[dict[str, Any]] = []
        try:
            for _ in range(30):
                pc.addTrack(VideoStreamTrack())
            pc.addTrack(AudioStreamTrack())
            results_channel(pc, results.append)
            await pc.setLocalDescription(await pc.createOffer())
            async with aiohttp.ClientSession() as http:
                code, answer = await post_offer(http, base, {"sdp": pc.localDescription.sdp, "type": "offer"})
                assert code == 200, answer
                await pc.setRemoteDescription(RTCSessionDescription(answer["sdp"], answer["type"]))
                for _ in range(150):
                    if len(results) >= 20:
                        break
                    await asyncio.sleep(0.1)
                threads_during = threading.active_count()
        finally:
            await pc.close()
    directions = re.findall(r"^a=(sendrecv|sendonly|recvonly|inactive)\r?$", answer["sdp"], re.M)
    print(f"31 offered tracks: threads {threads_before} -> {threads_during}; answer directions {directions}")
    assert len(results) >= 20, "the analysed track gets results"
    assert directions.count("inactive") == 30 and directions.count("sendrecv") == 1, directions
    assert threads_during - threads_before <= 12, (threads_before, threads_during)


@pytest.mark.live
async def test_cors_preflight_for_configured_origins_only(app_config: Callable[..., AppConfig], serve: Any) -> None:
    cfg = app_config(server={"cors_origins": ["http://page.example"], "token": "t" * 24})
    pre = {"Origin": "http://page.example", "Access-Control-Request-Method": "POST",
           "Access-Control-Request-Headers": "authorization,content-type"}
    async with serve(cfg) as base, aiohttp.ClientSession() as http:
        async with http.options(f"{base}/offer", headers=pre) as r:
            ok = r.status, dict(r.headers)
        async with http.options(f"{base}/offer", headers={**pre, "Origin": "http://evil.example"}) as r:
            refused = r.status
        auth = {"Authorization": "Bearer " + "t" * 24}
        async with http.get(f"{base}/status", headers={"Origin": "http://page.example", **auth}) as r:
            allowed_get = r.status, r.headers.get("Access-Control-Allow-Origin")
        async with http.get(f"{base}/status", headers={"Origin": "http://evil.example", **auth}) as r:
            other_get = r.headers.get("Access-Control-Allow-Origin")
    assert ok[0] == 204 and ok[1]["Access-Control-Allow-Origin"] == "http://page.example", ok
    assert "Authorization" in ok[1]["Access-Control-Allow-Headers"]
    assert "DELETE" in ok[1]["Access-Control-Allow-Methods"], "a WHIP/WHEP player on another origin ends its session"
    assert refused == 403
    assert allowed_get == (200, "http://page.example") and other_get is None


@pytest.mark.live
def test_a_port_in_use_is_one_line_and_exit_2(tmp_path: Path) -> None:
    with socket.socket() as taken:
        taken.bind(("127.0.0.1", 0))
        taken.listen()
        port = taken.getsockname()[1]
        cfg = tmp_path / "config.toml"
        cfg.write_text(f'[model]\npath = "{REPO / "models" / "default"}"\nwarmup_runs = 0\n')
        proc = subprocess.run([sys.executable, "-m", "edge_app", "serve", "--config", str(cfg), "--port", str(port)],
                              capture_output=True, text=True, timeout=60, cwd=tmp_path)
    errors = [line for line in proc.stderr.splitlines() if line.startswith("error:")]
    assert proc.returncode == 2, proc.stderr
    assert "Traceback" not in proc.stderr and "serving on" not in proc.stderr, proc.stderr
    assert len(errors) == 1 and f"127.0.0.1:{port}" in errors[0] and "already in use" in errors[0], proc.stderr
    assert "--port" in errors[0] and "[server] port" in errors[0]


@pytest.mark.parametrize("size", [100])
def test_offer_sdp_checks_are_pure(size: int) -> None:
    from streams.sdp_check import offer_problem

    sdp = asyncio.run(dead_offer())
    assert offer_problem(sdp) is None
    assert "max-message-size" in (offer_problem(_munge(sdp, r"a=max-message-size:\d+",
                                                       f"a=max-message-size:{size}")) or "")
    assert offer_problem(_munge(sdp, r"a=max-message-size:\d+", "a=max-message-size:0")) is None  # 0: no limit
    assert "does not parse" in (offer_problem("v=0\r\nm=video x\r\n") or "")


@pytest.mark.slow
@pytest.mark.live
def test_soak_of_offers_that_never_connect(tmp_path: Path) -> None:
    """A short run of ``edge-app bench-soak`` (the full one: 200 offers over 2 minutes): a real server process,
    offers from peers that are gone, every session closed, no growth of threads, fds or RSS, a real client after."""
    from edge_app.bench.soak import bench_soak

    report = bench_soak(REPO / "models" / "default", offers=30, seconds=10.0, max_sessions=4, connect_timeout_s=2.0,
                        out=tmp_path)
    print(report.table())
    assert report.problems() == []
    assert report.answered >= 8 and report.refused_503 >= 1 and report.answered + report.refused_503 == 30
    assert report.closed_by_reason == {"connect-timeout": report.answered}
