"""WebRTC media edges: read a remote track with latest-frame semantics, send annotated frames back.

* ``TrackReader`` pulls every frame from an aiortc remote track as soon as
  aiortc has decoded it (so aiortc's own unbounded queue never grows) and
  ``put``s it into a ``LatestSlot``: a slow analyser drops stale frames, it
  never falls behind.
* ``OutboundVideoTrack`` is the track we send: ``offer(frame)`` hands it the
  newest annotated frame, ``recv()`` (called by aiortc's encoder loop) takes
  the newest one, re-stamped on a 90 kHz clock.  Frames the encoder had no
  time for are dropped and counted.
"""

from __future__ import annotations

import asyncio
import logging
import time
from collections.abc import Callable
from typing import Any

import av
from aiortc import MediaStreamTrack
from aiortc.mediastreams import MediaStreamError

from streams.frames import LatestSlot, SlotClosed, SourceFrame
from streams.pacer import VideoPacer
from streams.tasks import cancel_and_wait

log = logging.getLogger(__name__)



class TrackReader:
    """Drains ``track`` into ``slot`` until the track ends; ``start()`` / ``await stop()``."""

    def __init__(self, track: Any, slot: LatestSlot[SourceFrame], source: str,
                 on_frame: Callable[[], None] | None = None) -> None:
        self.track = track
        self.slot = slot
        self.source = source
        self.on_frame = on_frame  # told of every frame (the peer is alive)
        self.received = 0
        self._task: asyncio.Task[None] | None = None

    def start(self) -> None:
        self._task = asyncio.create_task(self._run(), name=f"track-reader-{self.source}")

    async def _run(self) -> None:
        try:
            while True:
                frame = await self.track.recv()
                self.slot.put(SourceFrame(frame, self.received, time.monotonic(), self.source))
                if self.on_frame is not None:
                    self.on_frame()
                self.received += 1
        except MediaStreamError:
            log.info("%s: the remote video track ended after %d frames", self.source, self.received)
        finally:
            self.slot.close()

    async def stop(self) -> None:
        await cancel_and_wait(self._task)
        self._task = None
        self.slot.close()


class OutboundVideoTrack(MediaStreamTrack):
    """The annotated video we send; fed with ``offer(frame)``, latest frame only."""

    kind = "video"

    def __init__(self, on_drop: Callable[[], None] | None = None) -> None:
        super().__init__()
        self._slot: LatestSlot[av.VideoFrame] = LatestSlot()
        self._slot.on_drop = on_drop
        self._pacer = VideoPacer()
        self.max_fps = 30.0  # a narrow path gets fewer frames, not a queue (set by the rate controller)
        self.scale_down = 1.0  # ... and smaller ones
        self.sent = 0

    @property
    def dropped(self) -> int:
        return self._slot.dropped

    def offer(self, frame: av.VideoFrame) -> None:
        """Queue ``frame`` unless it is over ``max_fps`` (``VideoPacer.admit``)."""
        if not self._pacer.admit(self.max_fps):
            self._slot.drop()  # over the frame rate the path allows: dropped here, counted
            return
        self._slot.put(frame)

    async def recv(self) -> av.VideoFrame:
        try:
            frame = await self._slot.get()
        except SlotClosed:
            self.stop()
            raise MediaStreamError from None
        self.sent += 1
        return self._pacer.stamp(frame, self.scale_down)

    def stop(self) -> None:
        self._slot.close()
        super().stop()
