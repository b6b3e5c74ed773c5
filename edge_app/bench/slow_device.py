"""``edge-app bench-slow-device``: a static-dominated camera at 30 fps on an emulated slow device (segments padded to
25 / 25 / 25 ms: full depth takes 75 ms, a frame interval 33 ms), the network good, each policy as served.

The camera plays a labelled clip rendered as ``edge_app.bench.clips`` renders them (states held 10-120 s, sensor
noise, light drift, passers-by; the demo data's test images), decoded frames straight into the real analysis
pipeline: DECIDE, the scheduler, the inference service, smoothing. For each policy: every frame that arrived, how
many were answered on time, and the accuracy of the answers (smoothed, as served) against the label of the moment
each frame was taken, over every frame that arrived (one left unanswered counts as wrong); apart, the accuracy of
the frames the model itself answered (not skipped as stale). One run, the same frames for every policy.
"""

from __future__ import annotations

import asyncio
import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any

import av
import numpy as np

from edge_app.bench.clips import ClipSpec, render
from edge_app.bench.codec_traces import demo_split
from edge_app.bench.emulation import EmulatedDevice
from edge_app.config import AppConfig, ModelConfig, PolicyConfig
from edge_app.decision.decide import PipelineSettings
from edge_app.decision.scheduler import policy_from_config
from edge_app.metrics import Metrics
from edge_app.peer.monitor import JSON_RESULT_BYTES
from edge_app.pipeline import AnalysisPipeline, Engine
from edge_app.results import AnalysedFrame, NetworkView
from models.runtime import ModelRuntime
from models.service import InferenceService
from streams.frames import LatestSlot, SourceFrame
from streams.netstats import BitrateEstimator, RttEstimator, snapshot

POLICIES = {"as shipped (auto)": PolicyConfig(kind="auto"),
            "confidence threshold, every frame": PolicyConfig(kind="confidence", threshold=0.78),
            "full depth, every frame": PolicyConfig(kind="fixed", fixed_exit=3)}


async def _play(frames: list[np.ndarray], names: list[str], fps: float, slot: LatestSlot[SourceFrame]) -> None:
    t0 = time.monotonic()
    for i, (rgb, name) in enumerate(zip(frames, names, strict=True)):
        await asyncio.sleep(max(0.0, t0 + i / fps - time.monotonic()))
        frame = av.VideoFrame.from_ndarray(rgb, format="rgb24")
        frame.pts = i
        slot.put(SourceFrame(frame, i, time.monotonic(), "clip", truth=name))


async def _one(model: Path, policy_cfg: PolicyConfig, frames: list[np.ndarray], names: list[str], fps: float,
               segment_ms: list[float]) -> dict[str, Any]:
    cfg = AppConfig(model=ModelConfig(path=model), policy=policy_cfg.model_copy(update={"adapt_to_load": False}))
    rt = ModelRuntime.load(model, threads=1, warmup=1)
    service = InferenceService(EmulatedDevice(rt, segment_ms=segment_ms), 1, cfg.model.cost_window)
    policy = policy_from_config(cfg.policy, cfg.model_path)
    media = ThreadPoolExecutor(2, thread_name_prefix="media")
    engine = Engine(service=service, policy=policy, metrics=Metrics(rt.manifest.name, rt.providers, rt.num_exits),
                    media=media)
    view = NetworkView(snapshot(RttEstimator(30.0), BitrateEstimator(5e6)), JSON_RESULT_BYTES)
    slot: LatestSlot[SourceFrame] = LatestSlot()
    got: list[AnalysedFrame] = []
    service.start()
    pipe = AnalysisPipeline("clip", "clip", slot, engine, PipelineSettings(budget=cfg.budget,
                                                                          smoothing=cfg.smoothing), view)
    pipe.subscribe(got.append, video=False)
    pipe.start()
    try:
        await _play(frames, names, fps, slot)
        await asyncio.sleep(0.5)
    finally:
        slot.close()
        await pipe.stop()
        await service.stop()
        media.shutdown()
    results = [af.result for af in got]
    analysed = [r for r in results if r.skipped is None]
    counts = pipe.tally.counts()
    return {"policy": policy.name, "arrived": counts["arrived"], "answered": len(results),
            "on_time": sum(r.deadline_met for r in results), "skipped": counts["skipped"],
            "unanswered": sum(counts["unanswered"].values()),
            # every frame that arrived in the denominator: one left unanswered counts as wrong
            "accuracy": sum(bool(r.smoothed_correct) for r in results) / max(1, counts["arrived"]),
            "accuracy_analysed": float(np.mean([bool(r.smoothed_correct) for r in analysed])) if analysed
            else float("nan"),
            "exit0": pipe.tally.exit0(), "mean_exits_run": float(np.mean([r.exits_run for r in analysed]))}


def bench_slow_device(model: Path, data: Path, seconds: float = 120.0, fps: float = 30.0,
                      segment_ms: tuple[float, ...] = (25.0, 25.0, 25.0), seed: int = 7) -> str:
    _, images, labels, classes = demo_split(data, "test")
    spec = ClipSpec(seconds, (10.0, 120.0), fps=fps, width=640, height=480, seed=seed)
    rendered = list(render(images, labels, spec))
    frames, names = [f for f, _ in rendered], [classes[label] for _, label in rendered]
    lines = [f"{len(frames)} frames of a static-dominated clip (states held 10-120 s, {len(set(names))} states' "
             f"labels) at {fps:g} fps on an emulated {'/'.join(f'{ms:g}' for ms in segment_ms)} ms device; accuracy "
             "of the answers as served (smoothed) against the label of each frame's moment", "",
             "| policy | frames answered on time | of them skipped (a newer frame came) | accuracy, every frame "
             "| accuracy, frames the pipeline took | answered at exit 0 | exits run per analysed frame |",
             "|---|---|---|---|---|---|---|"]
    for name, pc in POLICIES.items():
        r = asyncio.run(_one(model, pc, frames, names, fps, list(segment_ms)))
        e0 = r["exit0"]["share"]
        lines.append(f"| {name} ({r['policy']}) | {r['on_time']} of {r['arrived']} | {r['skipped']} | "
                     f"{100 * r['accuracy']:.1f} % | {100 * r['accuracy_analysed']:.1f} % | "
                     f"{'–' if e0 is None else f'{100 * e0:.1f} %'} | {r['mean_exits_run']:.2f} |")
    return "\n".join(lines)
