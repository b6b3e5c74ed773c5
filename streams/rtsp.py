"""RTSP camera ingest with PyAV: one decoder thread per camera, latest frame only, reconnect with backoff.

``RtspCamera.start()`` starts a thread that opens the camera with PyAV
(``rtsp_transport`` tcp or udp, open and read timeouts so a stalled camera
is noticed; transport ``auto`` tries TCP first, which cameras behind NAT
need, and UDP when the camera answers that it does not take TCP), decodes
video, and ``put``s every frame into the camera's
``LatestSlot`` on the event loop.  When the camera is not there yet, drops,
stalls or ends, the thread logs it, waits (capped exponential backoff:
``backoff_initial_s`` doubling up to ``backoff_max_s``, reset once frames
flow again) and reconnects, until ``await stop()``.  ``state``,
``reconnects``, ``frames``, ``transport_in_use`` and ``last_error`` are read
by the status endpoint and the metrics.  The URL's password never appears in
any of them or in the log (``streams.redact``).

The thread demuxes before it decodes: each compressed packet goes to ``packet_sink`` when one is set (the
camera's own H.264 forwarded to viewers with no transcode, ``streams.passthrough``), then to the decoder.
``codec`` describes the camera's stream (codec, profile, parameter sets, whether B-frames were seen).

aiortc's ``MediaPlayer`` is not used: it does not reconnect and its queue is
unbounded.
"""

from __future__ import annotations

import asyncio
import errno
import logging
import threading
import time
from dataclasses import dataclass
from typing import Any, Literal

import av
from av.video.frame import PictureType

from streams.codecinfo import CodecInfo, PacketSink, passthrough_problem
from streams.frames import LatestSlot, SourceFrame
from streams.redact import add_url_secrets, redact, redact_url
from streams.source import common_status

log = logging.getLogger(__name__)

CameraState = Literal["connecting", "streaming", "backoff", "stopped"]
Transport = Literal["tcp", "udp"]
STATES: tuple[CameraState, ...] = ("connecting", "streaming", "backoff", "stopped")


@dataclass(frozen=True)
class Backoff:
    initial_s: float = 0.5
    max_s: float = 10.0

    def delay_s(self, failures: int) -> float:
        """Wait before reconnect number ``failures`` (1-based): initial, 2x, 4x, ... capped at max."""
        return float(min(self.max_s, self.initial_s * 2 ** max(0, failures - 1)))


