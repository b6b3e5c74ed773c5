"""One browser peer: its RTCPeerConnection, what it sends and watches, its network estimate, its outputs.

A session either analyses the browser's own camera (a video track in the
offer, no ``camera`` asked for) or watches a configured camera's shared
analysis.  Either way it gets the annotated video on its outbound track
(when its offer has a video m-line) and one JSON result per frame on the
data channel the browser opened (when it opened one).

Lifecycle: a session that has not connected ``connect_timeout_s`` after its
offer is closed (``connect-timeout``); ICE failing closes it at once
(``ice-failed``); a peer that stops answering pings is closed after
``peer_timeout_s`` (``peer-gone``): nothing at all arrived from it, no
data-channel message, no RTCP, no video frame (a slow path whose pongs come
back late is not a vanished peer); a peer that closes is ``closed``.  The
reason goes to ``on_closed`` once, whoever asks first.

Network estimate: RTT samples from each RTCP receiver report on the video we
send back (``streams.aiortc_adapter.tap_rtcp_rtt``, about one a second) and
from ping/pong messages on the data channel (four a second, so a step in the
path's delay is seen within half a second), into one ``RttEstimator``;
bitrate from the REMB-driven encoder target.  Until the first sample the
configured priors are used.
"""

from __future__ import annotations

import asyncio
import json
import logging
import time
from collections.abc import Awaitable, Callable
from typing import Any

from aiortc import RTCDataChannel, RTCPeerConnection, RTCRtpSender

from edge_app.budget import expected_frame_bytes
from edge_app.config import BudgetConfig
from edge_app.pipeline import AnalysisPipeline
from edge_app.results import AnalysedFrame, NetworkView
from streams.aiortc_adapter import (
    RtcpTaps,
    jitter_buffer_state,
    receiver_bitrate_estimate_bps,
    sender_target_bitrate_bps,
    set_sender_target_bitrate,
    tap_rtcp_rtt,
)
from streams.netstats import BitrateEstimator, RttEstimator, snapshot
from streams.passthrough import CameraPassthrough
from streams.ratecontrol import UplinkController, VideoRateController
from streams.redact import redact
from streams.shared_video import SharedVideoTrack, VideoFanout
from streams.webrtc import OutboundVideoTrack, TrackReader

log = logging.getLogger(__name__)

POLL_S = 0.25  # how often the RTCP-derived estimates are read (and a ping sent)
PING_S = 0.25  # data-channel ping interval: RTT samples between receiver reports (about one a second)
# results beyond this much waiting in the data channel are dropped (and counted), not queued: ~1 s of compact results
# at 30 fps, half a second at 250 kbit/s. A late result is no use, and a long queue keeps every later one late too
MAX_BUFFERED_BYTES = 16 * 1024
MAX_MESSAGE_BYTES = 4096  # the client sends only small control messages
JSON_RESULT_BYTES = 600.0  # what one result costs on the wire (compact, with SCTP), for data-channel-only viewers
DETAIL_EVERY_S = 1.0  # a full result (every field) this often; the others are compact
CLOSE_REASONS = ("connect-timeout", "ice-failed", "dtls-failed", "peer-gone", "closed", "shutdown")
CONNECT_HINT = ("no network path between the browser and this box: for a browser on the same machine set [server] "
                "ice_host_addresses = [\"127.0.0.1\"]; for other machines serve HTTPS (tls_cert, tls_key) on an "
                "address they reach, or add a TURN server to [server] ice_servers")
SourceState = Callable[[], tuple[str, str | None]]  # a watched camera's (state, reason), reason already redacted


