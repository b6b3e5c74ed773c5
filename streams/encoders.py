"""One encode of a frame into ``av.Packet``s, for a camera's encoder shared by all its viewers.

aiortc sends pre-encoded media through its public path: a track may yield ``av.Packet``s, and each viewer's sender
then only packetises them (its encoder's ``pack``). ``PacketEncoder`` makes those packets with PyAV, set up as
aiortc's own encoders set up theirs (VP8: libvpx in real time, CBR; H.264: libx264 Baseline, zerolatency, level
3.1), and re-made when the frame size or the target bitrate (by more than 10 %) changes, as aiortc does.
"""

from __future__ import annotations

import fractions
import multiprocessing
from typing import Any

import av
from aiortc.codecs import h264, vpx

from streams.pacer import VIDEO_TIME_BASE

MAX_FRAME_RATE = 30


def _vp8(width: int, height: int, bps: int) -> Any:
    codec = av.CodecContext.create("libvpx", "w")
    codec.width, codec.height, codec.bit_rate, codec.pix_fmt = width, height, bps, "yuv420p"
    codec.gop_size, codec.qmin, codec.qmax = 3000, 2, 56
    codec.options = {"bufsize": str(bps), "cpu-used": "-6", "deadline": "realtime", "lag-in-frames": "0",
                     "minrate": str(bps), "maxrate": str(bps), "noise-sensitivity": "4", "overshoot-pct": "15",
                     "partitions": "0", "static-thresh": "1", "undershoot-pct": "100"}
    codec.thread_count = vpx.number_of_threads(width * height, multiprocessing.cpu_count())
    return codec


def _h264(width: int, height: int, bps: int) -> Any:
    codec = av.CodecContext.create("libx264", "w")
    codec.width, codec.height, codec.bit_rate, codec.pix_fmt = width, height, bps, "yuv420p"
    codec.framerate = fractions.Fraction(MAX_FRAME_RATE, 1)
    codec.time_base = fractions.Fraction(1, MAX_FRAME_RATE)
    codec.options = {"level": "31", "tune": "zerolatency"}
    codec.profile = "Baseline"
    return codec


class PacketEncoder:
    def __init__(self, mime_type: str) -> None:
        kind = mime_type.lower()
        if kind not in ("video/vp8", "video/h264"):
            raise ValueError(f"no shared encoder for {mime_type}: VP8 or H.264")
        self.h264 = kind == "video/h264"
        self.min_bps, self.max_bps = (h264.MIN_BITRATE, h264.MAX_BITRATE) if self.h264 else (
            vpx.MIN_BITRATE, vpx.MAX_BITRATE)  # read now: the app lowers the floor at start
        self._target = h264.DEFAULT_BITRATE if self.h264 else vpx.DEFAULT_BITRATE
        self._codec: Any = None

    @property
    def target_bitrate(self) -> int:
        return self._target

    @target_bitrate.setter
    def target_bitrate(self, bps: int) -> None:
        self._target = max(self.min_bps, min(int(bps), self.max_bps))

    def encode(self, frame: av.VideoFrame, keyframe: bool) -> tuple[av.Packet[Any], bool] | None:
        """``frame`` (its pts on the 90 kHz clock, as ``VideoPacer.stamp`` gives it) as one packet of that pts,
        and whether it is a keyframe; None while the codec holds it back."""
        if frame.format.name != "yuv420p":
            frame = frame.reformat(format="yuv420p")
        c = self._codec
        if c is not None and (frame.width != c.width or frame.height != c.height
                              or abs(self._target - c.bit_rate) / c.bit_rate > 0.1):
            self._codec = c = None
            keyframe = True  # a new codec starts on one
        if c is None:
            self._codec = c = (_h264 if self.h264 else _vp8)(frame.width, frame.height, self._target)
        frame.pict_type = av.video.frame.PictureType.I if keyframe else av.video.frame.PictureType.NONE
        packets = list(c.encode(frame))
        if not packets:
            return None
        packet = packets[0] if len(packets) == 1 else av.Packet(b"".join(bytes(p) for p in packets))
        is_key = any(p.is_keyframe for p in packets)
        packet.pts, packet.time_base = frame.pts, VIDEO_TIME_BASE
        return packet, is_key
