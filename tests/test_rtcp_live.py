"""Two real aiortc peers over loopback: the adapter reads a real RTT and REMB-driven bitrate."""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import AsyncIterator

import pytest
from aiortc import RTCPeerConnection, VideoStreamTrack
from aiortc.mediastreams import MediaStreamError

from streams.aiortc_adapter import (
    receiver_bitrate_estimate_bps,
    sender_rtt_ms,
    sender_target_bitrate_bps,
)
from streams.rtc_settings import restrict_host_addresses


@pytest.fixture
async def loopback_peers() -> AsyncIterator[tuple[RTCPeerConnection, RTCPeerConnection]]:
    restrict_host_addresses(["127.0.0.1"])
    a, b = RTCPeerConnection(), RTCPeerConnection()
    try:
        yield a, b
    finally:
        await a.close()
        await b.close()
        restrict_host_addresses(None)


@pytest.mark.slow
async def test_rtt_and_bitrate_come_from_rtcp(loopback_peers: tuple[RTCPeerConnection, RTCPeerConnection]) -> None:
    a, b = loopback_peers
    sender = a.addTrack(VideoStreamTrack())
    received: list[object] = []
    readers: list[asyncio.Task[None]] = []

    @b.on("track")
    def on_track(track) -> None:  # type: ignore[no-untyped-def]
        async def pull() -> None:
            with contextlib.suppress(MediaStreamError):
                while True:
                    received.append(await track.recv())

        readers.append(asyncio.create_task(pull()))

    await a.setLocalDescription(await a.createOffer())
    assert "127.0.0.1" in a.localDescription.sdp
    await b.setRemoteDescription(a.localDescription)
    await b.setLocalDescription(await b.createAnswer())
    await a.setRemoteDescription(b.localDescription)

    rtt = None
    for _ in range(100):  # at most 10 s; aiortc reports an RTT after a few seconds
        await asyncio.sleep(0.1)
        rtt = sender_rtt_ms(sender)
        if rtt is not None and received:
            break
    assert received, "no frame crossed the loopback connection"
    assert rtt is not None and 0 < rtt < 50, f"RTT on loopback should be a few ms, got {rtt}"
    target = sender_target_bitrate_bps(sender)
    assert target is not None and 250_000 <= target <= 1_500_000, "VP8 encoder target within aiortc's clamp"
    receiver = b.getTransceivers()[0].receiver
    est = receiver_bitrate_estimate_bps(receiver)
    for task in readers:
        task.cancel()
    await asyncio.gather(*readers, return_exceptions=True)
    assert est is None or est > 0
    print(f"loopback: RTT {rtt:.2f} ms, encoder target {target} bit/s, receive estimate {est}")
