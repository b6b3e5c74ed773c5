"""Exit 0 in a real pipeline: the shipped model (its policy fitted on video with exit 0), the demo camera holding
each labelled picture 10 s at 15 fps, the pipeline as the hub builds it. While a picture the model is sure of holds,
exit 0 answers every frame but one in ``MAX_SINCE`` (the model runs again that often); every frame is answered or
counted; each change to a picture the model knows is noticed within a few frames; the tally's figures say so. (On a
still picture the model stays unsure of, the index runs the model again on most frames: its chain assumes each run
is a fresh look; docs/exit0.md.)"""

from __future__ import annotations

import asyncio
import json
import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import cv2
import numpy as np
import pytest

from edge_app.config import AppConfig, ModelConfig
from edge_app.decision.decide import PipelineSettings
from edge_app.decision.scheduler import policy_from_config
from edge_app.metrics import Metrics
from edge_app.peer.monitor import JSON_RESULT_BYTES
from edge_app.pipeline import AnalysisPipeline, Engine
from edge_app.results import AnalysedFrame, NetworkView
from edge_app.sources import DEMO_FRAMES
from models.runtime import ModelRuntime
from models.service import InferenceService
from models.video import MAX_SINCE
from streams.demo import DemoCamera
from streams.netstats import BitrateEstimator, RttEstimator, snapshot

DEFAULT_MODEL = Path(__file__).resolve().parents[1] / "models" / "default"
FPS, HOLD_S = 15.0, 10.0


def _known(rt: ModelRuntime) -> list[bool]:
    """Which demo pictures full depth names right (a change to one it does not know is not the policy's to notice)."""
    index = json.loads((DEMO_FRAMES / "labels.json").read_text())["frames"]
    out = []
    for item in index:
        rgb = cv2.cvtColor(cv2.imread(str(DEMO_FRAMES / item["file"])), cv2.COLOR_BGR2RGB)
        out.append(rt.class_names[int(rt.all_exits(rgb)[-1].argmax())] == str(item["label"]))
    return out


@pytest.mark.live
@pytest.mark.slow
async def test_a_static_camera_is_answered_mostly_at_exit0_and_its_changes_are_noticed() -> None:
    cfg = AppConfig(model=ModelConfig(path=DEFAULT_MODEL))
    rt = ModelRuntime.load(DEFAULT_MODEL, threads=1, warmup=1)
    policy = policy_from_config(cfg.policy, cfg.model_path)
    assert policy.exit0 is not None, "the shipped policy is fitted on video with exit 0"
    service = InferenceService(rt, 1, cfg.model.cost_window)
    media = ThreadPoolExecutor(2)
    engine = Engine(service=service, policy=policy, metrics=Metrics(rt.manifest.name, rt.providers, rt.num_exits),
                    media=media)
    view = NetworkView(snapshot(RttEstimator(30.0), BitrateEstimator(5e6)), JSON_RESULT_BYTES)
    cam = DemoCamera("cam", DEMO_FRAMES, fps=FPS, hold=int(HOLD_S * FPS), size=384)
    got: list[AnalysedFrame] = []
    service.start()
    cam.start()
    assert cam.slot is not None
    pipe = AnalysisPipeline("cam", "cam", cam.slot, engine, PipelineSettings(budget=cfg.budget,
                                                                             smoothing=cfg.smoothing), view)
    pipe.subscribe(got.append, video=False)
    pipe.start()
    try:
        t_end = time.monotonic() + 2.6 * HOLD_S  # three pictures: two changes
        while time.monotonic() < t_end:
            await asyncio.sleep(0.1)
    finally:
        await cam.stop()
        await pipe.stop()
        await service.stop()
        media.shutdown()
    counts, exit0 = pipe.tally.counts(), pipe.tally.exit0()
    results = [af.result for af in got]
    known = _known(rt)
    labels = [str(item["label"]) for item in json.loads((DEMO_FRAMES / "labels.json").read_text())["frames"]]
    delays = []
    for i in range(1, len(results)):
        if results[i].truth != results[i - 1].truth and known[labels.index(results[i].truth)]:
            after = [r.smoothed_correct for r in results[i:]]
            delays.append(after.index(True) if True in after else len(after))
    unchanged = [r for r in results if r.unchanged]
    accuracy = np.mean([r.smoothed_correct for r in results])
    first = [r for r in results if r.truth == results[0].truth and r.seq < HOLD_S * FPS]  # the first picture
    runs_first = [r.seq for r in first if not r.unchanged]
    print(f"exit 0 live: {len(results)} results, {len(unchanged)} at exit 0 ({exit0}); smoothed accuracy "
          f"{accuracy:.3f}; changes noticed after {delays} frames; the first picture ({first[0].truth}, "
          f"{len(first)} frames) ran the model at frames {runs_first}; answers {counts}")
    assert counts["arrived"] == counts["on_time"] + counts["late"] + sum(counts["unanswered"].values()) + counts[
        "pending"] and counts["pending"] <= 2, counts
    assert len(results) == counts["on_time"] + counts["late"], "every answer reached the subscriber"
    assert all(r.exit == 0 and r.exits_run == 0 and r.reused for r in unchanged)
    assert exit0["frames"] == len(unchanged) and 0 < exit0["compute_share_of_full_depth"] < 1, exit0
    assert known[labels.index(first[0].truth)] and first[0].smoothed_correct, "a picture the model knows"
    assert len(runs_first) <= len(first) // MAX_SINCE + 1, f"once, then every {MAX_SINCE} frames: {runs_first}"
    assert delays and max(delays) <= 5, f"a change is noticed within a few frames: {delays}"
