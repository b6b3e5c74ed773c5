"""The app's live state: the inference service, the cameras and their shared analyses, the peer sessions.

``Hub.start()`` opens every configured camera and starts its analysis (a
camera is analysed once, whoever watches); ``create_session`` answers a
WebRTC offer; ``stop()`` closes everything within bounded time.
"""

from __future__ import annotations

import asyncio
import functools
import logging
import time
import uuid
from concurrent.futures import ThreadPoolExecutor
from dataclasses import replace
from pathlib import Path
from typing import Any

from aiortc import RTCConfiguration, RTCIceServer, RTCPeerConnection, RTCSessionDescription
from aiortc.exceptions import InternalError, InvalidAccessError, InvalidStateError, OperationError

from edge_app.budget import send_time_ms, worst_network
from edge_app.config import AppConfig
from edge_app.decide import PipelineSettings
from edge_app.errors import EdgeAppError
from edge_app.governor import LoadGovernor
from edge_app.metrics import Metrics
from edge_app.pipeline import AnalysisPipeline, Engine
from edge_app.results import AnalysedFrame, NetworkView
from edge_app.scheduler import policy_from_config
from edge_app.session import JSON_RESULT_BYTES, PeerSession
from models.manifest import read_manifest
from models.operating import OperatingPoint, operating_points, resolve_points
from models.policies import ExitPolicy
from models.service import InferenceService, load_backend
from streams.aiortc_adapter import (
    answer_as_dtls_server,
    floor_remb,
    lower_video_bitrate_floor,
    negotiated_codec,
    peer_receives,
    prefer_codec,
    skip_long_gaps,
    tap_rtcp,
)
from streams.demo import DemoCamera
from streams.frames import LatestSlot, SourceFrame
from streams.netstats import BitrateEstimator, RttEstimator, snapshot
from streams.passthrough import CameraPassthrough, passthrough_problem
from streams.ratecontrol import VideoRateController
from streams.redact import redact
from streams.rtsp import Backoff, RtspCamera
from streams.sdp_check import offer_problem
from streams.shared_video import SharedEncoder, VideoFanout
from streams.webrtc import TrackReader

log = logging.getLogger(__name__)
DEMO_FRAMES = Path(__file__).parent / "demo"  # labelled frames of the demo test split (labels.json)

SDP_ERRORS = (ValueError, KeyError, IndexError, TypeError, InternalError, InvalidAccessError, InvalidStateError,
              OperationError)


class OfferRefused(EdgeAppError):
    """An offer the hub will not answer; ``status`` is the HTTP status to reply with."""

    def __init__(self, status: int, reason: str) -> None:
        super().__init__(reason)
        self.status = status
        self.reason = reason


