"""The app's live state: the models it serves, the camera sources and their shared analyses, the peer sessions.

``Hub.start()`` opens every configured camera and starts its analysis with its model (a camera is analysed once,
whoever watches); ``create_session`` answers a WebRTC offer (the plan: ``edge_app.doors.signalling``; the video back:
``edge_app.fanout``; the session's rooms: ``edge_app.peer``); ``deploy`` puts a model on one camera or makes it
the box's default (``edge_app.served``: each model loaded once, whatever uses it), each pipeline switching between
two frames (``AnalysisPipeline.use``); ``stop()`` closes everything within bounded time.
"""

from __future__ import annotations

import asyncio
import functools
import logging
import time
import uuid
from concurrent.futures import ThreadPoolExecutor
from typing import Any

from aiortc import RTCConfiguration, RTCIceServer, RTCPeerConnection, RTCSessionDescription

from edge_app import protocol
from edge_app.config import AppConfig
from edge_app.decision.decide import PipelineSettings
from edge_app.doors.signalling import AnswerPlan, PlanRefused, offered_lines, plan_answer
from edge_app.errors import EdgeAppError
from edge_app.fanout import CameraVideo
from edge_app.ingest import BrowserIngest
from edge_app.metrics import Metrics
from edge_app.peer.monitor import JSON_RESULT_BYTES
from edge_app.peer.session import Asked, Hooks, PeerSession
from edge_app.pipeline import AnalysisPipeline, Engine
from edge_app.placement import Placement, registry_name
from edge_app.registry import PipelineRegistry, ViewerNetworks
from edge_app.results import NetworkView
from edge_app.served import ModelSet, ServedModel
from edge_app.sources import configured
from models.errors import ModelError, RegistryError
from models.registry import ModelRegistry
from models.service import Runner
from streams import aiortc_adapter as rtc
from streams.frames import LatestSlot, SourceFrame
from streams.netstats import BitrateEstimator, RttEstimator, snapshot
from streams.ratecontrol import VideoRateController
from streams.redact import redact
from streams.rtc_settings import lower_video_bitrate_floor
from streams.sdp_check import offer_problem
from streams.source import CameraSource
from streams.uplink import UplinkController

log = logging.getLogger(__name__)


class OfferRefused(EdgeAppError):
    """An offer the hub will not answer; ``status`` is the HTTP status to reply with."""

    def __init__(self, status: int, reason: str) -> None:
        super().__init__(reason)
        self.status = status
        self.reason = reason


