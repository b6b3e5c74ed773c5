"""The load-adaptive operating point: cheaper at once when the arriving frames need more compute than the
inference threads have, dearer again, a step at a time, once the load has fallen for a while; and the points
themselves come from the model's fitted chain, each cheaper than the one before."""

from __future__ import annotations

from pathlib import Path

import pytest

from edge_app.config import PolicyConfig
from edge_app.decision.governor import LoadGovernor
from edge_app.decision.scheduler import policy_from_config
from models.operating import OperatingPoint, operating_points
from models.policies import FixedExit

DEFAULT_MODEL = Path(__file__).resolve().parents[1] / "models" / "default"


def feed(g: LoadGovernor, source: str, fps: float, t0: float, t1: float) -> None:
    """``source``'s frames arriving at ``fps`` from ``t0`` to ``t1``."""
    n = round((t1 - t0) * fps)
    for k in range(n):
        g.arrived(source, t0 + k / fps)


def points3() -> list[OperatingPoint]:
    return [OperatingPoint(lam, FixedExit(1), acc, cost)
            for lam, acc, cost in ((0.86, 0.94, 0.45), (0.70, 0.93, 0.39), (0.57, 0.89, 0.32))]


def test_the_operating_point_follows_the_arrival_rate_and_comes_back() -> None:
    g = LoadGovernor(points3(), headroom=0.85, workers=2)
    feed(g, "a", 20.0, 0.0, 1.0)
    assert g.choose(1.0, 75.0) == 0, "20 fps x 0.45 x 75 ms = 68 % of the source's own second: fits"
    feed(g, "a", 30.0, 1.0, 2.0)
    assert g.choose(2.0, 75.0) == 2, "30 fps needs 101 % at the fitted point, 88 % at the next: the cheapest"
    assert g.load <= 0.85
    feed(g, "a", 20.0, 2.0, 3.0)
    assert g.choose(3.0, 75.0) == 2, "calm, but not for long yet"
    feed(g, "a", 20.0, 3.0, 4.1)
    assert g.choose(4.1, 75.0) == 1, "calm for a second with room to spare: one step dearer"
    feed(g, "a", 20.0, 4.1, 6.0)
    assert g.choose(6.0, 75.0) == 1, "the fitted point would use 68 %: not under 75 % of the headroom"
    feed(g, "a", 10.0, 6.0, 7.0)
    g.choose(7.0, 75.0)
    feed(g, "a", 10.0, 7.0, 8.1)
    assert g.choose(8.1, 75.0) == 0, "light load: back to the fitted lam"


def test_sources_share_the_inference_threads_but_each_pipeline_has_its_own_frame_interval() -> None:
    g = LoadGovernor(points3(), headroom=0.85, workers=2)
    for s in ("a", "b", "c"):
        feed(g, s, 18.0, 0.0, 1.0)
    assert g.choose(1.0, 75.0) == 1, "54 fps x 0.45 x 75 ms over two threads is 91 %: over; 0.39 fits (79 %)"
    g = LoadGovernor(points3(), headroom=0.85, workers=4)
    feed(g, "a", 25.0, 0.0, 1.0)
    g.own_work("a", 10.0)
    assert g.choose(1.0, 75.0) == 2, "one 25 fps source: (0.45 x 75 + 10) ms x 25 is 109 % of its own second"
    g.forget("a")
    assert g.choose(1.5, 75.0) == 2 and g.arrival_fps == 0.0, "a source that stopped no longer counts"


def test_frames_dropped_behind_a_busy_pipeline_move_it_cheaper_and_the_memory_expires() -> None:
    g = LoadGovernor(points3(), headroom=0.85, workers=1)
    feed(g, "a", 30.0, 0.0, 1.0)
    g.dropped(0.5)
    assert g.choose(1.0, 40.0) == 0, "expected load 54 %; one frame dropped in 30 is no trend"
    for t in (1.1, 1.4, 1.7):
        g.dropped(t)
    feed(g, "a", 30.0, 1.0, 2.0)
    assert g.choose(2.0, 40.0) == 1, "4 of 60 frames dropped over 2 s: one step cheaper whatever the model says"
    feed(g, "a", 30.0, 2.0, 6.0)
    assert g.choose(6.0, 40.0) == 1, "not back to a point that dropped at this rate lately"
    feed(g, "a", 30.0, 6.0, 22.5)
    assert g.choose(22.5, 40.0) == 1, "20 s after the drops the memory expires: calm from now"
    feed(g, "a", 30.0, 22.5, 23.6)
    assert g.choose(23.6, 40.0) == 0, "... and a calm second later, the fitted point again"


