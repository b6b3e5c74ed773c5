"""A video file as a camera: opened with PyAV, played at its own frame rate, looped (``[[cameras]] kind = "file"``).

Users try the box on a recorded clip of their own scene before they point it at the camera. It is an
``RtspCamera`` in every other way (the reader thread, the slot, the state, the status, the compressed packets for
forwarding an H.264 file's own video): only opening, pacing and the end of the stream differ.
"""

from __future__ import annotations

import time
from pathlib import Path
from typing import Any

import av

from streams.rtsp import Backoff, RtspCamera


class FileCamera(RtspCamera):
    kind = "file"

    def __init__(self, name: str, path: Path, open_timeout_s: float = 5.0, read_timeout_s: float = 5.0,
                 backoff: Backoff | None = None) -> None:
        super().__init__(name, str(path), "tcp", open_timeout_s, read_timeout_s, backoff)
        self.path = path
        self.url = str(path)
        self.safe_url = f"file:{path.name}"
        self.transport = self.transport_in_use = "file"
        self.loops = 0  # times the file was played to its end
        self._clock: tuple[float, float] | None = None  # (monotonic start, first packet time) of this play

    def status(self) -> dict[str, Any]:
        return {**super().status(), "loops": self.loops}

    def _open(self) -> Any:
        self._clock = None
        return av.open(str(self.path))

    def _pace(self, packet: Any) -> None:
        """Hold each packet until its decode time comes, counted from the first one of this play: the file plays
        at its own frame rate, as a camera would send it."""
        ts = packet.dts if packet.dts is not None else packet.pts
        if ts is None or packet.time_base is None:
            return
        t = float(ts * packet.time_base)
        now = time.monotonic()
        if self._clock is None:
            self._clock = (now, t)
            return
        due = self._clock[0] + (t - self._clock[1])
        if due > now:
            self._stop.wait(min(due - now, 1.0))

    def _ended(self) -> bool:
        self.loops += 1
        return True
