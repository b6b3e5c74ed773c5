"""Frames as a WebRTC peer sees them: a VP8 encode and decode round trip with PyAV's libvpx.

The live path never analyses the camera's own pixels: the browser encodes them
with VP8 at the bitrate congestion control allows, and the server analyses what
aiortc decodes.  ``vp8_roundtrip`` reproduces that offline (libvpx in real-time
mode, no look-ahead, keyframes only at the start, as a WebRTC sender runs it),
so calibration traces can be taken from frames like those the policy decides on
(``edge-app codec-traces``).
"""

from __future__ import annotations

from collections.abc import Iterable, Iterator
from fractions import Fraction
from typing import Any, cast

import av
import numpy as np


def _roundtrip(frames: Iterable[np.ndarray], kbps: float, fps: int, encoder: str, decoder: str, gop: int,
               options: dict[str, str]) -> Iterator[np.ndarray]:
    """Encode RGB frames (all of one size, even width and height) as one stream and yield exactly one decoded RGB
    frame per input frame, in order."""
    if kbps <= 0:
        raise ValueError(f"kbps must be positive, got {kbps}")
    enc: av.VideoCodecContext | None = None
    dec = cast(av.VideoCodecContext, av.CodecContext.create(decoder, "r"))

    def decoded(packets: list[av.Packet[Any]]) -> Iterator[np.ndarray]:
        for packet in packets:
            for frame in dec.decode(packet):
                yield frame.to_ndarray(format="rgb24")

    for pts, rgb in enumerate(frames):
        if enc is None:
            h, w = rgb.shape[:2]
            enc = cast(av.VideoCodecContext, av.CodecContext.create(encoder, "w"))
            enc.width, enc.height, enc.pix_fmt = w, h, "yuv420p"
            enc.framerate = Fraction(fps)
            enc.time_base = Fraction(1, fps)
            enc.bit_rate = int(kbps * 1000)
            enc.gop_size = gop
            enc.options = options
        frame = av.VideoFrame.from_ndarray(rgb, format="rgb24").reformat(format="yuv420p")
        frame.pts = pts
        yield from decoded(list(enc.encode(frame)))
    if enc is not None:
        yield from decoded(list(enc.encode(None)))
    if decoder == "h264":
        yield from decoded([None])  # type: ignore[list-item]  # H.264 holds frames back until flushed


def vp8_roundtrip(frames: Iterable[np.ndarray], kbps: float, fps: int = 30) -> Iterator[np.ndarray]:
    """Frames through VP8 as libwebrtc configures libvpx for real-time video: no look-ahead, CBR, speed -6 (a
    negative cpu-used fixes the speed; a positive one lets VP8 pick it from the wall clock, which makes the output
    depend on the machine's load), keyframes only at the start (a WebRTC sender sends them on request only)."""
    return _roundtrip(frames, kbps, fps, "libvpx", "libvpx", 3000, {
        "deadline": "realtime", "cpu-used": "-6", "lag-in-frames": "0", "error-resilient": "1", "auto-alt-ref": "0",
        "undershoot-pct": "100", "overshoot-pct": "15", "buf-initial-sz": "500", "buf-optimal-sz": "600",
        "buf-sz": "1000", "qmin": "2", "qmax": "56", "end-usage": "cbr"})


def h264_roundtrip(frames: Iterable[np.ndarray], kbps: float, fps: int = 30) -> Iterator[np.ndarray]:
    """The same with H.264 (libx264, as a camera or a WebRTC sender runs it: zero latency, no B-frames, a keyframe
    every 2 s)."""
    return _roundtrip(frames, kbps, fps, "libx264", "h264", 2 * fps,
                      {"preset": "veryfast", "tune": "zerolatency", "bf": "0", "threads": "1"})


ROUNDTRIPS = {"vp8": vp8_roundtrip, "h264": h264_roundtrip}
