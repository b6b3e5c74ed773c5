"""A camera's own H.264, forwarded to its viewers with no decode-encode: the overlay is drawn in the page.

Where a camera sends H.264 that browsers take over WebRTC (Constrained Baseline, Baseline, Main or High
profile, 4:2:0, no B-frames: WebRTC receivers decode frames in the order they arrive), its compressed packets,
as the RTSP reader demuxes them, are handed to every viewer's track as ``av.Packet``s, which each viewer's sender
packetises (aiortc's public path for pre-encoded media). Nothing is rendered or encoded for those viewers; the
camera is still decoded once, for the analysis.

What a transcode would do and this cannot:
- force a keyframe: a new viewer, or one that lost its place, waits for the camera's next one (its keyframe
  interval; keep it at 1-2 s on the camera). Keyframe requests (PLI/FIR) are counted, not acted on.
- follow the path's rate: the camera's bitrate is what goes out. The session moves a viewer whose path shows
  congestion to the camera's shared encoder (``streams.shared_video``), which adapts.

Parameter sets: an RTSP camera gives them out of band (``sprop-parameter-sets``); a keyframe that does not carry
its SPS and PPS gets them put in front, so a viewer can start on any keyframe. RTP timestamps come from the
camera's presentation times (90 kHz), made monotonic across a reconnect.
"""

from __future__ import annotations

import asyncio
from collections import deque
from collections.abc import Callable
from typing import Any

import av
from aiortc.rtcrtpparameters import RTCRtpCodecParameters

from streams.codecinfo import CodecInfo, passthrough_problem
from streams.pacer import VIDEO_TIME_BASE
from streams.shared_video import EncodedChunk, VideoFanout

NAL_SPS, NAL_PPS, NAL_IDR = 7, 8, 5


def nal_types(annex_b: bytes) -> set[int]:
    """The NAL unit types in an Annex B bitstream (a start code never occurs inside a unit: emulation prevention)."""
    return {nal[0] & 0x1F for nal in annex_b.split(b"\x00\x00\x01")[1:] if nal}


class CameraPassthrough(VideoFanout):
    """The camera's packets to every viewer; ``on_packet`` is the RTSP reader's ``packet_sink``."""

    def __init__(self, name: str, codec: RTCRtpCodecParameters, loop: asyncio.AbstractEventLoop) -> None:
        super().__init__(name, codec)
        self._loop = loop
        self.forwarded = 0  # frames forwarded (once each, whatever the number of viewers)
        self._offset = 0  # added to the camera's pts so that RTP time never goes back (a reconnect restarts it)
        self._last_out: int | None = None
        self._rate: deque[tuple[float, int]] = deque()  # (arrival, bytes) over the last 2 s: the camera's bitrate
        self.on_unfit: Callable[[str], None] | None = None  # the stream stopped being forwardable (and why)
        self._unfit: str | None = None

    def on_packet(self, packet: av.Packet[Any], codec: CodecInfo, arrived_s: float) -> None:
        """In the reader thread: parameter sets in front of a keyframe, RTP time, then offered on the event loop."""
        if self._unfit is not None:
            return
        if codec.b_frames or codec.name != "h264":
            self._unfit = passthrough_problem(codec) or "the camera's stream changed"
            if self.on_unfit is not None:
                self._loop.call_soon_threadsafe(self.on_unfit, self._unfit)
            return
        data = bytes(packet)
        types = nal_types(data)
        keyframe = bool(packet.is_keyframe) or NAL_IDR in types
        if keyframe and codec.extradata[:3] in (b"\x00\x00\x01", b"\x00\x00\x00") and not {NAL_SPS, NAL_PPS} <= types:
            data = codec.extradata + data
        pts = packet.pts if packet.pts is not None and packet.time_base is not None else None
        ticks = (int(pts * packet.time_base * 90_000) if pts is not None else int(arrived_s * 90_000))
        if self._last_out is not None and not 0 < ticks + self._offset - self._last_out < 10 * 90_000:
            self._offset = self._last_out + 3000 - ticks  # a jump (reconnect, wrap): carry on 1/30 s later
        out = ticks + self._offset
        self._last_out = out
        framed = av.Packet(data)
        framed.pts, framed.time_base = out, VIDEO_TIME_BASE
        self._loop.call_soon_threadsafe(self._forward, EncodedChunk(framed, keyframe), len(data), arrived_s)

    def _forward(self, chunk: EncodedChunk, size: int, arrived_s: float) -> None:
        self.forwarded += 1
        self._rate.append((arrived_s, size))
        while self._rate and self._rate[0][0] < arrived_s - 2.0:
            self._rate.popleft()
        self._offer(chunk)

    @property
    def bitrate_bps(self) -> int | None:
        """The camera's bitrate over the last 2 s (None before 1 s of it)."""
        if len(self._rate) < 2 or self._rate[-1][0] - self._rate[0][0] < 1.0:
            return None
        return int(8 * (sum(n for _, n in self._rate) - self._rate[0][1]) / (self._rate[-1][0] - self._rate[0][0]))

    def status(self) -> dict[str, Any]:
        return {"codec": self.codec.mimeType, "viewers": len(self.viewers), "frames_forwarded": self.forwarded,
                "bitrate_bps": self.bitrate_bps, "keyframes_requested": self.keyframes_requested}
