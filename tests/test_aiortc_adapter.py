"""The private aiortc state the adapter reads still exists (fails loudly when aiortc changes)."""

from __future__ import annotations

import aiortc
import pytest

from streams.aiortc_adapter import (
    AiortcInternalsError,
    check_internals,
    receiver_bitrate_estimate_bps,
    sender_rtt_ms,
    sender_target_bitrate_bps,
)


async def test_internals_are_where_the_adapter_reads_them() -> None:
    assert aiortc.__version__ == "1.16.0", "the adapter was checked against aiortc 1.16.0; re-check it"
    pc = aiortc.RTCPeerConnection()
    try:
        transceiver = pc.addTransceiver("video", direction="sendrecv")
        check_internals(transceiver.sender, transceiver.receiver)
        assert hasattr(transceiver, "_offerDirection"), "peer_receives reads aiortc's _offerDirection"
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
