"""The real app, a real aiortc peer over loopback sockets, the real default model.

The peer sends a labelled, stamped 640x480 video at 30 fps, receives the
annotated video back and one JSON result per analysed frame on its data
channel.  (The same path through headless Chromium is in test_browser.py.)
"""

from __future__ import annotations

import asyncio
import contextlib
import fractions
import json
import time
from collections.abc import Callable
from typing import Any

import aiohttp
import av
import numpy as np
import pytest
from aiortc import RTCPeerConnection, RTCSessionDescription
from aiortc.mediastreams import MediaStreamError
from support.live import results_channel

from edge_app.bench.testvideo import LabelledVideo, LabelledVideoTrack
from streams.stamp import read_stamp

pytestmark = [pytest.mark.slow, pytest.mark.live]


VideoFileTrack = LabelledVideoTrack  # the name the other tests import


async def connect(base_url: str, pc: RTCPeerConnection, **extra: Any) -> dict[str, Any]:
    await pc.setLocalDescription(await pc.createOffer())
    body = {"sdp": pc.localDescription.sdp, "type": pc.localDescription.type, **extra}
    async with aiohttp.ClientSession() as http, http.post(f"{base_url}/offer", json=body) as r:
        answer: dict[str, Any] = await r.json()
        assert r.status == 200, answer
    await pc.setRemoteDescription(RTCSessionDescription(answer["sdp"], answer["type"]))
    return answer


def collect(pc: RTCPeerConnection, results: list[dict[str, Any]], frames: list[av.VideoFrame],
            tasks: list[asyncio.Task[None]]) -> Any:
    channel = results_channel(pc, results.append)

    @pc.on("track")
    def on_track(track: Any) -> None:
        async def pull() -> None:
            with contextlib.suppress(MediaStreamError):
                while True:
                    frames.append(await track.recv())

        tasks.append(asyncio.create_task(pull()))

    return channel


async def test_browser_style_session_end_to_end(app_config: Callable[..., Any], serve: Any,
                                                demo_test_split: tuple[np.ndarray, np.ndarray]) -> None:
    images, labels = demo_test_split
    video = LabelledVideo(images[:120], labels[:120], hold=4)
    results: list[dict[str, Any]] = []
    frames: list[av.VideoFrame] = []
    tasks: list[asyncio.Task[None]] = []
    async with serve(app_config()) as base:
        pc = RTCPeerConnection()
        try:
            pc.addTrack(VideoFileTrack(video))
            collect(pc, results, frames, tasks)
            answer = await connect(base, pc, probe=True, results="full")
            t_end = time.monotonic() + 30
            while time.monotonic() < t_end:  # until RTCP has given an RTT and enough frames went through
                await asyncio.sleep(0.25)
                if len(results) >= 240 and "rtcp" in results[-1]["rtt_source"].split("+") and frames:
                    break
            async with aiohttp.ClientSession() as http:
                async with http.get(f"{base}/status") as r:
                    status = await r.json()
                async with http.get(f"{base}/metrics") as r:
                    metrics = await r.text()
        finally:
            await pc.close()
            for t in tasks:
                t.cancel()
    assert results, "no result arrived on the data channel"
    last = results[-1]
    assert last["session"] == answer["session"]
    assert "rtcp" in last["rtt_source"].split("+"), "RTT should come from RTCP receiver reports within 30 s"
    assert 0 < last["network"]["rtt_ms"] < 50, last["network"]
    assert 20_000 <= last["network"]["bitrate_bps"] <= 1_500_000, "within the video rate controller's range"
    stamped = [r for r in results if r["stamp"] is not None]
    assert len(stamped) >= 0.9 * len(results), "the frame counter should survive VP8 coding"
    correct = [r["raw"]["class"] == video.label_of_stamp(r["stamp"]) for r in stamped]
    accuracy = float(np.mean(correct))
    exits = np.bincount([r["exit"] for r in results], minlength=4)[1:]
    print(f"{len(results)} results, raw accuracy {accuracy:.3f} over {len(stamped)} stamped frames, "
          f"exits {exits.tolist()}, latency p50 {np.median([r['latency_ms'] for r in results]):.1f} ms, "
          f"RTT {last['network']['rtt_ms']:.2f} ms, bitrate {last['network']['bitrate_bps']:.0f}")
    print("last result:", json.dumps(last))
    assert accuracy >= 0.8, f"results should match the video's labels at about the model's accuracy ({accuracy})"
    # one stall of the shared 2-core box (client and server in this one process: a CI run logged one of 349 ms,
    # all of it CPU in this process) makes the frames due in it late, one after another; a pattern of misses, or
    # more than one stall's worth, is a failure
    missed = [r["frame"] for r in results[-60:] if not r["deadline_met"]]
    runs = [m for i, m in enumerate(missed) if i == 0 or m - missed[i - 1] > 3]
    assert len(runs) <= 1 and (not missed or missed[-1] - missed[0] <= 12), \
        f"loopback frames should be well within budget: missed {missed}"
    assert frames, "no annotated frame came back"
    back = frames[-1].to_ndarray(format="rgb24")
    assert back.shape in ((480, 640, 3), (240, 320, 3)), "full size, or half under 300 kbit/s (the rate's)"
    assert read_stamp(back) is not None, "the annotated frame is the analysed frame (stamp still there)"
    assert "rtcp" in status["sessions"][0]["rtt_source"].split("+")
    assert 'edge_frames_analysed_total{source="browser"}' in metrics
    assert "edge_sessions 1.0" in metrics


async def test_data_channel_only_watcher_needs_a_camera(app_config: Callable[..., Any], serve: Any) -> None:
    async with serve(app_config()) as base:
        pc = RTCPeerConnection()
        try:
            pc.createDataChannel("results")
            await pc.setLocalDescription(await pc.createOffer())
            body = {"sdp": pc.localDescription.sdp, "type": "offer"}
            async with aiohttp.ClientSession() as http:
                async with http.post(f"{base}/offer", json=body) as r:
                    assert r.status == 400
                    assert "nothing to analyse" in (await r.json())["error"]
                async with http.post(f"{base}/offer", json={**body, "camera": "nope"}) as r:
                    assert r.status == 404 and "no camera named 'nope'" in (await r.json())["error"]
                async with http.get(f"{base}/status") as r:
                    assert (await r.json())["sessions"] == []
        finally:
            await pc.close()


def test_stamp_survives_a_frame_round_trip() -> None:
    video = LabelledVideo(np.zeros((3, 96, 96, 3), np.uint8), np.arange(3), hold=2)
    for i in range(video.num_frames):
        assert read_stamp(video.frame(i)) == i
    f = av.VideoFrame.from_ndarray(video.frame(5), format="rgb24").reformat(format="yuv420p")
    f.time_base = fractions.Fraction(1, 30)
    assert read_stamp(f.to_ndarray(format="rgb24")) == 5
