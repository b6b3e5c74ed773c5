"""A browser's camera coming in: its track read into a slot, its own analysis pipeline, and what the browser is
asked to send (``UplinkController``, fed by DECIDE's arrival delay of each analysed frame, on the ingest side:
never through the results' fan-out).

The pipeline is registered in the hub's ``PipelineRegistry`` as ``session:ID`` (teach captures and shadows it
there) for as long as the session lasts.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Callable
from typing import Any

from edge_app import protocol
from edge_app.pipeline import AnalysisPipeline
from edge_app.results import FrameResult
from streams.aiortc_adapter import jitter_buffer_state
from streams.frames import LatestSlot, SourceFrame
from streams.uplink import UplinkController
from streams.webrtc import TrackReader

log = logging.getLogger(__name__)

PipelineFactory = Callable[[str, LatestSlot[SourceFrame]], AnalysisPipeline]


class BrowserIngest:
    def __init__(self, sid: str, track: Any, make_pipeline: PipelineFactory, uplink: UplinkController,
                 heard: Callable[[], None], ask: Callable[[protocol.Uplink], bool],
                 receive_estimate: Callable[[], int | None]) -> None:
        self.id = sid
        self.source = f"browser-{sid}"
        slot: LatestSlot[SourceFrame] = LatestSlot()
        self.reader = TrackReader(track, slot, self.source, on_frame=heard)
        self.pipeline = make_pipeline(self.source, slot)
        self.pipeline.on_decided = self._decided
        self.uplink = uplink
        self._ask = ask
        self._receive_estimate = receive_estimate
        self._received_at, self._received_change_s = 0, time.monotonic()
        self._stalled_since: float | None = None

    def start(self) -> None:
        self.reader.start()
        self.pipeline.start()

    def _decided(self, r: FrameResult) -> None:
        """Each analysed frame's lateness on the way in: ask the browser for fewer bits while they queue."""
        if r.skipped is not None:
            return
        b, net = r.budget, r.network  # late_ms discounts a step in the path's delay; arrival shows a queue's growth
        request = self.uplink.update(time.monotonic(), b.late_ms, r.frame_size[1], self._receive_estimate(),
                                     b.arrival_delay_ms, max(0.0, net.rtt_ms - net.rtt_low_ms))
        if request is None:
            return
        log.info("session %s: asking the browser to send at most %s, 1/%g resolution, %g fps", self.id,
                 "no cap" if request.max_bitrate_bps is None else f"{request.max_bitrate_bps // 1000} kbit/s",
                 request.scale_down, request.max_fps)
        # the page applies it with RTCRtpSender.setParameters
        self._ask(protocol.Uplink(request.max_bitrate_bps, request.scale_down, request.max_fps))

    def watch_stall(self, now: float, connected: bool, pc: Any) -> None:
        """One WARNING when the browser's video stops producing frames for 2 s while the session is up (and one
        INFO when frames come back): a stalled receiver, not a quiet peer, once RTP keeps arriving."""
        reader = self.reader
        if not connected:
            return
        if reader.received != self._received_at:
            if self._stalled_since is not None:
                log.info("session %s: video frames again after %.1f s", self.id, now - self._stalled_since)
            self._received_at, self._received_change_s, self._stalled_since = reader.received, now, None
        elif self._stalled_since is None and now - self._received_change_s >= 2.0:
            self._stalled_since = self._received_change_s
            buf = jitter_buffer_state(reader.track, pc)
            log.warning("session %s: no video frame from the browser for 2 s (after %d frames; jitter buffer %s)",
                        self.id, reader.received, buf)

    def status(self) -> dict[str, Any]:
        p = self.pipeline
        return {"uplink_level": self.uplink.level, "frames_analysed": p.tally.analysed, "frames_rendered": p.rendered,
                "frames_dropped_stale": p.slot.dropped, "answers": p.tally.counts(), "exit0": p.tally.exit0()}

    async def stop(self) -> None:
        await self.reader.stop()
        await self.pipeline.stop()
