"""What a camera's compressed video is, and whether a browser can take it as it is (``passthrough_problem``)."""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import av

BROWSER_PROFILES = frozenset({"Constrained Baseline", "Baseline", "Main", "High"})
BROWSER_PIX_FMTS = frozenset({"yuv420p", "yuvj420p"})
MIN_KEYFRAMES = 2  # a whole keyframe interval seen without a B-frame before viewers are given the camera's own


@dataclass
class CodecInfo:
    """The camera's video stream as the last connection found it."""

    name: str  # FFmpeg's codec name: "h264", "hevc", "mjpeg", ...
    profile: str | None  # "Constrained Baseline", "Main", "High", ...
    pix_fmt: str | None
    extradata: bytes  # out-of-band parameter sets (for RTSP H.264: sprop-parameter-sets, Annex B)
    b_frames: bool = False  # a B-frame was decoded, or packets came out of presentation order
    keyframes: int = 0  # keyframes seen on this connection


#: called in the reader thread with each compressed packet (before it is decoded) and its arrival time
PacketSink = Callable[["av.Packet[Any]", CodecInfo, float], None]


def passthrough_problem(codec: CodecInfo | None) -> str | None:
    """Why this camera's own video cannot go to a browser as it is (None: it can)."""
    if codec is None:
        return "the camera has not streamed yet"
    if codec.name != "h264":
        return f"the camera sends {codec.name}, not H.264"
    if codec.profile is not None and codec.profile not in BROWSER_PROFILES:
        return f"H.264 {codec.profile} profile, which browsers do not decode over WebRTC"
    if codec.pix_fmt is not None and codec.pix_fmt not in BROWSER_PIX_FMTS:
        return f"pixel format {codec.pix_fmt}, not 4:2:0"
    if codec.b_frames:
        return "the camera sends B-frames (turn them off on the camera to forward its video)"
    if codec.keyframes < MIN_KEYFRAMES:
        return "not yet a whole keyframe interval seen (B-frames not ruled out)"
    return None
