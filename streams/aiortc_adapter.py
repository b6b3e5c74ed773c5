"""The one place that reads aiortc's private state (aiortc is pinned to 1.16.0 in pyproject.toml).

aiortc computes what we need but does not expose all of it:

* RTT: ``RTCRtpSender`` keeps an EWMA of receiver-report RTTs in ``__rtt``
  (seconds; ``None`` for the first seconds).  It equals ``roundTripTime`` of
  the ``remote-inbound-rtp`` stats entry, so the public ``getStats()`` is the
  fallback.  That EWMA keeps 85 % of the old value per report (about one a
  second), so it takes many seconds to follow a step; ``tap_rtcp_rtt`` gives
  each report's own sample instead, computed as aiortc does (now - LSR time -
  DLSR) from the sender's ``__lsr``/``__lsr_time``.
* Bitrate: REMB from the peer sets the sender's encoder ``target_bitrate``;
  the receiver's own estimate is its remote bitrate estimator's
  ``rate_control.current_bitrate``, meaningful once
  ``current_bitrate_initialized``.

* DTLS role: an offer with ``a=setup:actpass`` leaves aiortc's transports at role ``auto``, which its answer turns
  into the DTLS *client* (``a=setup:active``).  As a client aiortc offers ECDSA cipher suites only, so a peer whose
  certificate is RSA (GStreamer's webrtcbin) fails the handshake with "no shared cipher" (aiortc#1392).
  ``answer_as_dtls_server`` sets those transports to ``server`` before the answer is made (``a=setup:passive``):
  the peer then connects as the client and offers its full suite list, which includes aiortc's ECDSA ones.

``check_internals_at_start`` (run before the server answers anyone) fails loudly, naming what moved, if a new
aiortc renames any of this. No other module of the project reads an aiortc or aioice private name
(``tests/test_layout.py`` checks).
"""

from __future__ import annotations

import contextlib
import time
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import aiortc
from aiortc import RTCPeerConnection, sdp
from aiortc.jitterbuffer import JitterBuffer
from aiortc.rtp import (
    RTCP_PSFB_APP,
    RTCP_PSFB_FIR,
    RTCP_PSFB_PLI,
    RtcpPsfbPacket,
    RtcpRrPacket,
    RtcpSrPacket,
    unpack_remb_fci,
)

from streams.errors import StreamsError

SENDER_RTT = "_RTCRtpSender__rtt"
SENDER_LSR = "_RTCRtpSender__lsr"  # middle 32 bits of the NTP time of the last SR sent
SENDER_LSR_TIME = "_RTCRtpSender__lsr_time"  # time.time() when it was sent
SENDER_ENCODER = "_RTCRtpSender__encoder"  # created when the first frame is sent
RECEIVER_ESTIMATOR = "_RTCRtpReceiver__remote_bitrate_estimator"
TRANSCEIVER_CODECS = "_codecs"  # negotiated, in the order aiortc sends with
DTLS_ROLE = "_role"  # RTCDtlsTransport: "auto" until the descriptions fix it, then "client" or "server"
DTLS_SET_ROLE = "_set_role"


class AiortcInternalsError(StreamsError, RuntimeError):
    """aiortc's private attributes this adapter reads are not where aiortc 1.16.0 kept them."""


def check_internals(sender: Any, receiver: Any) -> None:
    """Raise ``AiortcInternalsError`` listing every private name that is missing on a video sender/receiver."""
    missing = [f"RTCRtpSender.{name}" for name in (SENDER_RTT, SENDER_LSR, SENDER_LSR_TIME, "_ssrc",
                                                    "_handle_rtcp_packet") if not hasattr(sender, name)]
    if not hasattr(receiver, RECEIVER_JITTER_BUFFER):
        missing.append(f"RTCRtpReceiver.{RECEIVER_JITTER_BUFFER}")
    else:
        missing += [f"JitterBuffer.{name}" for name in ("_packets", "_origin", "_capacity", "_remove_frame")
                    if not hasattr(getattr(receiver, RECEIVER_JITTER_BUFFER), name)]
    dtls = getattr(receiver, "transport", None)
    missing += [f"RTCDtlsTransport.{name}" for name in (DTLS_ROLE, DTLS_SET_ROLE) if not hasattr(dtls, name)]
    est = getattr(receiver, RECEIVER_ESTIMATOR, None)
    if est is None:
        missing.append(f"RTCRtpReceiver.{RECEIVER_ESTIMATOR}")
    else:
        rc = getattr(est, "rate_control", None)
        for name in ("current_bitrate", "current_bitrate_initialized"):
            if not hasattr(rc, name):
                missing.append(f"RemoteBitrateEstimator.rate_control.{name}")
    if not hasattr(sender, SENDER_ENCODER):
        missing.append(f"RTCRtpSender.{SENDER_ENCODER}")
    if missing:
        raise AiortcInternalsError(f"aiortc {aiortc.__version__} moved what edge-app reads ("
                                   + ", ".join(missing) + "): install the aiortc that pyproject.toml pins (1.16.0)")


