"""``[[cameras]]``: one table per camera, its ``kind`` saying which source reads it (``edge_app.sources``).

``rtsp`` (the default, for configs written before kinds existed): an IP camera's ``rtsp://`` URL. ``file``: a
video file PyAV opens, looped at its own frame rate (to try the box on a recorded clip). ``demo``: the built-in
labelled frames, scored live. Adding a kind is one variant here and one module behind ``edge_app.sources``.
"""

from __future__ import annotations

from pathlib import Path
from typing import Annotated, Any, Literal

from pydantic import Discriminator, Field, Tag, field_validator

from edge_app.config.base import Section


def check_region(v: object) -> tuple[float, float, float, float]:
    """``[x, y, w, h]`` in fractions of the frame, inside it, at least 5 % of each side; ValueError otherwise."""
    if not isinstance(v, list | tuple) or len(v) != 4 or not all(
            isinstance(a, int | float) and not isinstance(a, bool) for a in v):
        raise ValueError("a region is [x, y, w, h]: four numbers, fractions of the frame's width and height")
    x, y, w, h = (float(a) for a in v)
    if not (0 <= x < 1 and 0 <= y < 1 and 0.05 <= w <= 1 and 0.05 <= h <= 1):
        raise ValueError(f"region {[x, y, w, h]}: x and y from 0 to 1, w and h from 0.05 to 1")
    if x + w > 1.0001 or y + h > 1.0001:
        raise ValueError(f"region {[x, y, w, h]} crosses the frame's edge (x + w and y + h must be at most 1)")
    return x, y, min(w, 1 - x), min(h, 1 - y)


class _Camera(Section):
    name: str = Field(pattern=r"^[A-Za-z0-9_-]{1,64}$", description="what browsers ask for")
    probe: bool = Field(False, description="read the frame counter a test source stamps into each frame")
    events: list[str] = Field(default_factory=list, description="labels that are events on this camera (the "
                              "gate's open, a parcel on the step); its other labels are states only")
    model: str | None = Field(None, pattern=r"^[A-Za-z0-9][A-Za-z0-9 _.-]{0,63}$", description="the model that "
                              "answers this camera: \"default\" ([model] path) or a version taught from the page "
                              "([training] models_dir; GET /api/models lists them); unset: the box's default model. "
                              "A model deployed on this camera from the page takes its place until rolled back")
    region: tuple[float, float, float, float] | None = Field(
        None, description="[x, y, w, h] in fractions of the frame: the part the classifier sees (the smallest "
        "square holding it) instead of the centre square; unset: the centre square")

    @field_validator("region")
    @classmethod
    def _region(cls, v: tuple[float, float, float, float] | None) -> tuple[float, float, float, float] | None:
        return None if v is None else check_region(v)


class _Reconnecting(_Camera):
    open_timeout_s: float = Field(5.0, gt=0, le=120, description="give up opening the stream after this long")
    read_timeout_s: float = Field(5.0, gt=0, le=120, description="a camera silent this long is reconnected")
    backoff_initial_s: float = Field(0.5, gt=0, le=60, description="first wait before reconnecting")
    backoff_max_s: float = Field(10.0, gt=0, le=600, description="longest wait between reconnects")


class RtspCameraConfig(_Reconnecting):
    kind: Literal["rtsp"] = "rtsp"
    url: str = Field(description="rtsp:// URL of the camera")
    transport: Literal["auto", "tcp", "udp"] = Field("auto", description="RTSP transport: auto tries TCP "
                                                     "(what cameras behind NAT need) and falls back to UDP when the "
                                                     "camera refuses TCP")

    @field_validator("url")
    @classmethod
    def _rtsp(cls, v: str) -> str:
        if not v.startswith(("rtsp://", "rtsps://")):
            raise ValueError("must be an rtsp:// or rtsps:// URL (for a video file use kind = \"file\" and path)")
        return v


class FileCameraConfig(_Reconnecting):
    kind: Literal["file"]
    path: Path = Field(description="a video file PyAV (FFmpeg) can open: .mp4, .mkv, .webm, .h264...; relative "
                       "to the config file; played at its own frame rate and looped")


class DemoCameraConfig(_Camera):
    kind: Literal["demo"]
    fps: float = Field(15.0, gt=0, le=60)
    hold_frames: int = Field(15, ge=1, le=1000, description="frames each labelled image is shown for")


def _kind(v: Any) -> str:
    kind = v.get("kind", "rtsp") if isinstance(v, dict) else getattr(v, "kind", "rtsp")
    return kind if kind in ("rtsp", "file", "demo") else "rtsp"  # an unknown kind: the rtsp variant names it


CameraConfig = Annotated[
    Annotated[RtspCameraConfig, Tag("rtsp")] | Annotated[FileCameraConfig, Tag("file")]
    | Annotated[DemoCameraConfig, Tag("demo")],
    Discriminator(_kind)]