class PeerSession:
    def __init__(self, sid: str, pc: RTCPeerConnection, budget: BudgetConfig, class_names: list[str],
                 camera: str | None, probe: bool, on_result_dropped: Callable[[], None],
                 on_closed: Callable[[PeerSession, str | None], Awaitable[None]],
                 on_video_dropped: Callable[[], None] | None = None, peer_timeout_s: float = 10.0,
                 connect_timeout_s: float = 15.0, source_state: SourceState | None = None,
                 full_results: bool = False) -> None:
        self.id = sid
        self.pc = pc
        self.camera = camera
        self.probe = probe
        self.class_names = class_names
        self.created_s = time.monotonic()
        self.rtt = RttEstimator(budget.rtt_prior_ms)
        self.bitrate = BitrateEstimator(budget.bitrate_prior_kbps * 1e3)
        self.rtt_sources: set[str] = set()  # what has given RTT samples: "rtcp", "datachannel"
        self.receive_estimate_bps: int | None = None
        self.outbound: OutboundVideoTrack | SharedVideoTrack | None = None  # shared: a camera's one encoder
        # when the camera's own H.264 goes to this viewer and its path congests: the hub moves it to an encoder
        self.on_passthrough_congested: Callable[[PeerSession], None] | None = None
        self._picture_sent: str | None = None
        self.video_sender: RTCRtpSender | None = None
        self.channel: RTCDataChannel | None = None
        self.own_pipeline: AnalysisPipeline | None = None  # analyses this browser's camera
        self.reader: TrackReader | None = None  # feeds own_pipeline
        self.watched: AnalysisPipeline | None = None  # the pipeline whose output this session gets
        self.results_sent = 0
        self.results_not_sent = 0  # the data channel was not open or its buffer was full
        self.bad_messages = 0
        self.timed_out = False
        self._fps = 0.0
        self._sent_at_poll = (self.created_s, 0)
        self._pings: dict[int, float] = {}
        self.peer_timeout_s = peer_timeout_s
        self.connect_timeout_s = connect_timeout_s
        self.full_results = full_results  # every field on every result (the offer asked: "results": "full")
        self.video_rate: VideoRateController | None = None  # the annotated video's rate, when video goes back
        self.uplink = UplinkController()  # what the browser is asked to send, when it sends its camera
        self._last_rtcp_rtt_ms: float | None = None
        self._remb_bps: int | None = None
        self._sent_bps: float | None = None  # what the video sender sent over the last second (getStats)
        self._bytes_at: tuple[float, int] | None = None
        self._logged_video_bps = 1
        self._received_at, self._received_change_s = 0, time.monotonic()
        self._stalled_since: float | None = None
        self._detail_sent_s = 0.0
        self.connected_after_s: float | None = None
        self.close_reason: str | None = None
        self.send_errors = 0
        self._source_state = source_state
        self._source_sent: tuple[str, str | None] | None = None
        self._last_heard: float | None = None  # last time anything arrived from the peer (message, RTCP, frame)
        self._closer: asyncio.Task[None] | None = None
        self._ping_id = 0
        self._tasks: list[asyncio.Task[Any]] = []
        self._on_result_dropped = on_result_dropped
        self._on_video_dropped = on_video_dropped
        self._on_closed = on_closed
        self._closing = False

    # --- wiring --------------------------------------------------------------------------------------------

    def watch(self, pipeline: AnalysisPipeline) -> None:
        """Get ``pipeline``'s results (and its annotated frames, when this session has video to send)."""
        self.watched = pipeline
        pipeline.subscribe(self._on_output, video=isinstance(self.outbound, OutboundVideoTrack))

    def attach_outbound(self, transceiver: Any, shared: VideoFanout | None = None) -> None:
        """Send video on ``transceiver`` (a video m-line on which the peer receives): annotated and encoded for this
        viewer alone, or from ``shared``: a camera's one encoder for all its viewers, or the camera's own H.264
        (``CameraPassthrough``; the page draws the overlay). Its bitrate and frame rate follow what the viewer's
        receiver reports say about the path (``VideoRateController``)."""
        sender = self.video_sender = transceiver.sender
        self.video_rate = VideoRateController()
        if shared is None:
            self.outbound = OutboundVideoTrack(self._on_video_dropped)
        else:
            self.outbound = SharedVideoTrack(shared)
            shared.add(self.outbound, sender)
            self.video_rate.set_picture(*(shared.picture or (640, 480)))
        sender.replaceTrack(self.outbound)
        taps = RtcpTaps(on_loss=self._on_loss, on_remb_bps=self._on_remb, after=self._apply_video_rate,
                        on_keyframe_request=self._keyframe_requested)
        tap_rtcp_rtt(sender, self._on_rtcp_rtt, self.heard, taps)

    def leave_passthrough(self, encoder: VideoFanout, why: str) -> None:
        """From the camera's own H.264 to annotated video from ``encoder`` (the camera's one encoder, or one for
        this viewer alone), which follows the path's rate; the page is told, and stops drawing its overlay."""
        if not self.passthrough or not isinstance(self.outbound, SharedVideoTrack):
            return
        log.info("session %s: %s; sending annotated video instead of the camera's own", self.id, why)
        self.outbound.switch(encoder)
        self._report_picture()

    @property
    def passthrough(self) -> bool:
        return isinstance(self.outbound, SharedVideoTrack) and isinstance(self.outbound.encoder, CameraPassthrough)

    @property
    def picture(self) -> str | None:
        """What the video sent shows: "camera" (its own picture; the page draws the analysis), "annotated"."""
        return None if self.outbound is None else "camera" if self.passthrough else "annotated"

    def _keyframe_requested(self) -> None:
        if isinstance(self.outbound, SharedVideoTrack):
            self.outbound.encoder.request_keyframe()

    def _on_rtcp_rtt(self, rtt_ms: float) -> None:
        self._rtt_sample(rtt_ms, "rtcp")
        self._last_rtcp_rtt_ms = rtt_ms

    def _on_remb(self, bitrate_bps: int) -> None:
        self._remb_bps = bitrate_bps

    def _on_loss(self, fraction: float) -> None:
        """A receiver report on the video we send: adapt its rate (cut at once on loss or a queue, raise slowly)."""
        self._adapt_video(fraction, self._last_rtcp_rtt_ms)

    def _adapt_video(self, loss_fraction: float, rtt_ms: float | None, probe_sent_s: float | None = None) -> None:
        if self.video_rate is None:
            return
        floor = snapshot(self.rtt, self.bitrate).rtt_low_ms
        rate = self.video_rate.update(time.monotonic(), loss_fraction, rtt_ms, floor, self._remb_bps, probe_sent_s,
                                      self._sent_bps)
        if abs(rate.target_bps - self._logged_video_bps) >= 0.25 * self._logged_video_bps:
            self._logged_video_bps = rate.target_bps
            log.info("session %s: annotated video at %d kbit/s, %g fps, 1/%g size (loss %.0f %%, RTT %s ms)",
                     self.id, rate.target_bps // 1000, rate.max_fps, rate.scale_down, 100 * loss_fraction,
                     "?" if rtt_ms is None else f"{rtt_ms:.0f}")
        if self.outbound is not None:
            self.outbound.max_fps = rate.max_fps
            self.outbound.scale_down = rate.scale_down
        if self.passthrough and self.video_rate.cuts > 0 and self.on_passthrough_congested:
            self.on_passthrough_congested(self)  # the camera's bitrate does not fit this path

    def _apply_video_rate(self) -> None:
        if self.video_rate is not None and self.video_sender is not None:
            set_sender_target_bitrate(self.video_sender, self.video_rate.rate.target_bps)

    def attach_channel(self, channel: RTCDataChannel) -> None:
        self.channel = channel
        channel.on("message", self._on_message)

    def start(self) -> None:
        """Start the connect timer at once (the offer is being answered) and the network poll."""
        self._tasks.append(asyncio.create_task(self._watch_connect(), name=f"connect-{self.id}"))
        self._tasks.append(asyncio.create_task(self._poll_network(), name=f"netpoll-{self.id}"))

    def heard(self) -> None:
        """Something arrived from the peer (a data-channel message, an RTCP packet, a video frame)."""
        self._last_heard = time.monotonic()

    def on_connection_state(self) -> None:
        """The peer connection's state changed: note when it connected; close it when it failed or closed."""
        state = self.pc.connectionState
        if state == "connected" and self.connected_after_s is None:
            self.connected_after_s = time.monotonic() - self.created_s
        elif state in ("failed", "closed"):
            reason = "closed" if state == "closed" else (
                "ice-failed" if self.pc.iceConnectionState == "failed" else "dtls-failed")
            self._close_soon(reason)

    def on_ice_state(self) -> None:
        if self.pc.iceConnectionState == "failed":
            self._close_soon("ice-failed")

    def _close_soon(self, reason: str) -> None:
        if self._closer is None and not self._closing:
            self._closer = asyncio.create_task(self.close(reason), name=f"close-{self.id}")

    async def _watch_connect(self) -> None:
        await asyncio.sleep(self.connect_timeout_s)
        if self.connected_after_s is None and not self._closing:
            log.warning("session %s: not connected %.0f s after its offer (ICE %s, connection %s): closing it. "
                        "Likely %s", self.id, self.connect_timeout_s, self.pc.iceConnectionState,
                        self.pc.connectionState, CONNECT_HINT)
            self._close_soon("connect-timeout")

    # --- outputs -------------------------------------------------------------------------------------------

    def _on_output(self, af: AnalysedFrame) -> None:
        if isinstance(self.outbound, OutboundVideoTrack) and af.i420 is not None:
            frame = af.video_frame()
            if self.video_rate is not None and self.video_rate.picture_bps is None:
                self.video_rate.set_picture(frame.width, frame.height)
            self.outbound.offer(frame)
        if self.own_pipeline is not None and self.watched is self.own_pipeline and af.result.skipped is None:
            b = af.result.budget  # late_ms discounts a step in the path's delay; arrival shows a queue's growth
            net = af.result.network
            request = self.uplink.update(time.monotonic(), b.late_ms, af.result.frame_size[1],
                                         self.receive_estimate_bps, b.arrival_delay_ms,
                                         max(0.0, net.rtt_ms - net.rtt_low_ms))
            if request is not None:  # the page applies it with RTCRtpSender.setParameters
                log.info("session %s: asking the browser to send at most %s, 1/%g resolution, %g fps",
                         self.id, "no cap" if request.max_bitrate_bps is None else
                         f"{request.max_bitrate_bps // 1000} kbit/s", request.scale_down, request.max_fps)
                self._send(request.message())
        ch = self.channel
        if ch is None:
            return
        if ch.readyState != "open" or ch.bufferedAmount > MAX_BUFFERED_BYTES:
            self.results_not_sent += 1
            self._on_result_dropped()
            return
        now = time.monotonic()
        if self.full_results or now - self._detail_sent_s >= DETAIL_EVERY_S:
            self._detail_sent_s = now
            msg = af.result.to_json(af.classes or self.class_names)
            msg["session"] = self.id
            msg["receive_estimate_bps"] = self.receive_estimate_bps
        else:
            msg = af.result.to_compact_json(af.classes or self.class_names)
        msg["rtt_source"] = self.rtt_source
        if self._send(msg):
            self.results_sent += 1
        else:
            self.results_not_sent += 1
            self._on_result_dropped()

    def _on_message(self, message: object) -> None:
        self.heard()
        if not isinstance(message, str) or len(message) > MAX_MESSAGE_BYTES:
            self._reject("messages must be JSON text under 4 KiB")
            return
        if message.startswith("ping") and not message.startswith("ping{"):
            # aiortc's example client (examples/server/client.js) sends "ping <time>" and expects "pong <time>"
            self._send_text("pong" + message[4:])
            return
        try:
            msg = json.loads(message)
        except ValueError:
            self._reject("not JSON")
            return
        kind = msg.get("type") if isinstance(msg, dict) else None
        if kind == "pong" and isinstance(msg.get("id"), int):
            sent = self._pings.pop(msg["id"], None)
            # the channel is ordered: pings older than this pong will not be answered any more
            self._pings = {k: v for k, v in self._pings.items() if k > msg["id"]}
            if sent is not None:
                rtt_ms = (time.monotonic() - sent) * 1e3
                self._rtt_sample(rtt_ms, "datachannel")
                # the pong crossed the same queues as our video, four times a second: a queue shows here first
                self._adapt_video(0.0, rtt_ms, sent)
                self._apply_video_rate()
        elif kind == "ping":
            self._send({"type": "pong", "id": msg.get("id")})
        else:
            self._reject(f"unknown message type {kind!r}; expected 'ping' or 'pong'")

    def model_changed(self, class_names: list[str], num_exits: int, name: str) -> None:
        """The server swapped its model: results now carry these classes (the page redraws its legend and charts)."""
        self.class_names = class_names
        self._send({"type": "model", "name": name, "classes": class_names, "num_exits": num_exits})

    def _reject(self, reason: str) -> None:
        self.bad_messages += 1
        log.info("session %s: bad data-channel message: %s", self.id, reason)
        self._send({"type": "error", "reason": reason})

    def _send(self, msg: dict[str, Any]) -> bool:
        return self._send_text(json.dumps(msg, separators=(",", ":")))

    def _send_text(self, text: str) -> bool:
        """Send on the data channel if it is open; False (and one log line per session) when the peer refuses it."""
        ch = self.channel
        if ch is None or ch.readyState != "open":
            return False
        try:
            ch.send(text)
        except ValueError as exc:  # over the peer's a=max-message-size
            self.send_errors += 1
            if self.send_errors == 1:
                log.warning("session %s: the peer refuses a %d-byte message (%s); such messages are dropped",
                            self.id, len(text.encode()), exc)
            return False
        return True

    def _report_picture(self) -> None:
        """Tell the viewer what its video shows: {"type": "video", "picture": "camera" | "annotated"}."""
        picture = self.picture
        if picture is not None and picture != self._picture_sent and self._send({"type": "video", "picture": picture}):
            self._picture_sent = picture

    def _report_source(self) -> None:
        """Tell a camera viewer when its camera's state changes: {"type": "source", "state", "reason"}."""
        if self._source_state is None or self.channel is None or self.channel.readyState != "open":
            return
        state = self._source_state()
        message = {"type": "source", "camera": self.camera, "state": state[0],
                   "reason": None if state[1] is None else redact(state[1])}
        if state != self._source_sent and self._send(message):
            self._source_sent = state

    # --- network estimate -----------------------------------------------------------------------------------

    @property
    def rtt_source(self) -> str:
        """"rtcp", "datachannel", both joined by "+", or "prior" before the first sample."""
        return "+".join(sorted(self.rtt_sources, reverse=True)) or "prior"

    def _watch_incoming(self, now: float) -> None:
        """One WARNING when the browser's video stops producing frames for 2 s while the session is up (and one
        INFO when frames come back): a stalled receiver, not a quiet peer, once RTP keeps arriving."""
        reader = self.reader
        if reader is None or self.connected_after_s is None:
            return
        if reader.received != self._received_at:
            if self._stalled_since is not None:
                log.info("session %s: video frames again after %.1f s", self.id, now - self._stalled_since)
            self._received_at, self._received_change_s, self._stalled_since = reader.received, now, None
        elif self._stalled_since is None and now - self._received_change_s >= 2.0:
            self._stalled_since = self._received_change_s
            buf = jitter_buffer_state(reader.track, self.pc)
            log.warning("session %s: no video frame from the browser for 2 s (after %d frames; jitter buffer %s)",
                        self.id, reader.received, buf)

    def _rtt_sample(self, rtt_ms: float, source: str) -> None:
        self.rtt.add(time.monotonic(), rtt_ms)
        self.rtt_sources.add(source)

    def network_view(self) -> NetworkView:
        est = snapshot(self.rtt, self.bitrate)
        # an annotated frame's share of the path per result interval: at a lower frame rate (a narrow path) the
        # frames are bigger but fewer, and a result never waits for one, so never count more than 1/30 s of it
        frame_bytes = (expected_frame_bytes(est.bitrate_bps, max(self._fps, 30.0)) if self.outbound is not None
                       else JSON_RESULT_BYTES)
        return NetworkView(est, frame_bytes)

    async def _measure_sent(self, now: float) -> None:
        """The video sender's bytes sent (its public ``getStats``), as a rate over about a second."""
        last = self._bytes_at
        if last is not None and now - last[0] < 1.0:
            return
        assert self.video_sender is not None
        stats = await self.video_sender.getStats()
        sent = next((int(s.bytesSent) for s in stats.values() if s.type == "outbound-rtp"), None)
        if sent is None:
            return
        if last is not None:
            self._sent_bps = 8.0 * (sent - last[1]) / (now - last[0])
        self._bytes_at = (now, sent)

    async def _poll_network(self) -> None:
        last_ping = 0.0
        while True:
            await asyncio.sleep(POLL_S)
            now = time.monotonic()
            if self.video_sender is not None:
                target = sender_target_bitrate_bps(self.video_sender)
                if target is not None:
                    self.bitrate.add(target)
                await self._measure_sent(now)
            for t in self.pc.getTransceivers():
                if t.kind == "video" and t.receiver.track is not None:
                    self.receive_estimate_bps = receiver_bitrate_estimate_bps(t.receiver)
            if self.outbound is not None:
                t0, n0 = self._sent_at_poll
                fps = (self.outbound.sent - n0) / max(now - t0, 1e-3)
                self._fps = fps if self._fps == 0 else 0.7 * self._fps + 0.3 * fps
                self._sent_at_poll = (now, self.outbound.sent)
            self._report_source()
            self._report_picture()
            self._watch_incoming(now)
            if self.connected_after_s is not None:
                if self._last_heard is None:
                    self._last_heard = now  # the clock starts once connected
                elif now - self._last_heard > self.peer_timeout_s:
                    log.warning("session %s: nothing from the peer for %.0f s (no message, RTCP or video): it is "
                                "gone, closing", self.id, now - self._last_heard)
                    self.timed_out = True
                    self._close_soon("peer-gone")
                    return
            if self._pings and self.video_rate is not None:
                # a ping still unanswered is a lower bound on the RTT, and it comes before its pong: a queue that
                # builds up behind our video shows here within a poll
                sent = min(self._pings.values())
                self._adapt_video(0.0, (now - sent) * 1e3, sent)
                self._apply_video_rate()
            if now - last_ping >= PING_S and self.channel is not None and self.channel.readyState == "open":
                last_ping = now
                self._ping_id += 1
                self._pings = {k: v for k, v in self._pings.items() if now - v < 10}  # lost pings are forgotten
                self._pings[self._ping_id] = now
                self._send({"type": "ping", "id": self._ping_id, "t": round(time.time() * 1e3, 1)})  # our clock

    # --- status and shutdown -------------------------------------------------------------------------------

    def status(self) -> dict[str, Any]:
        est = snapshot(self.rtt, self.bitrate)
        return {
            "id": self.id,
            "state": self.pc.connectionState,
            "ice_state": self.pc.iceConnectionState,
            "connected_after_s": None if self.connected_after_s is None else round(self.connected_after_s, 2),
            "camera": self.camera,
            "sends_video": self.own_pipeline is not None,
            "receives_video": self.outbound is not None,
            "picture": self.picture,
            "data_channel": self.channel.readyState if self.channel is not None else None,
            "age_s": round(time.monotonic() - self.created_s, 1),
            "rtt_ms": round(est.rtt_ms, 2),
            "rtt_source": self.rtt_source,
            "bitrate_bps": round(est.bitrate_bps),
            "receive_estimate_bps": self.receive_estimate_bps,
            "results_sent": self.results_sent,
            "video_frames_sent": self.outbound.sent if self.outbound else 0,
            "video_frames_dropped": self.outbound.dropped if self.outbound else 0,
            "video_target_bps": self.video_rate.rate.target_bps if self.video_rate else None,
            "video_scale_down": self.video_rate.rate.scale_down if self.video_rate else None,
            "uplink_level": self.uplink.level,
            "frames_analysed": self.own_pipeline.analysed if self.own_pipeline else None,
            "frames_rendered": self.own_pipeline.rendered if self.own_pipeline else None,
            "frames_dropped_stale": self.own_pipeline.slot.dropped if self.own_pipeline else None,
            "answers": self.own_pipeline.counts() if self.own_pipeline else None,
            "results_not_sent": self.results_not_sent,
            "bad_messages": self.bad_messages,
            "send_errors": self.send_errors,
            "timed_out": self.timed_out,
        }

    async def close(self, reason: str | None = None) -> None:
        """Close everything this session holds; ``reason`` (one of ``CLOSE_REASONS``, None for an offer that was
        refused) goes to ``on_closed``.  Safe to call more than once: the first call's reason counts."""
        if self._closing:
            return
        self._closing = True
        self.close_reason = reason
        current = asyncio.current_task()
        self._tasks = [t for t in self._tasks if t is not current]
        if self.watched is not None:
            self.watched.unsubscribe(self._on_output)
        for task in self._tasks:
            task.cancel()
        await asyncio.gather(*self._tasks, return_exceptions=True)
        if self.reader is not None:
            await self.reader.stop()
        if self.own_pipeline is not None:
            await self.own_pipeline.stop()
        if self.outbound is not None:
            self.outbound.stop()
        await self.pc.close()
        await self._on_closed(self, reason)