class Hub:
    def __init__(self, config: AppConfig, service: InferenceService, metrics: Metrics) -> None:
        self.config = config
        self.service = service
        self.metrics = metrics
        self.policy = policy_from_config(config.policy, service.backend.folder)
        self.media = ThreadPoolExecutor(config.model.workers, thread_name_prefix="media")
        self.engine = Engine(service=service, policy=self.policy, metrics=metrics, media=self.media)
        self.cameras: dict[str, RtspCamera] = {}
        self.camera_pipelines: dict[str, AnalysisPipeline] = {}
        self.sessions: dict[str, PeerSession] = {}
        self.closed: dict[str, int] = {}  # sessions closed so far, by reason
        self.governor: LoadGovernor | None = None  # [policy] adapt_to_load
        self.shared_encoders: dict[tuple[str, str], SharedEncoder] = {}  # (camera, codec): one for all its viewers
        self.passthroughs: dict[str, CameraPassthrough] = {}  # camera: its own H.264 to the viewers who draw
        self._encodes: set[asyncio.Future[None]] = set()
        b = config.budget
        self._prior = NetworkView(snapshot(RttEstimator(b.rtt_prior_ms), BitrateEstimator(b.bitrate_prior_kbps * 1e3)),
                                  JSON_RESULT_BYTES)
        metrics.add_live_state(lambda: len(self.sessions), lambda: list(self.cameras.values()))

    async def start(self) -> None:
        self.service.start()
        lower_video_bitrate_floor(VideoRateController.STARVED_BPS)  # annotated video under aiortc's 250 kbit/s
        self.governor = await self._governor_for(self.service.backend.folder, self.policy)
        self.engine = replace(self.engine, load=self.governor)
        for c in self.config.cameras:
            cam = RtspCamera(c.name, c.url, c.transport, c.open_timeout_s, c.read_timeout_s,
                             Backoff(c.backoff_initial_s, c.backoff_max_s))
            cam.start()
            assert cam.slot is not None
            pipe = self._pipeline(c.name, c.name, cam.slot, lambda name=c.name: self.camera_network(name), c.probe)
            pipe.region = c.region
            pipe.start()
            self.cameras[c.name] = cam
            self.camera_pipelines[c.name] = pipe
        if self.config.demo.enabled:
            self._start_demo()
        log.info("policy %s; %d camera(s) configured", self.policy.name, len(self.cameras))

    def pipelines(self) -> list[AnalysisPipeline]:
        return [*self.camera_pipelines.values(), *(s.own_pipeline for s in self.sessions.values() if s.own_pipeline)]

    async def _governor_for(self, folder: Path, policy: ExitPolicy) -> LoadGovernor | None:
        """The load-adaptive operating point (``edge_app.governor``) for the model in ``folder``: every pipeline
        asks it for each frame's policy; None with ``[policy] adapt_to_load = false``."""
        if not self.config.policy.adapt_to_load:
            return None
        points = await asyncio.get_running_loop().run_in_executor(None, operating_points, folder, policy)
        governor = LoadGovernor(points, self.config.policy.load_headroom, self.config.model.workers, self._moved,
                                functools.partial(resolve_points, folder, policy), read_manifest(folder).costs_ms)
        self.metrics.operating_point.set(0)
        self.metrics.operating_cost.set(points[0].cost)
        return governor

    def _moved(self, point: OperatingPoint) -> None:
        if self.governor is not None:
            self.metrics.operating_point.set(self.governor.index)
            self.metrics.inference_load.set(self.governor.load)
        self.metrics.operating_cost.set(point.cost)

    def _pipeline(self, source: str, metric_source: str, slot: LatestSlot[SourceFrame], network: Any,
                  probe: bool = False, uplink_from_frames: bool = False) -> AnalysisPipeline:
        settings = PipelineSettings(budget=self.config.budget, smoothing=self.config.smoothing,
                                    truncate=self.config.policy.truncate, probe=probe,
                                    uplink_from_frames=uplink_from_frames)
        return AnalysisPipeline(source, metric_source, slot, self.engine, settings, network)

    def camera_network(self, camera: str) -> NetworkView:
        """A camera's budget must suit every viewer: the view of the one whose network costs most."""
        views = [s.network_view() for s in self.sessions.values() if s.camera == camera]
        costs = [v.estimate.rtt_ms + send_time_ms(v.frame_bytes, v.estimate.bitrate_bps) for v in views]
        i = worst_network(costs)
        return self._prior if i is None else views[i]

    async def create_session(self, offer: RTCSessionDescription, camera: str | None, probe: bool,
                             full_results: bool = False, picture: str = "annotated"
                             ) -> tuple[PeerSession, RTCSessionDescription]:
        """Answer ``offer``; raise ``OfferRefused`` with the HTTP status and a reason when it cannot be used.

        The session takes its slot before the first ``await`` (a burst of offers cannot overshoot
        ``max_sessions``) and gives it back on every failure path (``close`` forgets it).
        """
        limit = self.config.server.max_sessions
        if len(self.sessions) >= limit:
            raise OfferRefused(503, f"at capacity: {len(self.sessions)} sessions open "
                                    f"([server] max_sessions = {limit}); try again later")
        if camera is not None and camera not in self.cameras:
            raise OfferRefused(404, f"no camera named {camera!r}; configured cameras: {sorted(self.cameras)}")
        problem = offer_problem(offer.sdp)
        if problem is not None:
            raise OfferRefused(400, f"cannot use this SDP offer: {problem}")
        session = self._new_session(camera, probe, full_results)
        self.sessions[session.id] = session  # the slot is taken from here on
        session.start()
        try:
            answer = await self._answer(session, offer, camera, picture)
        except OfferRefused:
            await session.close()
            raise
        except SDP_ERRORS as exc:
            await session.close()
            raise OfferRefused(400, f"cannot use this SDP offer: {redact(str(exc)) or type(exc).__name__}") from exc
        except Exception as exc:  # aiortc raises what its parser happens to meet (AttributeError, AssertionError)
            await session.close()
            log.warning("session %s: aiortc could not use the offer (%s: %s)", session.id, type(exc).__name__,
                        redact(str(exc)))
            raise OfferRefused(400, f"cannot use this SDP offer ({type(exc).__name__}: {redact(str(exc))})") from exc
        log.info("session %s: %s, camera %s", session.id,
                 "analysing the browser's camera" if camera is None else "watching", camera)
        return session, answer

    def _new_session(self, camera: str | None, probe: bool, full_results: bool) -> PeerSession:
        ice = [RTCIceServer(s.urls, s.username, s.credential) for s in self.config.server.ice_servers]
        pc = RTCPeerConnection(RTCConfiguration(iceServers=ice))
        srv = self.config.server
        session = PeerSession(uuid.uuid4().hex[:12], pc, self.config.budget, self.service.class_names, camera, probe,
                              self.metrics.results_dropped.inc, self._forget,
                              self.metrics.frames_dropped.labels(camera or "browser", "send").inc,
                              peer_timeout_s=srv.peer_timeout_s, connect_timeout_s=srv.connect_timeout_s,
                              source_state=None if camera is None else lambda: self.camera_state(camera),
                              full_results=full_results)
        pc.on("datachannel", session.attach_channel)
        pc.on("connectionstatechange", session.on_connection_state)
        pc.on("iceconnectionstatechange", session.on_ice_state)
        return session

    async def _answer(self, session: PeerSession, offer: RTCSessionDescription, camera: str | None,
                      picture: str = "annotated") -> RTCSessionDescription:
        """Wire the session to its tracks and make the answer.

        Only the tracks the app uses are received: the browser's first video track (when it analyses its own
        camera) and one video m-line to send the annotated video on.  Every other m-line (audio, more video) is
        answered ``inactive``, so nothing is decoded for it.
        """
        pc = session.pc
        offered: list[Any] = []
        pc.on("track", offered.append)
        await pc.setRemoteDescription(offer)
        answer_as_dtls_server(pc)  # peers with RSA certificates (GStreamer's webrtcbin) need aiortc as DTLS server
        video = [t for t in pc.getTransceivers() if t.kind == "video"]
        analysed = next((t for t in video if t.receiver.track is not None and t.receiver.track in offered), None)
        if camera is None and analysed is None:
            raise OfferRefused(400, "the offer sends no video track and names no camera: nothing to analyse "
                                    "(add a video track, or ask for one of the configured cameras)")
        # annotated video goes back only on an m-line where the peer asked to receive video (a page that shows
        # its own camera and draws the results over it offers "sendonly": nothing is rendered or encoded for it)
        back = next((t for t in video if peer_receives(t) and t is analysed), None) or next(
            (t for t in video if peer_receives(t)), None)
        used = {t for t in (back, analysed if camera is None else None) if t is not None}
        if back is not None:
            source = None if camera is None else self._camera_video(session, camera, back, picture)
            session.attach_outbound(back, source)
        if camera is None and analysed is not None:
            self._analyse_browser_camera(session, analysed)
        elif camera is not None:
            session.watch(self.camera_pipelines[camera])
        for t in pc.getTransceivers():
            if t not in used:
                t.direction = "inactive"
            elif t is back and t is analysed and camera is None:
                t.direction = "sendrecv"
            else:  # a camera viewer's own video would be decoded for nothing
                t.direction = "sendonly" if t is back else "recvonly"
        await pc.setLocalDescription(await pc.createAnswer())
        return pc.localDescription

    def _camera_video(self, session: PeerSession, camera: str, transceiver: Any, picture: str
                      ) -> VideoFanout | None:
        """Where a camera viewer's video comes from: the camera's own H.264 when the viewer draws the analysis
        itself (``picture="camera"``) and the camera's stream can go to a browser as it is; else the camera's one
        encoder of annotated video (None: ``share_camera_encoder`` is off, the viewer gets its own)."""
        if picture == "camera" and self.config.server.camera_passthrough:
            problem = self._passthrough_problem(camera)
            if problem is None and prefer_codec(transceiver, "video/H264"):
                session.on_passthrough_congested = self._passthrough_congested
                return self._passthrough(camera, transceiver)
            log.info("session %s: annotated video of camera %s, not its own: %s", session.id, camera,
                     problem or "the viewer did not offer H.264")
        return self._shared_encoder(camera, transceiver) if self.config.server.share_camera_encoder else None

    def _passthrough_problem(self, camera: str) -> str | None:
        cam = self.cameras[camera]
        if not isinstance(cam, RtspCamera):
            return "the demo camera has no compressed stream to forward"
        return passthrough_problem(cam.codec)

    def _passthrough(self, camera: str, transceiver: Any) -> CameraPassthrough:
        cam = self.cameras[camera]
        pt = self.passthroughs.get(camera)
        if pt is None:
            pt = self.passthroughs[camera] = CameraPassthrough(f"{camera}/H264", negotiated_codec(transceiver),
                                                               asyncio.get_running_loop())
            pt.on_empty = lambda: self._drop_passthrough(camera)
            pt.on_unfit = lambda why: self._passthrough_unfit(camera, why)
            cam.packet_sink = pt.on_packet
            log.info("camera %s: forwarding its own H.264 to the viewers who draw the analysis (no transcode)", camera)
        pt.picture = cam.resolution
        return pt

    def _drop_passthrough(self, camera: str) -> None:
        if self.passthroughs.pop(camera, None) is not None:
            self.cameras[camera].packet_sink = None

    def _leave_passthrough(self, session: PeerSession, why: str) -> None:
        assert session.camera is not None and session.video_sender is not None
        transceiver = next(t for t in session.pc.getTransceivers() if t.sender is session.video_sender)
        own = None if self.config.server.share_camera_encoder else session.id
        session.leave_passthrough(self._shared_encoder(session.camera, transceiver, own), why)

    def _passthrough_congested(self, session: PeerSession) -> None:
        self._leave_passthrough(session, "its path is congested at the camera's own bitrate")

    def _passthrough_unfit(self, camera: str, why: str) -> None:
        """The camera's stream changed (B-frames, another codec): its viewers get annotated video instead."""
        for session in [s for s in self.sessions.values() if s.camera == camera and s.passthrough]:
            self._leave_passthrough(session, why)

    def _shared_encoder(self, camera: str, transceiver: Any, viewer: str | None = None) -> SharedEncoder:
        """The one encoder of ``camera``'s annotated video for the codec this viewer negotiated: the camera's
        pipeline renders and it encodes each frame once, for every viewer (``streams.shared_video``). ``viewer``:
        an encoder for that session alone (a viewer leaving passthrough while ``share_camera_encoder`` is off)."""
        codec = negotiated_codec(transceiver)
        key = (camera, codec.mimeType.lower() + (f"/{viewer}" if viewer else ""))
        enc = self.shared_encoders.get(key)
        if enc is None:
            enc = self.shared_encoders[key] = SharedEncoder(f"{camera}/{codec.mimeType}", codec, self.media)
            pipe = self.camera_pipelines[camera]

            def feed(af: AnalysedFrame, enc: SharedEncoder = enc) -> None:
                if af.i420 is not None and enc.viewers:
                    task = asyncio.ensure_future(enc.encode(af.video_frame()))
                    self._encodes.add(task)
                    task.add_done_callback(self._encodes.discard)

            pipe.subscribe(feed, video=True)
            enc.on_empty = lambda: self._drop_encoder(key, pipe, feed)
            log.info("camera %s: one %s encoder for all its video viewers", camera, codec.mimeType)
        return enc

    def _drop_encoder(self, key: tuple[str, str], pipe: AnalysisPipeline, feed: Any) -> None:
        """The last viewer left: stop rendering and encoding for nobody."""
        if self.shared_encoders.pop(key, None) is not None:
            pipe.unsubscribe(feed)

    def _analyse_browser_camera(self, session: PeerSession, transceiver: Any) -> None:
        # never fewer lines than twice the model's input: the counter a probe stamps (and fine detail) must survive
        session.uplink.min_height = 2 * self.service.backend.manifest.input.height
        if session.outbound is None:  # results only: ask for no more lines than the analysis uses
            lines = self.config.server.results_only_height or 2 * self.service.backend.manifest.input.height
            session.uplink.max_height = lines
        floor_remb(transceiver.receiver, int(self.config.budget.min_receive_kbps * 1000))
        tap_rtcp(transceiver.receiver, session.heard)  # the browser's sender reports: the peer is alive
        skip_long_gaps(transceiver.receiver)  # a lost packet must not stall every later frame
        slot: LatestSlot[SourceFrame] = LatestSlot()
        source = f"browser-{session.id}"
        session.reader = TrackReader(transceiver.receiver.track, slot, source, on_frame=session.heard)
        session.own_pipeline = self._pipeline(source, "browser", slot, session.network_view, session.probe,
                                              uplink_from_frames=True)
        session.watch(session.own_pipeline)
        session.reader.start()
        session.own_pipeline.start()

    def _start_demo(self) -> None:
        """The built-in demo camera: labelled frames looped, analysed like any camera, scored live."""
        d = self.config.demo
        cam = DemoCamera(d.name, DEMO_FRAMES, d.fps, d.hold_frames)
        cam.start()
        assert cam.slot is not None
        pipe = self._pipeline(d.name, d.name, cam.slot, lambda name=d.name: self.camera_network(name))
        pipe.start()
        self.cameras[d.name] = cam  # type: ignore[assignment]  # the shape of an RtspCamera
        self.camera_pipelines[d.name] = pipe

    async def swap_model(self, folder: Path) -> InferenceService:
        """Serve ``folder`` from now on, without dropping a session or a camera: load and warm it up (off the event
        loop; ``ModelError`` / ``PolicyError`` when it does not load, and nothing changes), switch every pipeline
        to it between two frames (their smoothing starts again), tell every viewer (a ``model`` message), then stop
        the old model's service."""
        m = self.config.model
        loop = asyncio.get_running_loop()
        backend = await loop.run_in_executor(None, load_backend, m.backend, folder, m.providers, m.threads,
                                             m.warmup_runs, m.cuda_device)
        policy = policy_from_config(self.config.policy, folder)
        governor = await self._governor_for(folder, policy)  # the new model's own operating points
        service = InferenceService(backend, m.workers, m.cost_window, m.batch_window_ms, m.max_batch)
        service.start()
        old = self.engine
        self.service, self.policy, self.governor = service, policy, governor
        self.engine = Engine(service=service, policy=policy, metrics=self.metrics, media=self.media, load=governor)
        await asyncio.gather(*(p.use(self.engine) for p in self.pipelines()))
        for session in self.sessions.values():
            session.model_changed(service.class_names, service.num_exits, backend.manifest.name)
        await old.service.stop()
        self.metrics.set_model(backend.manifest.name, backend.providers[0])
        log.info("model: now %s (%s, %d classes), policy %s", backend.manifest.name, folder, len(service.class_names),
                 policy.name)
        return service

    def camera_state(self, name: str) -> tuple[str, str | None]:
        """A camera's state for its viewers: ("streaming", None), or ("reconnecting", why) with the reason redacted."""
        cam = self.cameras[name]
        if cam.state == "streaming":
            return "streaming", None
        return ("reconnecting" if cam.state in ("connecting", "backoff") else cam.state), cam.last_error

    async def _forget(self, session: PeerSession, reason: str | None) -> None:
        self.sessions.pop(session.id, None)
        if reason is not None:
            self.closed[reason] = self.closed.get(reason, 0) + 1
            self.metrics.sessions_closed.labels(reason).inc()
            log.info("session %s: closed (%s) after %.1f s", session.id, reason, time.monotonic() - session.created_s)

    async def stop(self) -> None:
        timeout = self.config.server.shutdown_timeout_s
        log.info("shutdown: closing %d session(s) and %d camera(s)", len(self.sessions), len(self.cameras))
        closers = [s.close("shutdown") for s in list(self.sessions.values())]
        closers += [p.stop() for p in self.camera_pipelines.values()]
        closers += [c.stop() for c in self.cameras.values()]
        try:
            await asyncio.wait_for(asyncio.gather(*closers, return_exceptions=True), timeout)
        except TimeoutError:
            log.warning("shutdown: peers and cameras did not all close within %.1f s", timeout)
        await self.service.stop()
        self.media.shutdown(wait=False, cancel_futures=True)
        log.info("shutdown: done (%d session(s) left open)", len(self.sessions))

    def status(self) -> dict[str, Any]:
        return {
            "sessions": [s.status() for s in self.sessions.values()],
            "sessions_closed": dict(sorted(self.closed.items())),
            "cameras": [self._camera_status(name) for name in self.cameras],
            "operating_point": None if self.governor is None else self.governor.status(),
        }

    def _camera_status(self, name: str) -> dict[str, Any]:
        cam, pipe = self.cameras[name], self.camera_pipelines[name]
        last = pipe.last
        return {
            "name": name, "url": cam.safe_url, "state": cam.state, "transport": cam.transport,
            "transport_in_use": cam.transport_in_use, "frames": cam.frames,
            "reconnects": cam.reconnects, "connects": cam.connects,
            "last_error": None if cam.last_error is None else redact(cam.last_error),
            "resolution": cam.resolution, "frames_analysed": pipe.analysed, "frames_dropped_stale": pipe.slot.dropped,
            "analysis_errors": pipe.errors, "deadline_misses": pipe.deadline_misses, "answers": pipe.counts(),
            "viewers": sum(1 for s in self.sessions.values() if s.camera == name),
            "frames_rendered": pipe.rendered,
            "region": None if pipe.region is None else list(pipe.region),
            "live_accuracy": _live_accuracy(pipe.scored),
            "passthrough": self._passthrough_status(name),
            "encoders": [{"codec": e.codec.mimeType, "viewers": len(e.viewers), "frames_encoded": e.encoded,
                          "keyframes_requested": e.keyframes_requested, "target_bps": e.target_bps}
                         for (cam_name, _), e in self.shared_encoders.items() if cam_name == name],
            "last_result": None if last is None else {"label": self.service.class_names[last.smoothed_class],
                                                      "confidence": round(last.smoothed_confidence, 3),
                                                      "exit": last.exit},
        }


    def _passthrough_status(self, name: str) -> dict[str, Any]:
        """Whether the camera's own H.264 can go to viewers as it is (and why not), and how it goes."""
        problem = self._passthrough_problem(name) if self.config.server.camera_passthrough else \
            "[server] camera_passthrough is off"
        pt = self.passthroughs.get(name)
        return {"possible": problem is None, "reason": problem, **(pt.status() if pt else {"viewers": 0})}


def _live_accuracy(scored: dict[str, int]) -> dict[str, Any] | None:
    """A labelled source's running accuracy under the model in use (None for a camera without labels)."""
    if not scored["frames"]:
        return None
    return {"frames": scored["frames"], "raw": round(scored["raw_correct"] / max(1, scored["raw_frames"]), 4),
            "smoothed": round(scored["smoothed_correct"] / scored["frames"], 4)}
