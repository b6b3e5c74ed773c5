"""The private aiortc state the adapter reads still exists (fails loudly when aiortc changes)."""

from __future__ import annotations

import aiortc
import pytest

from streams import aiortc_adapter
from streams.aiortc_adapter import (
    AiortcInternalsError,
    check_internals,
    receiver_bitrate_estimate_bps,
    sender_rtt_ms,
    sender_target_bitrate_bps,
)


@pytest.mark.live
async def test_internals_are_where_the_adapter_reads_them() -> None:
    assert aiortc.__version__ == "1.16.0", "the adapter was checked against aiortc 1.16.0; re-check it"
    pc = aiortc.RTCPeerConnection()
    try:
        transceiver = pc.addTransceiver("video", direction="sendrecv")
        check_internals(transceiver.sender, transceiver.receiver)
        assert hasattr(transceiver, "_codecs"), "prefer_codec and negotiated_codec read aiortc's _codecs"
        # fresh objects: nothing measured yet
        assert sender_rtt_ms(transceiver.sender) is None
        assert sender_target_bitrate_bps(transceiver.sender) is None
        assert receiver_bitrate_estimate_bps(transceiver.receiver) is None
    finally:
        await pc.close()


def test_missing_internals_are_named() -> None:
    class Sender:
        pass

    class Receiver:
        pass

    with pytest.raises(AiortcInternalsError, match=r"RTCRtpSender._RTCRtpSender__rtt.*RTCRtpReceiver"):
        check_internals(Sender(), Receiver())


@pytest.mark.live
async def test_the_start_fails_in_one_line_naming_the_version_and_what_moved(monkeypatch: pytest.MonkeyPatch) -> None:
    await aiortc_adapter.check_internals_at_start()  # this aiortc: nothing moved
    monkeypatch.setattr(aiortc_adapter, "SENDER_RTT", "_RTCRtpSender__round_trip")
    with pytest.raises(AiortcInternalsError) as err:
        await aiortc_adapter.check_internals_at_start()
    assert str(err.value) == ("aiortc 1.16.0 moved what edge-app reads (RTCRtpSender._RTCRtpSender__round_trip): "
                              "install the aiortc that pyproject.toml pins (1.16.0)")


def test_values_are_converted() -> None:
    class RateControl:
        current_bitrate = 400_000
        current_bitrate_initialized = True

    class Estimator:
        rate_control = RateControl()

    class Encoder:
        target_bitrate = 500_000

    class Sender:
        _RTCRtpSender__rtt = 0.066
        _RTCRtpSender__encoder = Encoder()

    class Receiver:
        _RTCRtpReceiver__remote_bitrate_estimator = Estimator()

    assert sender_rtt_ms(Sender()) == pytest.approx(66.0)
    assert sender_target_bitrate_bps(Sender()) == 500_000
    assert receiver_bitrate_estimate_bps(Receiver()) == 400_000


@pytest.mark.live
async def test_rtcp_tap_gives_each_reports_own_rtt() -> None:
    """The tap sees every receiver report and computes its sample as aiortc does, before aiortc's EWMA."""
    import time

    from aiortc import RTCPeerConnection
    from aiortc.rtp import RtcpReceiverInfo, RtcpRrPacket

    from streams.aiortc_adapter import SENDER_LSR, SENDER_LSR_TIME, tap_rtcp_rtt

    pc = RTCPeerConnection()
    try:
        sender = pc.addTransceiver("video").sender
        samples: list[float] = []
        tap_rtcp_rtt(sender, samples.append)
        setattr(sender, SENDER_LSR, 1234)
        setattr(sender, SENDER_LSR_TIME, time.time() - 0.150)  # the SR left 150 ms ago
        report = RtcpReceiverInfo(ssrc=sender._ssrc, fraction_lost=0, packets_lost=0, highest_sequence=0,
                                  jitter=0, lsr=1234, dlsr=int(0.020 * 65536))  # the peer held it 20 ms
        await sender._handle_rtcp_packet(RtcpRrPacket(ssrc=1, reports=[report]))
        assert len(samples) == 1 and samples[0] == pytest.approx(130.0, abs=5.0)
        assert sender_rtt_ms(sender) == pytest.approx(samples[0], abs=0.5), "aiortc's own first sample agrees"
        stale = RtcpReceiverInfo(ssrc=sender._ssrc, fraction_lost=0, packets_lost=0, highest_sequence=0,
                                 jitter=0, lsr=999, dlsr=100)  # answers an older SR: no sample
        await sender._handle_rtcp_packet(RtcpRrPacket(ssrc=1, reports=[stale]))
        assert len(samples) == 1
    finally:
        await pc.close()


def test_jitter_buffer_skips_a_gap_behind_its_head_and_the_frame_it_broke(monkeypatch: pytest.MonkeyPatch) -> None:
    """aiortc's buffer stalls when a packet in the middle of a frame never comes (its head is present, so a
    head-only check never fires): after max_gap_s the broken frame is dropped, a PLI asked for, and the next
    complete frame comes out."""
    from aiortc.rtp import RtpPacket

    from streams import aiortc_adapter

    clock = [100.0]
    monkeypatch.setattr(aiortc_adapter.time, "monotonic", lambda: clock[0])
    buf = aiortc_adapter.GapSkippingJitterBuffer(capacity=64, max_gap_s=0.3)

    def pkt(seq: int, ts: int) -> RtpPacket:
        p = RtpPacket(payload_type=96, sequence_number=seq, timestamp=ts)
        p._data = bytes([seq])  # what aiortc's depayloader leaves for the frame
        return p

    # frame 1000: packets 1, 2, (3 lost), 4; then frames 2000 (5, 6) and 3000 (7, 8)
    assert buf.add(pkt(1, 1000)) == (False, None)
    assert buf.add(pkt(2, 1000)) == (False, None)
    assert buf.add(pkt(4, 1000)) == (False, None)
    assert buf.add(pkt(5, 2000)) == (False, None), "frame 1000 is incomplete: aiortc waits for packet 3"
    clock[0] += 0.1
    assert buf.add(pkt(6, 2000)) == (False, None), "not yet max_gap_s without a frame"
    clock[0] += 0.3
    pli, frame = buf.add(pkt(7, 3000))
    assert pli and frame is not None and frame.timestamp == 2000 and frame.data == bytes([5, 6]), (pli, frame)
    assert buf.skipped == 1
    pli, frame = buf.add(pkt(9, 4000))
    assert not pli and frame is None, "packet 8 is late, not lost yet (a frame came out just now)"
    pli, frame = buf.add(pkt(8, 3000))
    assert frame is not None and frame.timestamp == 3000 and not pli