async def check_internals_at_start() -> None:
    """``check_internals`` on a throwaway peer connection's video transceiver, before any peer is answered: an
    aiortc that moved a name fails the start with one line naming its version and the names."""
    pc = RTCPeerConnection()
    try:
        transceiver = pc.addTransceiver("video")
        check_internals(transceiver.sender, transceiver.receiver)
        if not hasattr(transceiver, TRANSCEIVER_CODECS):
            raise AiortcInternalsError(f"aiortc {aiortc.__version__} moved what edge-app reads "
                                       f"(RTCRtpTransceiver.{TRANSCEIVER_CODECS}): install the aiortc that "
                                       "pyproject.toml pins (1.16.0)")
    finally:
        await pc.close()


def answer_as_dtls_server(pc: Any) -> int:
    """After ``setRemoteDescription(offer)``: take the DTLS server role wherever the offer left it open (actpass).

    Returns how many transports were set.  Where the offer chose (``a=setup:active``: it is the client; ``passive``:
    we must be) aiortc's choice stands.
    """
    offer = pc.remoteDescription
    if offer is None or offer.type != "offer":
        return 0
    roles = {m.dtls.role for m in sdp.SessionDescription.parse(offer.sdp).media if m.dtls is not None}
    if roles != {"auto"}:  # the offer picked a side (or mixed them): aiortc already follows it
        return 0
    transports = {t.receiver.transport for t in pc.getTransceivers()}
    if pc.sctp is not None:
        transports.add(pc.sctp.transport)
    changed = 0
    for dtls in transports:
        if getattr(dtls, DTLS_ROLE) == "auto" and dtls.state == "new":
            getattr(dtls, DTLS_SET_ROLE)("server")
            changed += 1
    return changed


def sender_rtt_ms(sender: Any) -> float | None:
    """The sender's smoothed RTT from receiver reports, in ms; None until the first report."""
    rtt = getattr(sender, SENDER_RTT, None)
    return None if rtt is None else float(rtt) * 1e3


def tap_rtcp(endpoint: Any, on_packet: Callable[[], None]) -> None:
    """Call ``on_packet()`` for every RTCP packet an RTCRtpSender or RTCRtpReceiver gets (the peer is alive)."""
    original = endpoint._handle_rtcp_packet

    async def handle(packet: Any) -> None:
        on_packet()
        await original(packet)

    endpoint._handle_rtcp_packet = handle


@dataclass
class RtcpTaps:
    """What a sender's RTCP tells beyond the RTT, as it arrives: each report's loss fraction (0..1) and the peer's
    REMB (bit/s); ``after`` runs once aiortc has handled the packet (aiortc sets the encoder's target from a REMB
    then, so a cap of our own is re-applied there)."""

    on_loss: Callable[[float], None] | None = None
    on_remb_bps: Callable[[int], None] | None = None
    after: Callable[[], None] | None = None
    on_keyframe_request: Callable[[], None] | None = None  # PLI or FIR (a shared encoder must hear it)


