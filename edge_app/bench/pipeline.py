"""``edge-app bench-pipeline``: the live per-frame path at 640x480, 30 fps, stage by stage, over time, for a
source watched as video and for one watched through results only (sent at 640x480, and at the size the server
asks of a browser that wants only results: twice the model's input height), in one run.

What runs is what ``serve`` runs for one browser camera, minus the sockets:
VP8 packets (encoded up front from a labelled demo video, or from a
synthetic one) arrive on a 30 fps clock and are decoded in a decoder thread
with aiortc's own ``Vp8Decoder``; frames go through a ``LatestSlot`` into
the real ``AnalysisPipeline`` (DECIDE: budget, scheduler with the configured
policy on the inference service, smoothing).  In the *video* mode the
subscriber wants video, so RENDER annotates each frame and a second
latest-frame slot feeds aiortc's ``Vp8Encoder`` in an encoder thread; in the
*results* mode the subscriber wants results only, so nothing is rendered or
encoded and each result is serialised as the data channel would send it.

Per mode it prints, per time window, frames analysed per second, stale drops,
server-side latency p50/p95 (packet in -> encoded frame, or -> result JSON)
and the process's RSS, then per-stage medians and the process's CPU per
second; at the end both modes side by side.
"""

from __future__ import annotations

import asyncio
import fractions
import statistics
import sys
import time
from collections import defaultdict
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from pathlib import Path

import av
import numpy as np
from aiortc.codecs.vpx import Vp8Decoder, Vp8Encoder
from aiortc.jitterbuffer import JitterFrame

from edge_app import protocol
from edge_app.bench.testvideo import LabelledVideo
from edge_app.config import AppConfig
from edge_app.decision.decide import PipelineSettings
from edge_app.decision.scheduler import policy_from_config
from edge_app.metrics import Metrics
from edge_app.pipeline import AnalysisPipeline, Engine
from edge_app.results import AnalysedFrame, NetworkView
from models.service import InferenceService
from streams.frames import LatestSlot, SlotClosed, SourceFrame
from streams.netstats import NetworkEstimate

FPS = 30
HEADER = f"{'window':>13} {'frames/s':>9} {'dropped':>8} {'latency p50':>12} {'p95 ms':>8} {'RSS MB':>8}"
STAGE_NAMES = {"convert": "convert to RGB", "preprocess": "pre-process", "annotate": "annotate (+ I420)"}
WIDTH, HEIGHT = 640, 480


