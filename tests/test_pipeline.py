"""The analysis pipeline with the real default model, fed frames directly (no sockets)."""

from __future__ import annotations

import asyncio
import itertools
import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import av
import numpy as np
import pytest

from edge_app import protocol
from edge_app.config import AppConfig, BudgetConfig, PolicyConfig, SmoothingConfig
from edge_app.decision.decide import PipelineSettings
from edge_app.decision.scheduler import policy_from_config
from edge_app.metrics import Metrics
from edge_app.pipeline import AnalysisPipeline, Engine
from edge_app.results import AnalysedFrame, NetworkView
from models.runtime import ModelRuntime
from models.service import InferenceService
from streams.frames import LatestSlot, SourceFrame
from streams.netstats import NetworkEstimate
from streams.stamp import draw_stamp, read_stamp

REPO = Path(__file__).resolve().parents[1]


@pytest.fixture(scope="module")
def runtime() -> ModelRuntime:
    return ModelRuntime.load(REPO / "models" / "default", threads=1, warmup=1)


def pipeline(runtime: ModelRuntime, slot: LatestSlot[SourceFrame], pool: ThreadPoolExecutor, metrics: Metrics,
             network: NetworkView, policy: PolicyConfig | None = None, probe: bool = False,
             budget: BudgetConfig | None = None) -> AnalysisPipeline:
    service = InferenceService(runtime)
    service.start()
    pol = policy or PolicyConfig()
    engine = Engine(service=service, policy=policy_from_config(pol, runtime.folder), metrics=metrics, media=pool)
    settings = PipelineSettings(budget=budget or BudgetConfig(), smoothing=SmoothingConfig(), truncate=pol.truncate,
                                probe=probe)
    return AnalysisPipeline("test", "browser", slot, engine, settings, network)


def view(rtt_ms: float, bitrate_bps: float = 1e6) -> NetworkView:
    return NetworkView(NetworkEstimate(rtt_ms, rtt_ms, 0.0, bitrate_bps, False, False, rtt_ms), bitrate_bps / 8 / 30)


async def run_frames(runtime: ModelRuntime, frames: list[np.ndarray], network: NetworkView,
                     policy: PolicyConfig | None = None, probe: bool = False,
                     budget: BudgetConfig | None = None, metrics: Metrics | None = None,
                     video: bool = True) -> list[AnalysedFrame]:
    metrics = metrics or Metrics("m", runtime.providers, runtime.num_exits)
    slot: LatestSlot[SourceFrame] = LatestSlot()
    with ThreadPoolExecutor(1) as pool:
        pipe = pipeline(runtime, slot, pool, metrics, network, policy, probe, budget)
        out: list[AnalysedFrame] = []
        pipe.subscribe(out.append, video=video)
        pipe.start()
        for i, rgb in enumerate(frames):
            slot.put(SourceFrame(av.VideoFrame.from_ndarray(rgb, format="rgb24"), i, time.monotonic(), "test"))
            while len(out) < i + 1:  # one at a time: no frame is stale
                await asyncio.sleep(0.001)
        await pipe.stop()
    text = metrics.exposition().decode()
    assert f'edge_frames_analysed_total{{source="browser"}} {float(len(frames))}' in text
    return out


def frames_with_stamps(n: int) -> list[np.ndarray]:
    rng = np.random.default_rng(0)
    out = []
    for i in range(n):
        img = rng.integers(0, 256, (480, 640, 3), dtype=np.uint8)
        draw_stamp(img, i)
        out.append(img)
    return out


async def test_every_frame_gets_a_complete_result(runtime: ModelRuntime) -> None:
    out = await run_frames(runtime, frames_with_stamps(12), view(2.0), probe=True)
    assert [o.result.stamp for o in out] == list(range(12))
    msg = protocol.result(out[-1].result, runtime.class_names, detail=True).to_json()
    for key in ("frame", "stamp", "raw", "smoothed", "exit", "exits_run", "horizon", "costs", "budget", "network",
                "stages_ms", "latency_ms", "deadline_met", "frame_size"):
        assert key in msg
    assert msg["frame_size"] == [640, 480]
    assert 1 <= msg["exit"] <= msg["exits_run"] <= msg["horizon"] <= 3
    assert len(msg["costs"]["segments_ms"]) == msg["exits_run"]
    assert msg["budget"]["total_ms"] == 250.0 and msg["deadline_met"]
    assert msg["raw"]["label"] in runtime.class_names
    annotated = out[-1].video_frame().to_ndarray(format="rgb24")
    assert annotated.shape == (480, 640, 3) and read_stamp(annotated) == 11


async def test_a_lost_deadline_still_answers_from_exit_one(runtime: ModelRuntime) -> None:
    out = await run_frames(runtime, frames_with_stamps(6), view(400.0), PolicyConfig(kind="fixed", fixed_exit=3),
                           budget=BudgetConfig(reuse_when_late=False))
    for o in out:
        r = o.result
        assert r.budget.compute_ms < 0 and r.horizon == 1 and r.exits_run == 1 and r.exit == 1
        assert not r.deadline_met and not r.reused


