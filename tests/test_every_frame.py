"""Every frame that arrives is answered or counted with a reason, and the operating point follows the arrival
rate within a second: real pipelines and the real model on an emulated slower device (segments padded to 25 ms,
full depth 75 ms: a 30 fps camera leaves 33 ms a frame)."""

from __future__ import annotations

import asyncio
import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import pytest

from edge_app.bench.emulation import EmulatedDevice
from edge_app.config import AppConfig, ModelConfig
from edge_app.decision.decide import PipelineSettings
from edge_app.decision.governor import LoadGovernor
from edge_app.decision.scheduler import policy_from_config
from edge_app.metrics import Metrics
from edge_app.peer.monitor import JSON_RESULT_BYTES
from edge_app.pipeline import AnalysisPipeline, Engine
from edge_app.results import AnalysedFrame, NetworkView
from edge_app.sources import DEMO_FRAMES
from models.operating import OperatingPoint, operating_points
from models.runtime import ModelRuntime
from models.service import InferenceService
from streams.demo import DemoCamera
from streams.netstats import BitrateEstimator, RttEstimator, snapshot

DEFAULT_MODEL = Path(__file__).resolve().parents[1] / "models" / "default"


@pytest.mark.live
async def test_arrival_faster_than_full_depth_every_frame_answered_or_counted_and_the_point_moves_at_once() -> None:
    cfg = AppConfig(model=ModelConfig(path=DEFAULT_MODEL))
    rt = ModelRuntime.load(DEFAULT_MODEL, threads=1, warmup=1)
    service = InferenceService(EmulatedDevice(rt, segment_ms=[25.0, 25.0, 25.0]), 1, cfg.model.cost_window)
    policy = policy_from_config(cfg.policy, cfg.model_path)
    moves: list[tuple[float, OperatingPoint]] = []
    governor = LoadGovernor(operating_points(cfg.model_path, policy), cfg.policy.load_headroom, 1,
                            on_move=lambda p: moves.append((time.monotonic(), p)))
    media = ThreadPoolExecutor(2)
    engine = Engine(service=service, policy=policy, metrics=Metrics(rt.manifest.name, rt.providers, rt.num_exits),
                    media=media, load=governor)
    settings = PipelineSettings(budget=cfg.budget, smoothing=cfg.smoothing)
    view = NetworkView(snapshot(RttEstimator(30.0), BitrateEstimator(5e6)), JSON_RESULT_BYTES)
    cam = DemoCamera("cam", DEMO_FRAMES, fps=30.0, hold=15, size=192)
    got: list[AnalysedFrame] = []
    service.start()
    cam.start()
    assert cam.slot is not None
    pipe = AnalysisPipeline("cam", "cam", cam.slot, engine, settings, view)
    pipe.subscribe(got.append, video=False)
    pipe.start()
    first: float | None = None
    try:
        t_end = time.monotonic() + 6.0
        while time.monotonic() < t_end:
            await asyncio.sleep(0.02)
            if first is None and pipe.slot.put_count:
                first = time.monotonic()
        await cam.stop()
        await asyncio.sleep(0.3)  # the last frame's answer
    finally:
        await pipe.stop()
        await service.stop()
        media.shutdown(wait=False, cancel_futures=True)
    counts = pipe.tally.counts()
    print(f"counts {counts}; governor {governor.status()}; first move after "
          f"{moves[0][0] - first if moves and first else None} s")
    answered = counts["on_time"] + counts["late"]
    assert counts["arrived"] == answered + sum(counts["unanswered"].values()) + counts["pending"], counts
    assert counts["pending"] == 0 and counts["arrived"] > 150, counts
    assert len(got) == answered, "every answer counted was published to the subscribers"
    assert counts["unanswered"]["error"] == 0 and counts["unanswered"]["no-answer-yet"] <= 3, counts
    skipped = [a.result for a in got if a.result.skipped]
    assert len(skipped) == counts["skipped"] and all(r.reused and r.exit == 0 for r in skipped)
    assert first is not None and moves and moves[0][0] - first <= 1.0, "the point moves within a second"
    assert governor.index > 0 and governor.point.cost < governor.points[0].cost
    assert counts["on_time"] >= 0.98 * counts["arrived"], counts
    assert counts["skipped"] <= 0.2 * counts["arrived"], "depth gives, not frames"
