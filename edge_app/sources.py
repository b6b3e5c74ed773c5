"""``[[cameras]]`` (and ``[demo]``) -> the ``CameraSource`` that reads each: one line per kind.

Adding a kind is a module in ``streams/`` with a ``CameraSource`` in it, a variant in
``edge_app.config.cameras`` and a line here.
"""

from __future__ import annotations

from pathlib import Path

from edge_app.config import AppConfig, DemoConfig
from edge_app.config.cameras import CameraConfig, DemoCameraConfig, FileCameraConfig, RtspCameraConfig
from streams.demo import DemoCamera
from streams.filecam import FileCamera
from streams.rtsp import Backoff, RtspCamera
from streams.source import CameraSource

DEMO_FRAMES = Path(__file__).parent / "demo"  # labelled frames of the demo test split (labels.json)


def open_source(c: CameraConfig, config: AppConfig) -> CameraSource:
    """The source for one ``[[cameras]]`` table (not started)."""
    if isinstance(c, RtspCameraConfig):
        return RtspCamera(c.name, c.url, c.transport, c.open_timeout_s, c.read_timeout_s,
                          Backoff(c.backoff_initial_s, c.backoff_max_s))
    if isinstance(c, FileCameraConfig):
        return FileCamera(c.name, config.resolve(c.path), c.open_timeout_s, c.read_timeout_s,
                          Backoff(c.backoff_initial_s, c.backoff_max_s))
    assert isinstance(c, DemoCameraConfig)
    return DemoCamera(c.name, DEMO_FRAMES, c.fps, c.hold_frames)


def configured(config: AppConfig) -> list[tuple[CameraConfig, CameraSource]]:
    """Every camera the config names, ``[demo] enabled`` as one more of kind ``demo``."""
    cams: list[CameraConfig] = list(config.cameras)
    if config.demo.enabled:
        cams.append(_demo(config.demo))
    return [(c, open_source(c, config)) for c in cams]


def _demo(d: DemoConfig) -> DemoCameraConfig:
    return DemoCameraConfig(kind="demo", name=d.name, fps=d.fps, hold_frames=d.hold_frames)