async def test_a_lost_deadline_reuses_the_answer_so_far_but_not_for_long(runtime: ModelRuntime) -> None:
    metrics = Metrics("m", runtime.providers, runtime.num_exits)
    out = await run_frames(runtime, frames_with_stamps(7), view(400.0), probe=True,
                           budget=BudgetConfig(max_reused_in_a_row=2), metrics=metrics)
    rs = [o.result for o in out]
    assert [r.reused for r in rs] == [False, True, True, False, True, True, False]  # the first has nothing to reuse
    assert [r.exits_run for r in rs] == [1, 0, 0, 1, 0, 0, 1]
    for prev, r in itertools.pairwise(rs):
        if r.reused:
            assert r.exit == 0 and r.segments_ms == () and r.stages_ms["inference"] == 0.0
            assert (r.raw_class, r.smoothed_class) == (prev.smoothed_class, prev.smoothed_class)
            assert protocol.result(r, runtime.class_names, detail=False).to_json()["reused"] is True
    assert [r.stamp for r in rs] == list(range(7))  # every frame answered, in order
    text = metrics.exposition().decode()
    assert 'edge_answers_reused_total{source="browser"} 4.0' in text
    assert 'edge_exit_chosen_total{exit="1"} 3.0' in text
    # a baseline without deadline truncation never reuses
    base = await run_frames(runtime, frames_with_stamps(3), view(400.0),
                            PolicyConfig(kind="fixed", fixed_exit=3, truncate=False))
    assert not any(o.result.reused for o in base) and all(o.result.exits_run == 3 for o in base)


async def test_an_ample_budget_runs_full_depth(runtime: ModelRuntime) -> None:
    deep = await run_frames(runtime, frames_with_stamps(4), view(2.0), PolicyConfig(kind="budget-greedy"))
    assert [o.result.exits_run for o in deep] == [3, 3, 3, 3]
    assert all(o.result.exit == 3 for o in deep)


def test_policy_from_config_kinds(runtime: ModelRuntime) -> None:
    names = {"dynamic-index": "dynamic-index", "fixed": "fixed-3", "confidence": "confidence", "entropy": "entropy",
             "patience": "patience", "budget-greedy": "budget-greedy"}
    for kind, name in names.items():
        p = policy_from_config(PolicyConfig(kind=kind), runtime.folder)  # type: ignore[arg-type]
        assert p.name == name
    refit = policy_from_config(PolicyConfig(lam=0.3), runtime.folder)
    assert refit.name == "dynamic-index" and refit.lam == pytest.approx(0.3)  # type: ignore[attr-defined]
    assert AppConfig().policy.kind == "auto"


async def test_frames_of_unexpected_size_and_format_are_analysed(runtime: ModelRuntime) -> None:
    """What a camera or browser may send: odd and tiny sizes, portrait, grey, 4:4:4, 10-bit; each gets a result."""
    rng = np.random.default_rng(1)
    cases = [("rgb24", (479, 641)), ("rgb24", (2, 2)), ("rgb24", (1080, 608)), ("gray", (240, 320)),
             ("yuv444p", (240, 320)), ("yuv420p10le", (240, 320)), ("nv12", (120, 160))]
    metrics = Metrics("m", runtime.providers, runtime.num_exits)
    slot: LatestSlot[SourceFrame] = LatestSlot()
    out: list[AnalysedFrame] = []
    with ThreadPoolExecutor(1) as pool:
        pipe = pipeline(runtime, slot, pool, metrics, view(2.0))
        pipe.subscribe(out.append, video=True)
        pipe.start()
        for i, (fmt, (h, w)) in enumerate(cases):
            rgb = av.VideoFrame.from_ndarray(rng.integers(0, 256, (h, w, 3), dtype=np.uint8), format="rgb24")
            frame = rgb if fmt == "rgb24" else rgb.reformat(format=fmt)
            slot.put(SourceFrame(frame, i, time.monotonic(), "odd"))
            for _ in range(2000):
                if len(out) + pipe.tally.errors > i:
                    break
                await asyncio.sleep(0.001)
        await pipe.stop()
    assert pipe.tally.errors == 0 and len(out) == len(cases), (pipe.tally.errors, len(out))
    assert all(o.result.raw_class in range(len(runtime.class_names)) for o in out)
    assert [o.result.frame_size for o in out] == [(w, h) for _, (h, w) in cases]  # as decoded, before the crop


async def test_a_source_nobody_watches_as_video_is_never_rendered(runtime: ModelRuntime) -> None:
    """RENDER (annotation + I420) runs only while some subscriber wants video; results flow either way."""
    metrics = Metrics("m", runtime.providers, runtime.num_exits)
    slot: LatestSlot[SourceFrame] = LatestSlot()
    results_only: list[AnalysedFrame] = []
    with_video: list[AnalysedFrame] = []
    frames = frames_with_stamps(12)

    async def feed(pipe: AnalysisPipeline, start: int, n: int, out: list[AnalysedFrame]) -> None:
        for i in range(start, start + n):
            slot.put(SourceFrame(av.VideoFrame.from_ndarray(frames[i], format="rgb24"), i, time.monotonic(), "t"))
            while len(out) < i + 1:
                await asyncio.sleep(0.001)

    with ThreadPoolExecutor(1) as pool:
        pipe = pipeline(runtime, slot, pool, metrics, view(2.0))
        pipe.subscribe(results_only.append, video=False)
        pipe.start()
        await feed(pipe, 0, 4, results_only)
        rendered_alone = pipe.rendered
        pipe.subscribe(with_video.append, video=True)  # a video viewer joins
        await feed(pipe, 4, 4, results_only)
        rendered_with_viewer = pipe.rendered
        pipe.unsubscribe(with_video.append)  # and leaves
        await feed(pipe, 8, 4, results_only)
        await pipe.stop()
    assert rendered_alone == 0 and all(o.i420 is None for o in results_only[:4])
    assert all("annotate" not in o.result.stages_ms for o in results_only[:4])
    assert rendered_with_viewer == 4 and all(o.i420 is not None for o in results_only[4:8])
    assert pipe.rendered == 4 and all(o.i420 is None for o in results_only[8:]), "no viewer left: no RENDER"
    assert len(results_only) == 12 and len(with_video) == 4
    with pytest.raises(ValueError, match="not rendered"):
        results_only[0].video_frame()