class Hub:
    def __init__(self, config: AppConfig, service: Runner, metrics: Metrics) -> None:
        self.config = config
        self.metrics = metrics
        self.media = ThreadPoolExecutor(config.model.workers, thread_name_prefix="media")
        self.model_registry = ModelRegistry(config.resolve(config.training.models_dir), config.model_path)
        self.models = ModelSet(config, self.model_registry, metrics, self.media)
        self.models.add(ServedModel.make(config, registry_name(self.model_registry, service.backend.folder), service,
                                         metrics, self.media), default=True)
        self.registry = PipelineRegistry()
        self.placement = Placement(config, self.models, self.model_registry, self.registry)
        self.sources: dict[str, CameraSource] = {}
        self.networks: dict[str, ViewerNetworks] = {}  # camera: its viewers' network views
        self.sessions: dict[str, PeerSession] = {}
        self.closed: dict[str, int] = {}  # sessions closed so far, by reason
        self.video = CameraVideo(config.server, self.sources, self.registry, self.media, self.viewers)
        b = config.budget
        self._prior = NetworkView(snapshot(RttEstimator(b.rtt_prior_ms), BitrateEstimator(b.bitrate_prior_kbps * 1e3)),
                                  JSON_RESULT_BYTES)
        metrics.add_live_state(lambda: len(self.sessions), lambda: list(self.sources.values()))

    @property
    def default(self) -> ServedModel:
        """The box's default model: every camera without a model of its own and every browser session."""
        return self.models[self.models.default]

    def model_of(self, camera: str) -> ServedModel:
        return self.placement.of(camera)

    async def start(self) -> None:
        await self.default.start(self.config, self.metrics)  # a remote runner says at once when its server is not there
        lower_video_bitrate_floor(VideoRateController.STARVED_BPS)  # annotated video under aiortc's 250 kbit/s
        for c, source in configured(self.config):
            served = await self.placement.place(c.name)
            source.start()
            assert source.slot is not None
            pipe = self._pipeline(c.name, c.name, source.slot, served.engine, c.probe)
            pipe.region = c.region
            pipe.start()
            self.sources[c.name] = source
            self.networks[c.name] = ViewerNetworks(pipe, self._prior)
            self.registry.add("camera", c.name, pipe)
        log.info("policy %s; %d camera(s) configured; models: %s", self.default.policy.name, len(self.sources),
                 {n: sorted(m.users) for n, m in self.models.models.items()})

    def viewers(self, camera: str) -> list[PeerSession]:
        return [s for s in self.sessions.values() if s.camera == camera]

    def _pipeline(self, source: str, metric_source: str, slot: LatestSlot[SourceFrame], engine: Engine,
                  probe: bool = False, uplink_from_frames: bool = False) -> AnalysisPipeline:
        settings = PipelineSettings(budget=self.config.budget, smoothing=self.config.smoothing,
                                    truncate=self.config.policy.truncate, probe=probe,
                                    uplink_from_frames=uplink_from_frames)
        return AnalysisPipeline(source, metric_source, slot, engine, settings, self._prior)

    # --- sessions ------------------------------------------------------------------------------------------

    async def create_session(self, offer: RTCSessionDescription, asked: Asked) -> tuple[PeerSession,
                                                                                      RTCSessionDescription]:
        """Answer ``offer``; raise ``OfferRefused`` with the HTTP status and a reason when it cannot be used.

        The session takes its slot before the first ``await`` (a burst of offers cannot overshoot
        ``max_sessions``) and gives it back on every failure path (``close`` forgets it).
        """
        limit = self.config.server.max_sessions
        if len(self.sessions) >= limit:
            raise OfferRefused(503, f"at capacity: {len(self.sessions)} sessions open "
                                    f"([server] max_sessions = {limit}); try again later")
        if asked.camera is not None and asked.camera not in self.sources:
            raise OfferRefused(404, f"no camera named {asked.camera!r}; configured cameras: {sorted(self.sources)}")
        problem = offer_problem(offer.sdp)
        if problem is not None:
            raise OfferRefused(400, f"cannot use this SDP offer: {problem}")
        forward = asked.picture == "camera" and asked.camera is not None and self.video.forward_problem(
            asked.camera) is None
        try:
            plan = plan_answer(offered_lines(offer.sdp), asked.camera, forward)
        except PlanRefused as exc:
            raise OfferRefused(400, str(exc)) from exc
        session = self._new_session(asked)
        self.sessions[session.id] = session  # the slot is taken from here on
        if asked.camera is None:  # the model for the browser's camera, loaded if it is not (closing releases it)
            try:
                await self.models.acquire(asked.model or self.models.default, f"session:{session.id}")
            except ModelError as exc:  # RegistryError (no such model) carries its status
                await session.close()
                raise OfferRefused(exc.status if isinstance(exc, RegistryError) else 422,
                                   f"model {asked.model!r} cannot be served: {exc}") from exc
        session.start()
        try:
            answer = await self._answer(session, offer, plan)
        except Exception as exc:  # aiortc raises what its parser happens to meet (AttributeError, AssertionError)
            await session.close()
            log.warning("session %s: aiortc could not use the offer (%s: %s)", session.id, type(exc).__name__,
                        redact(str(exc)))
            raise OfferRefused(400, f"cannot use this SDP offer ({type(exc).__name__}: {redact(str(exc))})") from exc
        log.info("session %s: %s", session.id, "analysing the browser's camera" if asked.camera is None
                 else f"watching camera {asked.camera}")
        return session, answer

    def _new_session(self, asked: Asked) -> PeerSession:
        srv = self.config.server
        ice = [RTCIceServer(s.urls, s.username, s.credential) for s in srv.ice_servers]
        camera = asked.camera
        hooks = Hooks(on_closed=self._forget, on_result_dropped=self.metrics.results_dropped.inc,
                      on_video_dropped=self.metrics.frames_dropped.labels(camera or "browser", "send").inc,
                      source_state=None if camera is None else functools.partial(self.camera_state, camera))
        model = self.model_of(camera) if camera is not None else self.models.models.get(asked.model or "", self.default)
        return PeerSession(uuid.uuid4().hex[:12], RTCPeerConnection(RTCConfiguration(iceServers=ice)), asked,
                           self.config.budget, model.class_names, hooks, srv.peer_timeout_s,
                           srv.connect_timeout_s)

    async def _answer(self, session: PeerSession, offer: RTCSessionDescription, plan: AnswerPlan
                      ) -> RTCSessionDescription:
        """Wire the session to the m-lines of ``plan`` and make the answer."""
        pc, camera = session.pc, session.camera
        await pc.setRemoteDescription(offer)
        rtc.answer_as_dtls_server(pc)  # peers with RSA certificates (GStreamer's webrtcbin) need aiortc as DTLS server
        by_mid = {t.mid: t for t in pc.getTransceivers()}
        back = by_mid.get(plan.back)
        if back is not None and plan.codec_first is not None:
            rtc.prefer_codec(back, plan.codec_first)
        if back is not None and camera is not None:
            self.video.attach(session, camera, back, forward=plan.codec_first is not None)
        elif back is not None:
            session.attach_video(back, None)
        if camera is None:
            self._analyse_browser_camera(session, by_mid[plan.analysed])
        else:
            networks = self.networks[camera]
            session.monitor.subscribe(networks.listener(session.id))
            session.watch(self.registry.camera(camera))
        for mid, direction in plan.directions.items():
            if mid in by_mid:
                by_mid[mid].direction = direction
        await pc.setLocalDescription(await pc.createAnswer())
        return pc.localDescription

    def _analyse_browser_camera(self, session: PeerSession, transceiver: Any) -> None:
        model = self.models.held_by(f"session:{session.id}")
        # never fewer lines than twice the model's input: the counter a probe stamps (and fine detail) must survive
        lines = 2 * model.service.backend.manifest.input.height
        uplink = UplinkController(min_height=lines, max_height=None if session.video is not None else (
            self.config.server.results_only_height or lines))  # results only: no more lines than the analysis uses
        receiver = transceiver.receiver
        rtc.floor_remb(receiver, int(self.config.budget.min_receive_kbps * 1000))
        rtc.tap_rtcp(receiver, session.life.heard)  # the browser's sender reports: the peer is alive
        rtc.skip_long_gaps(receiver)  # a lost packet must not stall every later frame

        def make(source: str, slot: LatestSlot[SourceFrame]) -> AnalysisPipeline:
            return self._pipeline(source, "browser", slot, model.engine, session.asked.probe,
                                  uplink_from_frames=True)

        ingest = BrowserIngest(session.id, receiver.track, make, uplink, session.life.heard, session.channel.send,
                               lambda: session.monitor.receive_estimate_bps)
        session.monitor.subscribe(ingest.pipeline.set_network)
        self.registry.add("browser", session.id, ingest.pipeline)
        session.attach_ingest(ingest)

    def camera_state(self, name: str) -> protocol.Source:
        """A camera's state for its viewers: streaming, or reconnecting with the reason (redacted)."""
        cam = self.sources[name]
        if cam.state == "streaming":
            return protocol.Source(name, "streaming", None)
        state = "reconnecting" if cam.state in ("connecting", "backoff") else cam.state
        return protocol.Source(name, state, None if cam.last_error is None else redact(cam.last_error))

    async def _forget(self, session: PeerSession, reason: str | None) -> None:
        self.sessions.pop(session.id, None)
        self.registry.remove(f"session:{session.id}")
        await self.models.release_all(f"session:{session.id}")
        if session.camera is not None:
            self.networks[session.camera].remove(session.id)
        if reason is not None:
            self.closed[reason] = self.closed.get(reason, 0) + 1
            self.metrics.sessions_closed.labels(reason).inc()
            log.info("session %s: closed (%s) after %.1f s", session.id, reason, time.monotonic() - session.created_s)

    # --- the model -----------------------------------------------------------------------------------------

    async def deploy(self, name: str, camera: str | None = None) -> ServedModel:
        """Serve model ``name`` on ``camera`` only, or as the box's default (``edge_app.placement``), without
        dropping a session or a camera; the viewers of what moved get a ``model`` message."""
        return await self.placement.deploy(name, camera, self._moved)

    async def as_configured(self, camera: str) -> ServedModel:
        return await self.placement.as_configured(camera, self._moved)

    def _moved(self, cameras: list[str], browsers: bool, model: ServedModel) -> None:
        for s in self.sessions.values():
            if (s.camera is None and browsers) or s.camera in cameras:
                s.channel.model_changed(model.class_names, model.service.num_exits,
                                        model.service.backend.manifest.name)
        if browsers:
            self.metrics.set_model(model.service.backend.manifest.name, model.service.backend.providers[0])

    # --- shutdown and status -------------------------------------------------------------------------------

    async def stop(self) -> None:
        timeout = self.config.server.shutdown_timeout_s
        log.info("shutdown: closing %d session(s) and %d camera(s)", len(self.sessions), len(self.sources))
        closers = [s.close("shutdown") for s in list(self.sessions.values())]
        closers += [e.pipeline.stop() for e in self.registry.entries("camera")]
        closers += [c.stop() for c in self.sources.values()]
        try:
            await asyncio.wait_for(asyncio.gather(*closers, return_exceptions=True), timeout)
        except TimeoutError:
            log.warning("shutdown: peers and cameras did not all close within %.1f s", timeout)
        await self.models.stop()
        self.media.shutdown(wait=False, cancel_futures=True)
        log.info("shutdown: done (%d session(s) left open)", len(self.sessions))

    def status(self) -> dict[str, Any]:
        return {
            "sessions": [s.status() for s in self.sessions.values()],
            "sessions_closed": dict(sorted(self.closed.items())),
            "cameras": [self._camera_status(name) for name in self.sources],
            "operating_point": None if self.default.governor is None else self.default.governor.status(),
            "models": self.models.status(),
        }

    def _camera_status(self, name: str) -> dict[str, Any]:
        pipe = self.registry.camera(name)
        tally, last = pipe.tally, pipe.tally.last
        return {
            **self.sources[name].status(),
            "frames_analysed": tally.analysed, "frames_dropped_stale": pipe.slot.dropped,
            "analysis_errors": tally.errors, "deadline_misses": tally.deadline_misses, "answers": tally.counts(),
            "viewers": len(self.viewers(name)), "frames_rendered": pipe.rendered,
            "region": None if pipe.region is None else list(pipe.region),
            "model": self.placement.status(name),
            "live_accuracy": tally.live_accuracy(), "exit0": tally.exit0(), **self.video.status(name),
            "last_result": None if last is None else {"label": self.model_of(name).class_names[last.smoothed_class],
                                                      "confidence": round(last.smoothed_confidence, 3),
                                                      "exit": last.exit},
        }
