"""A built-in camera that loops labelled still images: the demo source a newcomer can pick on the page.

It is a ``streams.source.CameraSource``, so the hub treats it as any configured camera. Each image is held for
``hold`` frames at ``fps`` and upscaled to ``size`` for viewers; every ``SourceFrame`` carries the image's label
as ``truth``, so results can be scored live against it.
"""

from __future__ import annotations

import asyncio
import json
import time
from pathlib import Path
from typing import Any

import av
import cv2
import numpy as np

from streams.codecinfo import PacketSink
from streams.frames import LatestSlot, SourceFrame
from streams.source import common_status
from streams.tasks import cancel_and_wait


class DemoCamera:
    kind = "demo"
    labelled = True
    packet_sink: PacketSink | None = None  # nothing compressed to forward

    def __init__(self, name: str, folder: Path, fps: float = 15.0, hold: int = 15, size: int = 384) -> None:
        index = json.loads((folder / "labels.json").read_text())["frames"]
        self.images: list[np.ndarray] = []
        for item in index:
            bgr = cv2.imread(str(folder / item["file"]), cv2.IMREAD_COLOR)
            if bgr is None:
                raise FileNotFoundError(f"demo frame {folder / item['file']} is missing or unreadable")
            self.images.append(cv2.resize(cv2.cvtColor(bgr, cv2.COLOR_BGR2RGB), (size, size),
                                          interpolation=cv2.INTER_LINEAR))
        self.labels: list[str] = [str(item["label"]) for item in index]
        self.name, self.fps, self.hold = name, fps, hold
        self.safe_url = f"demo:{folder.name}"
        self.transport_in_use = "demo"  # made in this process
        self.state = "stopped"
        self.frames = self.reconnects = self.connects = 0
        self.last_error: str | None = None
        self.resolution: tuple[int, int] | None = (size, size)
        self.slot: LatestSlot[SourceFrame] | None = None
        self._task: asyncio.Task[None] | None = None

    def start(self) -> None:
        self.slot = LatestSlot()
        self._task = asyncio.get_running_loop().create_task(self._run(), name=f"demo-{self.name}")

    async def _run(self) -> None:
        assert self.slot is not None
        self.state, self.connects = "streaming", 1
        t0 = time.monotonic()
        while True:
            k = (self.frames // self.hold) % len(self.images)
            frame = av.VideoFrame.from_ndarray(self.images[k], format="rgb24")
            frame.pts = self.frames
            self.slot.put(SourceFrame(frame, self.frames, time.monotonic(), self.name, truth=self.labels[k]))
            self.frames += 1
            await asyncio.sleep(max(0.0, t0 + self.frames / self.fps - time.monotonic()))

    def status(self) -> dict[str, Any]:
        return {**common_status(self), "transport": "demo"}

    def forward_problem(self) -> str | None:
        return "the demo camera has no compressed stream to forward"

    async def stop(self) -> None:
        await cancel_and_wait(self._task)
        self._task = None
        if self.slot is not None:
            self.slot.close()
        self.state = "stopped"
