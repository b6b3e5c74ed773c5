"""One encoder for every viewer of a source: a camera's annotated video is encoded once, whoever watches.

``SharedEncoder`` encodes each annotated frame once (``streams.encoders.PacketEncoder``, for the codec the viewers
negotiated: VP8 or H.264) and hands the same ``av.Packet`` to each viewer's ``SharedVideoTrack``; aiortc's public
path for pre-encoded media then has each viewer's sender only packetise it, so adding a viewer costs
packetisation, not an encode. A keyframe request from any viewer (PLI/FIR, or a new viewer joining) reaches the
shared encoder. The encoder's bitrate and frame rate follow the slowest viewer (one encode cannot suit two paths;
each viewer's rate controller still measures its own path and sets its track's ``target_bps``).

A viewer whose sender falls behind never gets a stream with holes: past ``MAX_QUEUED`` chunks its queue is
emptied and a keyframe is asked for, so it starts again cleanly. A viewer starts, and starts again, on a keyframe.

``VideoFanout`` is what a viewer's track sees of its source: ``SharedEncoder`` here, and
``streams.passthrough.CameraPassthrough``, which forwards a camera's own H.264 with no encode at all.
"""

from __future__ import annotations

import asyncio
import logging
from collections import deque
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import av
from aiortc.mediastreams import MediaStreamError, MediaStreamTrack
from aiortc.rtcrtpparameters import RTCRtpCodecParameters

from streams.encoders import PacketEncoder
from streams.pacer import VideoPacer

log = logging.getLogger(__name__)

MAX_QUEUED = 8


@dataclass(frozen=True)
class EncodedChunk:
    """One encoded frame as a packet (its pts on the 90 kHz clock), and whether a decoder can start on it."""

    packet: av.Packet[Any]
    keyframe: bool = False


class SharedVideoTrack(MediaStreamTrack):
    kind = "video"

    def __init__(self, encoder: VideoFanout) -> None:
        super().__init__()
        self.encoder = encoder
        self._queue: deque[EncodedChunk] = deque()
        self._ready = asyncio.Event()
        self._need_keyframe = True  # a decoder can start only on one
        self.sent = 0
        self.dropped = 0
        self.max_fps = 30.0  # set by this viewer's rate controller; the encoder takes the lowest
        self.scale_down = 1.0
        self.target_bps: int | None = None  # set by this viewer's rate controller; the encoder takes the lowest

    def offer_chunk(self, chunk: EncodedChunk) -> None:
        if len(self._queue) >= MAX_QUEUED:  # behind: start again from a keyframe rather than send a broken stream
            self.dropped += len(self._queue)
            self._queue.clear()
            self._need_keyframe = True
            self.encoder.request_keyframe()
        if self._need_keyframe and not chunk.keyframe:
            self.dropped += 1
            return
        self._need_keyframe = False
        self._queue.append(chunk)
        self._ready.set()

    async def recv(self) -> av.Packet[Any]:
        while not self._queue:
            if self.readyState != "live":
                raise MediaStreamError
            self._ready.clear()
            await self._ready.wait()
        self.sent += 1
        return self._queue.popleft().packet

    def set_target(self, bps: int) -> None:
        """This viewer's path takes ``bps``: its source encodes for the slowest of its viewers."""
        self.target_bps = int(bps)
        self.encoder.retarget()

    def switch(self, source: VideoFanout) -> None:
        """Take chunks from ``source`` from now on (its sender, already waiting on this track, carries on), starting
        on its next keyframe. A sender cannot change tracks mid-stream: aiortc stops sending when the track it
        waits on ends."""
        old, self.encoder = self.encoder, source
        self._queue.clear()
        self._need_keyframe = True
        old.remove(self)
        source.join(self)
        source.retarget()

    def stop(self) -> None:
        self.encoder.remove(self)
        super().stop()
        self._ready.set()


class VideoFanout:
    """One source of encoded video for many viewers' tracks: who watches, their senders' targets, keyframes."""

    def __init__(self, name: str, codec: RTCRtpCodecParameters) -> None:
        self.name = name
        self.codec = codec
        self.viewers: set[SharedVideoTrack] = set()
        self.keyframes_requested = 0
        self.target_bps: int | None = None
        self.picture: tuple[int, int] | None = None  # the frames' full size, once one came
        self.on_empty: Callable[[], None] | None = None  # the last viewer left

    def join(self, track: SharedVideoTrack) -> None:
        """``track`` watches from now on, starting on a keyframe."""
        self.viewers.add(track)
        self.request_keyframe()

    def remove(self, track: SharedVideoTrack) -> None:
        self.viewers.discard(track)
        if not self.viewers and self.on_empty is not None:
            self.on_empty()

    def request_keyframe(self) -> None:
        self.keyframes_requested += 1

    def retarget(self) -> None:
        targets = [t.target_bps for t in self.viewers if t.target_bps]
        self.target_bps = min(targets) if targets else None

    @property
    def max_fps(self) -> float:
        return min((t.max_fps for t in self.viewers), default=30.0)

    def _offer(self, chunk: EncodedChunk) -> None:
        for track in list(self.viewers):
            track.offer_chunk(chunk)


class SharedEncoder(VideoFanout):
    """The one encoder of a source's annotated video for one codec; ``encode(frame)`` from the pipeline."""

    def __init__(self, name: str, codec: RTCRtpCodecParameters, executor: Any = None) -> None:
        super().__init__(name, codec)
        self._encoder = PacketEncoder(codec.mimeType)
        self._executor = executor
        self.encoded = 0  # frames encoded (once each, whatever the number of viewers)
        self._force_keyframe = True
        self._pacer = VideoPacer()
        self._busy = False
        self._pending: av.VideoFrame | None = None

    def request_keyframe(self) -> None:
        super().request_keyframe()
        self._force_keyframe = True

    def retarget(self) -> None:
        super().retarget()
        if self.target_bps is not None:
            self._encoder.target_bitrate = self.target_bps

    async def encode(self, frame: av.VideoFrame) -> None:
        """Encode ``frame`` once (off the event loop) and queue its payloads for every viewer. A frame that comes
        while the last is still being encoded waits (the newest one only) and goes next; frames over the slowest
        viewer's frame rate are skipped (``VideoPacer.admit``)."""
        if not self.viewers or not self._pacer.admit(self.max_fps):
            return
        if self._busy:
            self._pending = frame  # the newest waits for the encoder; an older one waiting is replaced
            return
        self._busy = True
        try:
            next_frame: av.VideoFrame | None = frame
            while next_frame is not None:
                await self._encode_one(next_frame)
                next_frame, self._pending = self._pending, None
        finally:
            self._busy = False

    async def _encode_one(self, frame: av.VideoFrame) -> None:
        self.picture = (frame.width, frame.height)
        frame = self._pacer.stamp(frame, min((t.scale_down for t in self.viewers), default=1.0))
        keyframe, self._force_keyframe = self._force_keyframe, False
        out = await asyncio.get_running_loop().run_in_executor(self._executor, self._encoder.encode, frame, keyframe)
        if out is None:
            self._force_keyframe = self._force_keyframe or keyframe  # the keyframe asked for is still owed
            return
        self.encoded += 1
        self._offer(EncodedChunk(*out))
