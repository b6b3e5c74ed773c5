"""The video a peer gets back: its track, its rate control, and moving between the camera's own H.264 and encoded
annotated video.

The track is annotated and encoded for this viewer alone (``OutboundVideoTrack``), or fed by a ``VideoFanout``:
a camera's one encoder for all its viewers, or the camera's own H.264 (``CameraPassthrough``; the page draws the
overlay). Its bitrate and frame rate follow what the viewer's receiver reports and the data channel's pings say
about the path (``VideoRateController``): cut at once on loss or a queue, raised slowly.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Callable
from typing import Any

from edge_app.peer.monitor import NetworkMonitor
from edge_app.results import AnalysedFrame
from streams.aiortc_adapter import RtcpTaps, set_sender_target_bitrate, tap_rtcp_rtt
from streams.netstats import snapshot
from streams.passthrough import CameraPassthrough
from streams.ratecontrol import VideoRateController
from streams.shared_video import SharedVideoTrack, VideoFanout
from streams.webrtc import OutboundVideoTrack

log = logging.getLogger(__name__)


class OutboundVideo:
    def __init__(self, sid: str, transceiver: Any, monitor: NetworkMonitor, heard: Callable[[], None],
                 shared: VideoFanout | None, on_dropped: Callable[[], None] | None) -> None:
        self.id = sid
        self.sender = transceiver.sender
        self.monitor = monitor
        self.rate = VideoRateController()
        self.track: OutboundVideoTrack | SharedVideoTrack
        if shared is None:
            self.track = OutboundVideoTrack(on_dropped)
        else:
            self.track = SharedVideoTrack(shared)
            shared.join(self.track)
            self.rate.set_picture(*(shared.picture or (640, 480)))
        self.sender.replaceTrack(self.track)
        # the viewer's path cannot carry the camera's own bitrate: the hub moves it to an encoder that adapts
        self.on_congested: Callable[[], None] | None = None
        self._remb_bps: int | None = None
        self._sent_bps: float | None = None  # what the sender sent over the last second (its getStats)
        self._bytes_at: tuple[float, int] | None = None
        self._sent_at_poll = (time.monotonic(), 0)
        self._logged_bps = 1
        monitor.sends_video = True
        taps = RtcpTaps(on_loss=self._on_loss, on_remb_bps=self._on_remb, after=self.apply_rate,
                        on_keyframe_request=self._keyframe_requested)
        tap_rtcp_rtt(sender=self.sender, on_sample=lambda ms: monitor.rtt_sample(ms, "rtcp"), on_packet=heard,
                     taps=taps)

    @property
    def per_viewer(self) -> bool:
        """Annotated and encoded for this viewer alone: the pipeline must render for it."""
        return isinstance(self.track, OutboundVideoTrack)

    @property
    def passthrough(self) -> bool:
        return isinstance(self.track, SharedVideoTrack) and isinstance(self.track.encoder, CameraPassthrough)

    @property
    def picture(self) -> str:
        """What the video shows: "camera" (its own picture; the page draws the analysis), "annotated"."""
        return "camera" if self.passthrough else "annotated"

    def offer(self, af: AnalysedFrame) -> None:
        """A per-viewer track's next annotated frame."""
        if isinstance(self.track, OutboundVideoTrack) and af.i420 is not None:
            frame = af.video_frame()
            if self.rate.picture_bps is None:
                self.rate.set_picture(frame.width, frame.height)
            self.track.offer(frame)

    def leave_passthrough(self, encoder: VideoFanout, why: str) -> bool:
        """From the camera's own H.264 to annotated video from ``encoder`` (which follows the path's rate)."""
        if not self.passthrough or not isinstance(self.track, SharedVideoTrack):
            return False
        log.info("session %s: %s; sending annotated video instead of the camera's own", self.id, why)
        self.track.switch(encoder)
        return True

    # --- rate control --------------------------------------------------------------------------------------

    def _keyframe_requested(self) -> None:
        if isinstance(self.track, SharedVideoTrack):
            self.track.encoder.request_keyframe()

    def _on_remb(self, bitrate_bps: int) -> None:
        self._remb_bps = bitrate_bps

    def _on_loss(self, fraction: float) -> None:
        self.adapt(fraction, self.monitor.last_rtcp_rtt_ms)

    def adapt(self, loss_fraction: float, rtt_ms: float | None, probe_sent_s: float | None = None) -> None:
        """A receiver report, or a ping's RTT (answered or still waiting): the rate for the path now."""
        floor = snapshot(self.monitor.rtt, self.monitor.bitrate).rtt_low_ms
        rate = self.rate.update(time.monotonic(), loss_fraction, rtt_ms, floor, self._remb_bps, probe_sent_s,
                                self._sent_bps)
        if abs(rate.target_bps - self._logged_bps) >= 0.25 * self._logged_bps and not self.passthrough:
            self._logged_bps = rate.target_bps
            log.info("session %s: annotated video at %d kbit/s, %g fps, 1/%g size (loss %.0f %%, RTT %s ms)",
                     self.id, rate.target_bps // 1000, rate.max_fps, rate.scale_down, 100 * loss_fraction,
                     "?" if rtt_ms is None else f"{rtt_ms:.0f}")
        self.track.max_fps = rate.max_fps
        self.track.scale_down = rate.scale_down
        if self.passthrough and self.rate.cuts > 0 and self.on_congested is not None:
            self.on_congested()  # the camera's bitrate does not fit this path

    def apply_rate(self) -> None:
        if isinstance(self.track, SharedVideoTrack):  # its source encodes once for all: it takes the slowest
            self.track.set_target(self.rate.rate.target_bps)
        else:
            set_sender_target_bitrate(self.sender, self.rate.rate.target_bps)

    async def poll(self, now: float) -> None:
        """Each network poll: what the sender sent (bytes, frames) since the last."""
        t0, n0 = self._sent_at_poll
        self.monitor.frames_sent((self.track.sent - n0) / max(now - t0, 1e-3))
        self._sent_at_poll = (now, self.track.sent)
        last = self._bytes_at
        if last is not None and now - last[0] < 1.0:
            return
        stats = await self.sender.getStats()
        sent = next((int(s.bytesSent) for s in stats.values() if s.type == "outbound-rtp"), None)
        if sent is None:
            return
        if last is not None:
            self._sent_bps = 8.0 * (sent - last[1]) / (now - last[0])
        self._bytes_at = (now, sent)

    def status(self) -> dict[str, Any]:
        return {"picture": self.picture, "video_frames_sent": self.track.sent,
                "video_frames_dropped": self.track.dropped, "video_target_bps": self.rate.rate.target_bps,
                "video_scale_down": self.rate.rate.scale_down}

    def stop(self) -> None:
        self.track.stop()