class RtspCamera:
    def __init__(self, name: str, url: str, transport: str = "auto", open_timeout_s: float = 5.0,
                 read_timeout_s: float = 5.0, backoff: Backoff | None = None) -> None:
        if transport not in ("auto", "tcp", "udp"):
            raise ValueError(f"transport must be auto, tcp or udp, not {transport!r}")
        add_url_secrets(url)
        self.name = name
        self.url = url
        self.safe_url = redact_url(url)
        self.transport = transport  # as configured
        self.transport_in_use: str = "udp" if transport == "udp" else "tcp"
        self.open_timeout_s = open_timeout_s
        self.read_timeout_s = read_timeout_s
        self.backoff = backoff or Backoff()
        self.state: CameraState = "stopped"
        self.frames = 0
        self.reconnects = 0  # connection attempts after the first
        self.connects = 0  # times frames started to flow
        self.decode_errors = 0  # packets the decoder refused (skipped)
        self.last_error: str | None = None
        self.resolution: tuple[int, int] | None = None  # (width, height) of the last frame
        self.slot: LatestSlot[SourceFrame] | None = None
        self.codec: CodecInfo | None = None
        self.packet_sink: PacketSink | None = None
        self._fell_back_to: set[Transport] = set()
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None

    def start(self) -> None:
        """Start the reader thread; frames go to ``self.slot`` (created here, on the running loop)."""
        self.slot = LatestSlot()
        self._stop.clear()
        self._thread = threading.Thread(target=self._run, name=f"rtsp-{self.name}", daemon=True)
        self._thread.start()

    async def stop(self) -> None:
        self._stop.set()
        if self._thread is not None:
            await asyncio.to_thread(self._thread.join, self.read_timeout_s + self.open_timeout_s + 1)
            if self._thread.is_alive():
                log.warning("camera %s: reader thread did not stop in time", self.name)
            self._thread = None
        if self.slot is not None:
            self.slot.close()
        self.state = "stopped"

    kind = "rtsp"
    labelled = False

    def status(self) -> dict[str, Any]:
        """What ``/status`` shows of this source (no secret: the URL's password is masked)."""
        return {**common_status(self), "transport": self.transport, "decode_errors": self.decode_errors}

    def forward_problem(self) -> str | None:
        """Why this source's compressed stream cannot go to a browser as it is (None: it can)."""
        return passthrough_problem(self.codec)

    def _open(self) -> Any:
        options = {"rtsp_transport": self.transport_in_use, "fflags": "nobuffer", "flags": "low_delay"}
        return av.open(self.url, options=options, timeout=(self.open_timeout_s, self.read_timeout_s))

    def _pace(self, packet: Any) -> None:
        """Wait until ``packet`` is due (a live camera's packets are due when they come)."""

    def _ended(self) -> bool:
        """The stream ended: True to read it again at once (a file loops), False to reconnect after a backoff."""
        return False

    def _run(self) -> None:
        failures = 0
        while not self._stop.is_set():
            if failures:
                self.reconnects += 1
            self.state = "connecting"
            log.info("camera %s: connecting to %s (%s)%s", self.name, self.safe_url, self.transport_in_use,
                     f", attempt {failures + 1}" if failures else "")
            try:
                while self._stream_once():
                    failures = 0  # frames flowed: the next failure starts the backoff afresh
                    if self._stop.is_set() or not self._ended():
                        break
                if self._stop.is_set():
                    break
                self.last_error = "stream ended"
                log.warning("camera %s: stream ended; reconnecting", self.name)
            except (av.FFmpegError, OSError) as exc:
                self.last_error = self._describe(exc)  # before the state changes: it tells which timeout
                if self._refused_transport(exc) and self.transport == "auto":
                    fallback: Transport = "udp" if self.transport_in_use == "tcp" else "tcp"
                    if fallback not in self._fell_back_to:  # one line per transport, however often it happens
                        self._fell_back_to.add(fallback)
                        log.info("camera %s: the camera does not take RTSP over %s; trying %s", self.name,
                                 self.transport_in_use.upper(), fallback.upper())
                    self.transport_in_use = fallback
                    if fallback == "udp":
                        continue  # at once: this is no failure of the camera's
                log.warning("camera %s: %s", self.name, self.last_error)
            failures += 1
            delay = self.backoff.delay_s(failures)
            self.state = "backoff"
            log.info("camera %s: retrying in %.1f s", self.name, delay)
            self._stop.wait(delay)
        self.state = "stopped"

    @staticmethod
    def _refused_transport(exc: Exception) -> bool:
        """RTSP 461 Unsupported Transport: FFmpeg reports it as EPROTONOSUPPORT ([Errno 93])."""
        return isinstance(exc, OSError) and exc.errno == errno.EPROTONOSUPPORT

    def _describe(self, exc: Exception) -> str:
        """What went wrong, in words, with no secret: which timeout, which transport was refused."""
        if isinstance(exc, av.ExitError) or "Immediate exit requested" in str(exc):
            if self.state == "streaming":
                return f"stalled: no data for {self.read_timeout_s:g} s (read_timeout_s)"
            return f"no answer within {self.open_timeout_s:g} s (open_timeout_s)"
        if self._refused_transport(exc):
            other = "udp" if self.transport_in_use == "tcp" else "tcp"
            hint = "" if self.transport == "auto" else f' (set transport = "{other}" or "auto")'
            return f"the camera refuses RTSP over {self.transport_in_use.upper()}{hint}"
        if isinstance(exc, OSError) and exc.strerror:
            return redact(f"{exc.strerror} (errno {exc.errno})" if exc.errno else exc.strerror)
        return redact(str(exc))

    def _stream_once(self) -> bool:
        """Open, demux and decode until the stream ends or stop is asked; True if any frame was decoded."""
        got_frame = False
        with self._open() as container:
            stream = container.streams.video[0]
            ctx = stream.codec_context
            codec = self.codec = CodecInfo(ctx.name, ctx.profile, ctx.format.name if ctx.format else None,
                                           bytes(ctx.extradata or b""), b_frames=bool(ctx.has_b_frames))
            last_pts: int | None = None
            for packet in container.demux(stream):
                if self._stop.is_set():
                    break
                self._pace(packet)
                now = time.monotonic()
                if packet.size:  # the last one is empty: it flushes the decoder
                    if packet.pts is not None:
                        if last_pts is not None and packet.pts < last_pts:
                            codec.b_frames = True  # out of presentation order: the stream reorders
                        last_pts = packet.pts
                    if packet.is_keyframe:
                        codec.keyframes += 1
                    sink = self.packet_sink
                    if sink is not None:
                        sink(packet, codec, now)
                try:
                    frames = packet.decode()
                except av.InvalidDataError as exc:  # one bad packet (a loss, a cut-off read) is skipped, not fatal
                    self.decode_errors += 1
                    if self.decode_errors == 1 or self.decode_errors % 100 == 0:
                        log.warning("camera %s: a packet would not decode (%d so far): %s", self.name,
                                    self.decode_errors, redact(str(exc)))
                    continue
                for frame in frames:
                    if frame.pict_type == PictureType.B:
                        codec.b_frames = True
                    got_frame = True
                    if self.state != "streaming":  # (a file read again from its start goes on streaming)
                        self.connects += 1
                        self.state = "streaming"
                        self.last_error = None
                        log.info("camera %s: streaming %dx%d %s%s", self.name, frame.width, frame.height,
                                 codec.name, f" ({codec.profile})" if codec.profile else "")
                    self.resolution = (frame.width, frame.height)
                    assert self.slot is not None
                    self.slot.put_threadsafe(SourceFrame(frame, self.frames, now, self.name))
                    self.frames += 1
        return got_frame
