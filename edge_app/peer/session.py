"""One browser peer, as rooms: its lifecycle (``lifecycle``), its network (``monitor``), the video it gets back
(``video``), its data channel (``channel``), and, when it sends its camera, the ingest (``edge_app.ingest``).

A session either analyses the browser's own camera (a video track in the offer, no camera asked for) or watches a
configured camera's shared analysis. Either way it gets video back on its outbound track (when its offer has a
video m-line on which it receives) and one JSON result per frame on the data channel the browser opened (when it
opened one). The hub wires it (``edge_app.doors.signalling``); the session never reaches back into the hub.
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import Awaitable, Callable
from dataclasses import dataclass
from typing import Any

from aiortc import RTCDataChannel, RTCPeerConnection

from edge_app import protocol
from edge_app.config import BudgetConfig
from edge_app.ingest import BrowserIngest
from edge_app.peer.channel import ResultChannel
from edge_app.peer.lifecycle import Lifecycle
from edge_app.peer.monitor import NetworkMonitor
from edge_app.peer.video import OutboundVideo
from edge_app.pipeline import AnalysisPipeline
from edge_app.results import AnalysedFrame
from streams.aiortc_adapter import receiver_bitrate_estimate_bps, sender_target_bitrate_bps
from streams.shared_video import VideoFanout
from streams.tasks import cancel_and_wait

POLL_S = 0.25  # how often the RTCP-derived estimates are read (and a ping sent)
SourceState = Callable[[], protocol.Source]  # a watched camera's state, reason already redacted


@dataclass(frozen=True)
class Asked:
    """What the offer asked for."""

    camera: str | None = None  # a configured camera to watch; None: analyse the browser's own
    probe: bool = False  # read the frame counter a probe client stamps into each frame
    full_results: bool = False  # every field on every result
    picture: str = "annotated"  # "camera": the camera's own H.264 where it can go as it is (the page draws)
    model: str | None = None  # the model for the browser's own camera; None: the box's default


@dataclass(frozen=True)
class Hooks:
    """What a session tells the rest of the app."""

    on_closed: Callable[[PeerSession, str | None], Awaitable[None]]
    on_result_dropped: Callable[[], None]
    on_video_dropped: Callable[[], None] | None = None
    source_state: SourceState | None = None


class PeerSession:
    def __init__(self, sid: str, pc: RTCPeerConnection, asked: Asked, budget: BudgetConfig, class_names: list[str],
                 hooks: Hooks, peer_timeout_s: float = 10.0, connect_timeout_s: float = 15.0) -> None:
        self.id = sid
        self.pc = pc
        self.asked = asked
        self.camera = asked.camera
        self.hooks = hooks
        self.life = Lifecycle(sid, pc, connect_timeout_s, peer_timeout_s, self.close)
        self.monitor = NetworkMonitor(budget)
        self.channel = ResultChannel(sid, self.monitor, class_names, asked.full_results, hooks.on_result_dropped,
                                     self.life.heard)
        self.channel.on_pong = self._pong
        self.video: OutboundVideo | None = None
        self.ingest: BrowserIngest | None = None
        self.watched: AnalysisPipeline | None = None
        self.close_reason: str | None = None
        self._tasks: list[asyncio.Task[Any]] = []
        pc.on("datachannel", self.attach_channel)
        pc.on("connectionstatechange", self.life.on_connection_state)
        pc.on("iceconnectionstatechange", self.life.on_ice_state)

    @property
    def created_s(self) -> float:
        return self.life.created_s

    # --- wiring (by the hub, once) -------------------------------------------------------------------------

    def attach_video(self, transceiver: Any, shared: VideoFanout | None) -> OutboundVideo:
        self.video = OutboundVideo(self.id, transceiver, self.monitor, self.life.heard, shared,
                                   self.hooks.on_video_dropped)
        return self.video

    def attach_ingest(self, ingest: BrowserIngest) -> None:
        self.ingest = ingest
        self.watch(ingest.pipeline)
        ingest.start()

    def attach_channel(self, channel: RTCDataChannel) -> None:
        self.channel.attach(channel)

    def watch(self, pipeline: AnalysisPipeline) -> None:
        """Get ``pipeline``'s results (and its annotated frames, when this session's video is its own)."""
        self.watched = pipeline
        pipeline.subscribe(self._on_output, video=self.video is not None and self.video.per_viewer)

    def _on_output(self, af: AnalysedFrame) -> None:
        if self.video is not None:
            self.video.offer(af)
        self.channel.on_output(af)

    def start(self) -> None:
        """Start the connect timer at once (the offer is being answered) and the network poll."""
        self._tasks.append(asyncio.create_task(self.life.watch_connect(), name=f"connect-{self.id}"))
        self._tasks.append(asyncio.create_task(self._poll(), name=f"netpoll-{self.id}"))

    # --- the network, four times a second -------------------------------------------------------------------

    def _pong(self, rtt_ms: float, sent: float) -> None:
        if self.video is not None:  # the pong crossed the same queues as our video: a queue shows here first
            self.video.adapt(0.0, rtt_ms, sent)
            self.video.apply_rate()

    async def _poll(self) -> None:
        while True:
            await asyncio.sleep(POLL_S)
            now = time.monotonic()
            if self.video is not None:
                target = sender_target_bitrate_bps(self.video.sender)
                if target is not None:
                    self.monitor.target_bitrate(target)
                await self.video.poll(now)
                self.channel.report(protocol.Video("camera" if self.video.passthrough else "annotated"))
            for t in self.pc.getTransceivers():
                if t.kind == "video" and t.receiver.track is not None:
                    self.monitor.receive_estimate_bps = receiver_bitrate_estimate_bps(t.receiver)
            if self.hooks.source_state is not None:
                self.channel.report(self.hooks.source_state())
            if self.ingest is not None:
                self.ingest.watch_stall(now, self.life.connected, self.pc)
            if not self.life.alive(now):
                return
            sent = self.monitor.oldest_unanswered()
            if sent is not None and self.video is not None:
                # a ping still unanswered is a lower bound on the RTT, and it comes before its pong: a queue that
                # builds up behind our video shows here within a poll
                self.video.adapt(0.0, (now - sent) * 1e3, sent)
                self.video.apply_rate()
            if self.channel.open:
                ping = self.monitor.next_ping(now)
                if ping is not None:
                    self.channel.send(ping)
            self.monitor.publish()

    # --- status and shutdown -------------------------------------------------------------------------------

    def status(self) -> dict[str, Any]:
        life, video = self.life, self.video
        return {
            "id": self.id, "state": self.pc.connectionState, "ice_state": self.pc.iceConnectionState,
            "connected_after_s": None if life.connected_after_s is None else round(life.connected_after_s, 2),
            "camera": self.camera, "sends_video": self.ingest is not None, "receives_video": video is not None,
            "picture": None if video is None else video.picture,
            "age_s": round(time.monotonic() - life.created_s, 1),
            **self.monitor.status(), **self.channel.status(),
            **(video.status() if video else {"video_frames_sent": 0, "video_frames_dropped": 0,
                                             "video_target_bps": None, "video_scale_down": None}),
            **(self.ingest.status() if self.ingest else {"uplink_level": 0, "frames_analysed": None,
                                                         "frames_rendered": None, "frames_dropped_stale": None,
                                                         "answers": None, "exit0": None}),
            "timed_out": life.timed_out,
        }

    async def close(self, reason: str | None = None) -> None:
        """Close everything this session holds; ``reason`` (one of ``lifecycle.CLOSE_REASONS``, None for an offer
        that was refused) goes to ``on_closed``. Safe to call more than once: the first call's reason counts."""
        if self.life.closing:
            return
        self.life.closing = True
        self.close_reason = reason
        if self.watched is not None:
            self.watched.unsubscribe(self._on_output)
        await cancel_and_wait(*self._tasks)
        if self.ingest is not None:
            await self.ingest.stop()
        if self.video is not None:
            self.video.stop()
        await self.pc.close()
        await self.hooks.on_closed(self, reason)