def tap_rtcp_rtt(sender: Any, on_sample: Callable[[float], None], on_packet: Callable[[], None] | None = None,
                 taps: RtcpTaps | None = None) -> None:
    """Call ``on_sample(rtt_ms)`` with the RTT of every receiver report the sender gets (unsmoothed), and the
    callbacks of ``taps``.

    Wraps this sender instance's ``_handle_rtcp_packet`` (aiortc's DTLS transport calls it per RTCP
    packet); the sample is computed before aiortc handles the packet, exactly as aiortc computes its own.
    """
    original = sender._handle_rtcp_packet
    taps = taps or RtcpTaps()

    async def handle(packet: Any) -> None:
        if on_packet is not None:
            on_packet()
        if isinstance(packet, RtcpRrPacket | RtcpSrPacket):
            lsr, lsr_time = getattr(sender, SENDER_LSR, None), getattr(sender, SENDER_LSR_TIME, None)
            for report in packet.reports:
                if report.ssrc != sender._ssrc:
                    continue
                if taps.on_loss is not None:
                    taps.on_loss(report.fraction_lost / 256)
                if lsr_time is not None and report.lsr == lsr and report.dlsr:
                    on_sample((time.time() - lsr_time - report.dlsr / 65536) * 1e3)
        elif (isinstance(packet, RtcpPsfbPacket) and packet.fmt in (RTCP_PSFB_PLI, RTCP_PSFB_FIR)
              and taps.on_keyframe_request is not None):
            taps.on_keyframe_request()
        elif isinstance(packet, RtcpPsfbPacket) and packet.fmt == RTCP_PSFB_APP and taps.on_remb_bps is not None:
            with contextlib.suppress(ValueError):
                taps.on_remb_bps(int(unpack_remb_fci(packet.fci)[0]))
        await original(packet)
        if taps.after is not None:
            taps.after()

    sender._handle_rtcp_packet = handle


def set_sender_target_bitrate(sender: Any, bitrate_bps: int) -> bool:
    """Set the encoder's target bitrate (it re-creates itself when the target moves by more than 10 %); False
    before the first frame is encoded."""
    enc = getattr(sender, SENDER_ENCODER, None)
    if enc is None or not hasattr(enc, "target_bitrate"):
        return False
    enc.target_bitrate = bitrate_bps
    return True


def sender_target_bitrate_bps(sender: Any) -> int | None:
    """The encoder's target bitrate (set by the peer's REMB); None before the first frame is encoded."""
    enc = getattr(sender, SENDER_ENCODER, None)
    rate = getattr(enc, "target_bitrate", None)
    return None if rate is None else int(rate)


def floor_remb(receiver: Any, min_bps: int) -> bool:
    """Never ask the peer (by REMB) for less than ``min_bps``; False when the receiver has no estimator.

    aiortc's delay-based estimator reads a step in path delay as congestion and, with its rate control
    assuming a 200 ms RTT, can keep asking a browser for ~70 kbit/s for tens of seconds after one step;
    the browser then sends a few frames a second.  A floor (aiortc's own VP8 encoder keeps 250 kbit/s)
    bounds that; on a link really narrower than the floor it costs queueing.
    """
    est = getattr(receiver, RECEIVER_ESTIMATOR, None)
    if est is None or min_bps <= 0:
        return False
    original = est.add

    def add(*args: Any, **kwargs: Any) -> Any:
        remb = original(*args, **kwargs)
        if remb is None:
            return None
        bitrate, ssrcs = remb
        return max(int(bitrate), min_bps), ssrcs

    est.add = add
    return True


def receiver_bitrate_estimate_bps(receiver: Any) -> int | None:
    """The receive-side bandwidth estimate for the incoming stream; None until it is initialised."""
    est = getattr(receiver, RECEIVER_ESTIMATOR, None)
    rc = getattr(est, "rate_control", None)
    if rc is None or not getattr(rc, "current_bitrate_initialized", False):
        return None
    return int(rc.current_bitrate)


RECEIVER_JITTER_BUFFER = "_RTCRtpReceiver__jitter_buffer"