def source_video(npz: Path | None, frames: int = 300, width: int = WIDTH, height: int = HEIGHT) -> LabelledVideo:
    """Demo test frames when a split is given, else synthetic moving noise (no train extra needed)."""
    if npz is not None:
        with np.load(npz) as z:
            images, labels = z["images"], z["labels"]
        n = max(1, frames // 3)
        return LabelledVideo(images[:n], labels[:n], hold=3, width=width, height=height)
    rng = np.random.default_rng(0)
    base = rng.integers(0, 256, (8, 8, 3), dtype=np.uint8)
    images = np.stack([np.kron(np.roll(base, i, axis=1), np.ones((12, 12, 1), np.uint8)) for i in range(frames // 3)])
    return LabelledVideo(images, np.zeros(len(images), np.int64), hold=3, width=width, height=height)


def encode_vp8(video: LabelledVideo, bitrate: int = 1_000_000) -> list[bytes]:
    """The video as VP8 frames (what arrives from a browser, once depacketised)."""
    codec = av.CodecContext.create("libvpx", "w")
    codec.width, codec.height, codec.pix_fmt = video.width, video.height, "yuv420p"
    codec.bit_rate = bitrate
    codec.time_base = fractions.Fraction(1, FPS)
    codec.options = {"deadline": "realtime", "cpu-used": "-6", "lag-in-frames": "0"}
    out = []
    for i, rgb in enumerate(video.frames()):
        frame = av.VideoFrame.from_ndarray(rgb, format="rgb24").reformat(format="yuv420p")
        frame.pts = i
        out.append(b"".join(bytes(p) for p in codec.encode(frame)))
    out[-1] += b"".join(bytes(p) for p in codec.encode(None))
    return out


@dataclass
class Samples:
    stages: dict[str, list[float]] = field(default_factory=lambda: defaultdict(list))
    windows: list[tuple[float, list[float], int, int, float]] = field(default_factory=list)
    offered: int = 0
    decoded: int = 0
    encoded: int = 0
    exits: list[int] = field(default_factory=lambda: [0, 0, 0])
    cpu_s: float = 0.0
    wall_s: float = 0.0
    rendered: int = 0
    analysed: int = 0


def rss_mb() -> float:
    with open("/proc/self/status") as f:
        for line in f:
            if line.startswith("VmRSS:"):
                return int(line.split()[1]) / 1024
    return float("nan")


async def run(cfg: AppConfig, service: InferenceService, duration_s: float, window_s: float, npz: Path | None,
              progress: bool = True) -> str:
    """The modes, one after the other, on the same service; their reports and a comparison. "results-small": results
    only, with the browser sending twice the model's input height (256x192 for 96 px), as the server asks of a
    browser that wants only results."""
    full = encode_vp8(source_video(npz))
    lines = 2 * service.backend.manifest.input.height
    small = encode_vp8(source_video(npz, width=lines * WIDTH // HEIGHT, height=lines), bitrate=300_000)
    reports, samples = [], {}
    sizes = {"results-small": (lines * WIDTH // HEIGHT, lines)}
    for mode, packets in (("video", full), ("results", full), ("results-small", small)):
        if progress:
            print(f"\n{mode} mode ({duration_s:.0f} s)", file=sys.stderr, flush=True)
        text, s = await run_mode(cfg, service, packets, mode == "video", duration_s, window_s, progress,
                                 sizes.get(mode, (WIDTH, HEIGHT)))
        reports.append(f"== {mode} mode ==\n{text}")
        samples[mode] = s
    return "\n\n".join(reports) + "\n\n" + compare(samples)


def compare(samples: dict[str, Samples]) -> str:
    lines = ["== a source watched as video against one watched through results only (server side) ==",
             f"{'mode':<14}{'frames/s':>9}{'latency p50':>13}{'p95 ms':>8}{'CPU % of a core':>17}{'rendered':>10}"]
    for mode, s in samples.items():
        lat = [x for w in s.windows for x in w[1]]
        p50 = statistics.median(lat) if lat else float("nan")
        p95 = float(np.percentile(lat, 95)) if lat else float("nan")
        rate = s.analysed / max(s.wall_s, 1e-9)
        lines.append(f"{mode:<14}{rate:>9.1f}{p50:>13.2f}{p95:>8.2f}{100 * s.cpu_s / max(s.wall_s, 1e-9):>17.1f}"
                     f"{s.rendered:>10d}")
    v = samples.get("video")
    for name in ("results", "results-small"):
        r = samples.get(name)
        if v and r and v.cpu_s > 0:
            lines.append(f"{name} CPU / video CPU: {(r.cpu_s / r.wall_s) / (v.cpu_s / v.wall_s):.2f} "
                         "(both include the VP8 decode of the incoming stream)")
    return "\n".join(lines)


async def run_mode(cfg: AppConfig, service: InferenceService, packets: list[bytes], video_out: bool,
                   duration_s: float, window_s: float, progress: bool, size: tuple[int, int] = (WIDTH, HEIGHT),
                   around: Callable[[AnalysisPipeline], Callable[[], None]] | None = None) -> tuple[str, Samples]:
    """One mode; ``around(pipe)``, if given, is called once the pipeline is made (``bench-events`` follows it with
    the events outputs) and returns what to call when the mode ends."""
    loop = asyncio.get_running_loop()
    rt = service.backend
    metrics = Metrics(rt.manifest.name, rt.providers, rt.num_exits)
    est = NetworkEstimate(2.0, 2.0, 0.0, 1_000_000, False, False, 2.0)  # loopback: measured RTT ~1-2 ms
    view = NetworkView(est, 1_000_000 / 8 / FPS if video_out else 1200.0)
    slot: LatestSlot[SourceFrame] = LatestSlot()
    media = ThreadPoolExecutor(cfg.model.workers, thread_name_prefix="media")
    decoder_thread = ThreadPoolExecutor(1, thread_name_prefix="decoder")
    encoder_thread = ThreadPoolExecutor(1, thread_name_prefix="encoder")
    engine = Engine(service=service, policy=policy_from_config(cfg.policy, rt.folder), metrics=metrics, media=media)
    settings = PipelineSettings(budget=cfg.budget, smoothing=cfg.smoothing, truncate=cfg.policy.truncate)
    pipe = AnalysisPipeline("bench", "browser", slot, engine, settings, view)
    out_slot: LatestSlot[AnalysedFrame] = LatestSlot()
    pipe.subscribe(out_slot.put, video=video_out)
    undo = around(pipe) if around is not None else None
    s = Samples()
    arrival: dict[int, float] = {}
    window_lat: list[float] = []
    decoder, encoder = Vp8Decoder(), Vp8Encoder()
    encoder.target_bitrate = 1_000_000

    def decode(data: bytes, ts: int) -> list[av.VideoFrame]:
        t0 = time.perf_counter()
        frames = decoder.decode(JitterFrame(data, ts))
        s.stages["decode (VP8, aiortc)"].append((time.perf_counter() - t0) * 1e3)
        return frames  # type: ignore[return-value]

    async def network() -> None:
        t0 = time.monotonic()
        i = 0
        while time.monotonic() - t0 < duration_s:
            t_in = time.monotonic()
            frames = await loop.run_in_executor(decoder_thread, decode, packets[i % len(packets)], i * 3000)
            for f in frames:
                arrival[s.decoded] = t_in
                slot.put(SourceFrame(f, s.decoded, time.monotonic(), "bench"))
                s.decoded += 1
            s.offered += 1
            i += 1
            await asyncio.sleep(max(0.0, t0 + i / FPS - time.monotonic()))
        slot.close()

    def encode(af: AnalysedFrame, n: int) -> None:
        frame = af.video_frame()
        frame.pts, frame.time_base = n * 3000, fractions.Fraction(1, 90_000)
        t0 = time.perf_counter()
        encoder.encode(frame)
        s.stages["encode (VP8, aiortc)"].append((time.perf_counter() - t0) * 1e3)

    async def sink() -> None:
        while True:
            try:
                af = await out_slot.get()
            except SlotClosed:
                return
            r = af.result
            if video_out:
                await loop.run_in_executor(encoder_thread, encode, af, s.encoded)
                s.encoded += 1
            else:
                protocol.result(r, service.class_names, detail=True).encode()  # what the data channel sends
            s.exits[r.exit - 1] += 1
            for stage, ms in r.stages_ms.items():
                if stage in STAGE_NAMES:
                    s.stages[STAGE_NAMES[stage]].append(ms)
            for k, ms in enumerate(r.segments_ms):
                s.stages[f"segment {k + 1}"].append(ms)
            t_in = arrival.pop(r.seq, None)
            if t_in is not None:
                window_lat.append((time.monotonic() - t_in) * 1e3)
            for old in [k for k in arrival if k < r.seq]:
                del arrival[old]

    async def windows() -> None:
        t0 = time.monotonic()
        last_analysed, last_dropped = 0, 0
        while True:
            await asyncio.sleep(window_s)
            lat = list(window_lat)
            window_lat.clear()
            dropped = slot.dropped + out_slot.dropped
            s.windows.append((time.monotonic() - t0, lat, pipe.tally.analysed - last_analysed, dropped - last_dropped,
                              rss_mb()))
            last_analysed, last_dropped = pipe.tally.analysed, dropped
            if progress:
                print(_window_row(s.windows[-1], window_s), file=sys.stderr, flush=True)

    if progress:
        print(HEADER, file=sys.stderr)
    pipe.start()
    sinks = [asyncio.create_task(sink()), asyncio.create_task(windows())]
    cpu0, wall0 = time.process_time(), time.monotonic()
    await network()
    s.cpu_s, s.wall_s = time.process_time() - cpu0, time.monotonic() - wall0
    await asyncio.sleep(0.5)
    await pipe.stop()
    if undo is not None:
        undo()
    s.rendered, s.analysed = pipe.rendered, pipe.tally.analysed
    out_slot.close()
    for t in sinks:
        t.cancel()
    await asyncio.gather(*sinks, return_exceptions=True)
    for ex in (media, decoder_thread, encoder_thread):
        ex.shutdown(wait=True)
    return report(cfg, service, s, pipe, slot, out_slot, duration_s, window_s, video_out, size), s


def _window_row(w: tuple[float, list[float], int, int, float], window_s: float) -> str:
    t, lat, analysed, dropped, rss = w
    p50 = statistics.median(lat) if lat else float("nan")
    p95 = float(np.percentile(lat, 95)) if lat else float("nan")
    return f"{t - window_s:6.0f}-{t:<4.0f}s {analysed / window_s:9.1f} {dropped:8d} {p50:12.1f} {p95:8.1f} {rss:8.0f}"


def report(cfg: AppConfig, service: InferenceService, s: Samples, pipe: AnalysisPipeline,
           slot: LatestSlot[SourceFrame], out_slot: LatestSlot[AnalysedFrame], duration_s: float, window_s: float,
           video_out: bool, size: tuple[int, int] = (WIDTH, HEIGHT)) -> str:
    lines = [f"bench-pipeline: {size[0]}x{size[1]} at {FPS} fps for {duration_s:.0f} s; model "
             f"{service.backend.manifest.name} on {service.backend.device_name}; policy {cfg.policy.kind}; "
             f"inference workers {cfg.model.workers}, intra-op threads {cfg.model.threads}; subscriber wants "
             f"{'video (RENDER + VP8 encode)' if video_out else 'results only (no RENDER, no encode)'}",
             HEADER]
    lines += [_window_row(w, window_s) for w in s.windows]
    lines.append(f"\n{'stage':<24}{'median ms':>10}{'p95 ms':>9}{'runs':>8}")
    order = ["decode (VP8, aiortc)", "convert to RGB", "pre-process", "segment 1", "segment 2", "segment 3",
             "annotate (+ I420)", "encode (VP8, aiortc)"]
    for name in order:
        v = s.stages.get(name, [])
        if v:
            lines.append(f"{name:<24}{statistics.median(v):>10.3f}{np.percentile(v, 95):>9.3f}{len(v):>8d}")
    all_lat = [x for w in s.windows for x in w[1]]
    if all_lat:
        end = "annotated frame encoded" if video_out else "result JSON"
        lines.append(f"{'server latency':<24}{statistics.median(all_lat):>10.3f}{np.percentile(all_lat, 95):>9.3f}"
                     f"{len(all_lat):>8d}   (VP8 frame in -> {end})")
    exits = ", ".join(f"exit {k + 1}: {n}" for k, n in enumerate(s.exits))
    lines.append(f"process CPU: {100 * s.cpu_s / max(s.wall_s, 1e-9):.1f} % of a core over {s.wall_s:.0f} s")
    lines.append(f"\nframes: {s.offered} offered, {s.decoded} decoded, {pipe.tally.analysed} analysed, {pipe.rendered} "
                 f"rendered, {s.encoded} encoded; "
                 f"dropped as stale: {slot.dropped} before analysis, {out_slot.dropped} before the encoder; "
                 f"deadline misses {pipe.tally.deadline_misses}, analysis errors {pipe.tally.errors}; "
                 f"answers from {exits}")
    if len(s.windows) >= 2:
        mids = [w[0] for w in s.windows if w[1]]
        p50s = [statistics.median(w[1]) for w in s.windows if w[1]]
        slope = float(np.polyfit(mids, p50s, 1)[0]) * 60 if len(p50s) >= 2 else float("nan")
        first, last = s.windows[0][4], s.windows[-1][4]
        lines.append(f"trend: latency p50 {slope:+.2f} ms per minute; RSS {first:.0f} MB -> {last:.0f} MB "
                     f"({last - first:+.1f} MB) from the first to the last window")
    return "\n".join(lines)