def test_the_per_frame_policy_is_cached_between_evaluations() -> None:
    calls = []
    g = LoadGovernor(points3(), headroom=0.85, workers=1, on_move=lambda p: calls.append(p.lam))
    feed(g, "a", 40.0, 0.0, 1.0)
    assert g.policy(1.0, lambda: [75.0]) is g.points[2].policy and calls == [0.57]
    assert g.policy(1.05, lambda: [1e9]) is g.points[2].policy, "within EVERY_S the point is not re-evaluated"


def test_operating_points_of_the_shipped_model_get_cheaper_and_start_at_its_policy() -> None:
    policy = policy_from_config(PolicyConfig(), DEFAULT_MODEL)
    points = operating_points(DEFAULT_MODEL, policy)
    assert points[0].policy is policy and len(points) >= 3
    costs = [p.cost for p in points]
    assert costs == sorted(costs, reverse=True) and costs[-1] < 0.8 * costs[0], costs
    assert all(0.5 < p.accuracy <= 1 for p in points)
    assert operating_points(DEFAULT_MODEL, FixedExit(3))[0].cost == 1.0, "a fixed policy has one point"


@pytest.mark.live
@pytest.mark.slow
async def test_the_server_shows_its_operating_point_and_moves_it_under_real_load() -> None:
    """Real pipelines on an emulated slower device: six 30 fps labelled streams need more than one inference
    thread can give at the fitted lam; the governor moves to a cheaper point and every stream is answered."""
    from edge_app.bench.overload import _run
    from edge_app.config import AppConfig, ModelConfig
    from models.runtime import ModelRuntime

    cfg = AppConfig(model=ModelConfig(path=DEFAULT_MODEL))
    rt = ModelRuntime.load(DEFAULT_MODEL, threads=1, warmup=1)
    out = await _run(cfg, rt, [4.0, 4.0, 4.0], 6, 3.0, adaptive=True)
    g = out["governor"]
    answered = sum(r["answered"] for r in out["rows"]) / max(1, sum(r["arrived"] for r in out["rows"]))
    print(f"governor {g}; answered {answered:.3f} of arrived")
    assert g["index"] > 0 and g["moves"] >= 1 and g["arrival_fps"] > 150, g
    assert answered > 0.85


async def test_the_index_is_re_solved_when_a_segment_gets_dearer_and_goes_there_less_often() -> None:
    """Segment 3 three times dearer than the manifest says (contention, another model): the governor re-solves the
    dynamic index from the same tables for the measured costs, in a worker thread, and the re-solved index runs
    segment 3 on fewer calibration frames; shares that stay put re-solve nothing."""
    import asyncio

    import numpy as np

    from models.folder import load_traces, policy_meta
    from models.manifest import read_manifest
    from models.operating import resolve_points
    from models.policies import run_on_trace

    policy = policy_from_config(PolicyConfig(kind="dynamic-index"), DEFAULT_MODEL)
    manifest = read_manifest(DEFAULT_MODEL)
    base = list(manifest.costs_ms)
    g = LoadGovernor(operating_points(DEFAULT_MODEL, policy), 0.85, 1,
                     resolver=lambda ms: resolve_points(DEFAULT_MODEL, policy, ms), solved_ms=base)
    g.policy(0.0, lambda: [1.1 * ms for ms in base])  # every segment 10 % slower: the same shares
    await asyncio.sleep(0.05)
    assert g.resolves == 0 and not g._resolving
    dearer = [base[0], base[1], 3 * base[2]]
    g.policy(10.0, lambda: dearer)
    for _ in range(200):
        await asyncio.sleep(0.05)
        if g.resolves:
            break
    assert g.resolves == 1 and g.solved_ms == dearer, g.status()
    probs, _ = load_traces(DEFAULT_MODEL, manifest, str(policy_meta(DEFAULT_MODEL)["calibration_traces"]))

    def reach3(p: object) -> float:
        return float(np.mean([run_on_trace(p, probs[i], 3)[0] == 3 for i in range(len(probs))]))  # type: ignore[arg-type]

    before, after = reach3(policy), reach3(g.points[0].policy)
    print(f"segment 3 run on {100 * before:.1f} % of calibration frames before, {100 * after:.1f} % re-solved")
    assert after < before - 0.02, (before, after)


def test_status_is_json_for_a_policy_without_fitted_points() -> None:
    """A fixed exit has one operating point and no calibration figures: /status must still be valid JSON (the
    page parses it; NaN is not JSON)."""
    import json

    g = LoadGovernor(operating_points(DEFAULT_MODEL, FixedExit(3)), 0.85, 1)
    status = json.loads(json.dumps(g.status(), allow_nan=False))
    assert status["lam"] is None and status["cost_fraction"] == 1.0