class GapSkippingJitterBuffer(JitterBuffer):
    """aiortc's jitter buffer, but when no frame has come out for ``max_gap_s`` because a packet is missing (at the
    head of the buffer or after it), the gap and the frame it broke are skipped, with a PLI for a new keyframe,
    instead of stalling every later frame until 512 packets have piled up.

    On a narrow path (a rate cap drops packets, and their retransmissions too) aiortc's buffer waits for the
    missing packet until its capacity is reached: at 150-250 kbit/s that is 10-20 s without a single frame.
    Reads aiortc's private ``_packets``, ``_origin`` and ``_capacity`` (checked by ``check_internals``).
    """

    def __init__(self, capacity: int = 512, max_gap_s: float = 0.3) -> None:
        super().__init__(capacity, is_video=True)
        self.max_gap_s = max_gap_s
        self.skipped = 0  # gaps skipped
        self._last_out_s = time.monotonic()

    def add(self, packet: Any) -> tuple[bool, Any]:
        pli, frame = super().add(packet)
        now = time.monotonic()
        if frame is not None or self._origin is None:
            self._last_out_s = now
            return pli, frame
        if now - self._last_out_s >= self.max_gap_s and self._skip_gap():
            self._last_out_s = now
            self.skipped += 1
            return True, self._remove_frame(packet.sequence_number)
        return pli, frame

    def _skip_gap(self) -> bool:
        """Drop what comes before the first packet after the first gap, and the rest of the frame the gap broke;
        False when there is no gap with a packet after it (the buffer just waits for the next packets)."""
        cap, origin, packets = self._capacity, self._origin, self._packets
        if origin is None:
            return False
        missing = next((k for k in range(cap) if packets[(origin + k) % cap] is None), None)
        if missing is None:
            return False
        after = next((k for k in range(missing, cap) if packets[(origin + k) % cap] is not None), None)
        if after is None:
            return False
        before = packets[(origin + missing - 1) % cap] if missing > 0 else None
        first_after = packets[(origin + after) % cap]
        assert first_after is not None
        broken = (before or first_after).timestamp  # the frame the gap broke
        self.remove(after)
        origin = self._origin
        assert origin is not None
        rest = 0
        while rest < cap:
            p = packets[(origin + rest) % cap]
            if p is None or p.timestamp != broken:
                break
            rest += 1
        self.remove(rest)
        return True


def prefer_codec(transceiver: Any, mime_type: str) -> bool:
    """Put ``mime_type`` first among the codecs negotiated on ``transceiver`` (after ``setRemoteDescription``, before
    the answer): the answer lists it first and aiortc sends with it. False when the peer did not offer it."""
    codecs = getattr(transceiver, TRANSCEIVER_CODECS, None)
    if codecs is None:
        raise AiortcInternalsError("aiortc's RTCRtpTransceiver has no negotiated _codecs: this aiortc version is "
                                   "not the one edge-app was tested with")
    first = [c for c in codecs if c.mimeType.lower() == mime_type.lower()]
    if not first:
        return False
    setattr(transceiver, TRANSCEIVER_CODECS, first + [c for c in codecs if c not in first])
    return True


def negotiated_codec(transceiver: Any) -> Any:
    """The codec this transceiver will send with (aiortc sends with the first it negotiated)."""
    codecs = getattr(transceiver, TRANSCEIVER_CODECS, None)
    if not codecs:
        raise AiortcInternalsError("aiortc's RTCRtpTransceiver has no negotiated _codecs: this aiortc version is "
                                   "not the one edge-app was tested with")
    return codecs[0]


def jitter_buffer_state(track: Any, pc: Any) -> dict[str, Any]:
    """For a log line: the receiving jitter buffer of ``track`` (on ``pc``): packets held, gaps skipped."""
    for t in pc.getTransceivers():
        if t.receiver.track is track:
            buf = getattr(t.receiver, RECEIVER_JITTER_BUFFER, None)
            if buf is None:
                return {}
            held = sum(p is not None for p in buf._packets)
            return {"packets_held": held, "gaps_skipped": getattr(buf, "skipped", None), "origin": buf._origin}
    return {}


def skip_long_gaps(receiver: Any, max_gap_s: float = 0.3) -> bool:
    """Give a video receiver the ``GapSkippingJitterBuffer``; False when aiortc's buffer is not where it was."""
    if not hasattr(receiver, RECEIVER_JITTER_BUFFER):
        return False
    setattr(receiver, RECEIVER_JITTER_BUFFER, GapSkippingJitterBuffer(512, max_gap_s))
    return True
