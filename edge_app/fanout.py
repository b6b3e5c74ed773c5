"""Where a camera viewer's video comes from: the camera's own H.264 (forwarded, no transcode), the camera's one
encoder of annotated video for all its viewers, or (``share_camera_encoder = false``) an encoder of its own.

A viewer that asked for the camera's own picture (``"video": "camera"``: the page draws the analysis) gets it
where the camera's stream can go to a browser as it is (``streams.codecinfo.passthrough_problem``), and moves to
annotated video when its path congests at the camera's bitrate or the camera's stream changes (B-frames, another
codec). An encoder with no viewer left stops rendering and encoding for nobody.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Callable
from concurrent.futures import Executor
from typing import Any

from edge_app import protocol
from edge_app.config import ServerConfig
from edge_app.peer.session import PeerSession
from edge_app.registry import PipelineRegistry
from edge_app.results import AnalysedFrame
from streams.aiortc_adapter import negotiated_codec
from streams.passthrough import CameraPassthrough
from streams.shared_video import SharedEncoder
from streams.source import CameraSource

log = logging.getLogger(__name__)


class CameraVideo:
    def __init__(self, server: ServerConfig, sources: dict[str, CameraSource], registry: PipelineRegistry,
                 media: Executor, viewers: Callable[[str], list[PeerSession]]) -> None:
        self.server = server
        self.sources = sources
        self.registry = registry
        self.media = media
        self.viewers = viewers  # a camera's open sessions
        self.encoders: dict[tuple[str, str], SharedEncoder] = {}  # (camera, codec): one for all its viewers
        self.passthroughs: dict[str, CameraPassthrough] = {}  # camera: its own H.264 to the viewers who draw
        self._encodes: set[asyncio.Future[None]] = set()

    def forward_problem(self, camera: str) -> str | None:
        """Why the camera's own video cannot go to its viewers as it is (None: it can)."""
        if not self.server.camera_passthrough:
            return "[server] camera_passthrough is off"
        return self.sources[camera].forward_problem()

    def attach(self, session: PeerSession, camera: str, transceiver: Any, forward: bool) -> None:
        """Video back to ``session`` on ``transceiver``: the camera's own H.264 when ``forward`` (the answer plan put
        H.264 first because the viewer draws the analysis and the camera's stream can go as it is), else the
        camera's shared encoder (None: an encoder of the viewer's own)."""
        if forward:
            video = session.attach_video(transceiver, self._passthrough(camera, transceiver))
            video.on_congested = lambda: self.leave_passthrough(session, "its path is congested at the camera's "
                                                                         "own bitrate")
            return
        if session.asked.picture == "camera":
            log.info("session %s: annotated video of camera %s, not its own: %s", session.id, camera,
                     self.forward_problem(camera) or "the viewer did not offer H.264")
        shared = self._shared_encoder(camera, transceiver) if self.server.share_camera_encoder else None
        session.attach_video(transceiver, shared)

    def _passthrough(self, camera: str, transceiver: Any) -> CameraPassthrough:
        cam = self.sources[camera]
        pt = self.passthroughs.get(camera)
        if pt is None:
            pt = self.passthroughs[camera] = CameraPassthrough(f"{camera}/H264", negotiated_codec(transceiver),
                                                               asyncio.get_running_loop())
            pt.on_empty = lambda: self._drop_passthrough(camera)
            pt.on_unfit = lambda why: self._unfit(camera, why)
            cam.packet_sink = pt.on_packet
            log.info("camera %s: forwarding its own H.264 to the viewers who draw the analysis (no transcode)", camera)
        pt.picture = cam.resolution
        return pt

    def _drop_passthrough(self, camera: str) -> None:
        if self.passthroughs.pop(camera, None) is not None:
            self.sources[camera].packet_sink = None

    def leave_passthrough(self, session: PeerSession, why: str) -> None:
        video, camera = session.video, session.camera
        if video is None or camera is None or not video.passthrough:
            return
        transceiver = next(t for t in session.pc.getTransceivers() if t.sender is video.sender)
        own = None if self.server.share_camera_encoder else session.id
        if video.leave_passthrough(self._shared_encoder(camera, transceiver, own), why):
            session.channel.report(protocol.Video("annotated"))

    def _unfit(self, camera: str, why: str) -> None:
        """The camera's stream changed (B-frames, another codec): its viewers get annotated video instead."""
        for session in self.viewers(camera):
            self.leave_passthrough(session, why)

    def _shared_encoder(self, camera: str, transceiver: Any, viewer: str | None = None) -> SharedEncoder:
        """The one encoder of ``camera``'s annotated video for the codec this viewer negotiated: the camera's
        pipeline renders and it encodes each frame once, for every viewer (``streams.shared_video``). ``viewer``:
        an encoder for that session alone (a viewer leaving passthrough while ``share_camera_encoder`` is off)."""
        codec = negotiated_codec(transceiver)
        key = (camera, codec.mimeType.lower() + (f"/{viewer}" if viewer else ""))
        enc = self.encoders.get(key)
        if enc is None:
            enc = self.encoders[key] = SharedEncoder(f"{camera}/{codec.mimeType}", codec, self.media)
            pipe = self.registry.camera(camera)

            def feed(af: AnalysedFrame, enc: SharedEncoder = enc) -> None:
                if af.i420 is not None and enc.viewers:
                    task = asyncio.ensure_future(enc.encode(af.video_frame()))
                    self._encodes.add(task)
                    task.add_done_callback(self._encodes.discard)

            pipe.subscribe(feed, video=True)
            enc.on_empty = lambda: self._drop_encoder(key, feed)
            log.info("camera %s: one %s encoder for all its video viewers", camera, codec.mimeType)
        return enc

    def _drop_encoder(self, key: tuple[str, str], feed: Callable[[AnalysedFrame], None]) -> None:
        """The last viewer left: stop rendering and encoding for nobody."""
        if self.encoders.pop(key, None) is not None:
            self.registry.camera(key[0]).unsubscribe(feed)

    def status(self, camera: str) -> dict[str, Any]:
        problem = self.forward_problem(camera)
        pt = self.passthroughs.get(camera)
        return {
            "passthrough": {"possible": problem is None, "reason": problem,
                            **(pt.status() if pt else {"viewers": 0})},
            "encoders": [{"codec": e.codec.mimeType, "viewers": len(e.viewers), "frames_encoded": e.encoded,
                          "keyframes_requested": e.keyframes_requested, "target_bps": e.target_bps}
                         for (name, _), e in self.encoders.items() if name == camera],
        }

