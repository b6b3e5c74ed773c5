"""The load-adaptive operating point: cheaper at once when the arriving frames need more compute than the
inference threads have, dearer again, a step at a time, once the load has fallen for a while; and the points
themselves come from the model's fitted chain, each cheaper than the one before."""

from __future__ import annotations

from pathlib import Path

from edge_app.config import PolicyConfig
from edge_app.governor import LoadGovernor
from edge_app.scheduler import policy_from_config
from models.operating import OperatingPoint, operating_points
from models.policies import FixedExit

DEFAULT_MODEL = Path(__file__).resolve().parents[1] / "models" / "default"


def test_the_operating_point_moves_under_load_and_back() -> None:
    points = [OperatingPoint(lam, FixedExit(1), acc, cost)
              for lam, acc, cost in ((0.86, 0.94, 0.45), (0.70, 0.93, 0.39), (0.57, 0.89, 0.32))]
    g = LoadGovernor(points, headroom=0.85, workers=1)
    assert g.choose(0.0, 20.0, 75.0) == 0, "20 fps x 0.45 x 75 ms = 68 % of one thread: fits"
    assert g.choose(1.0, 30.0, 75.0) == 2, "30 fps needs 101 % at the fitted point, 88 % at the next: cheapest now"
    assert g.load <= 0.85
    assert g.choose(2.0, 20.0, 75.0) == 2, "calm, but not for long yet"
    assert g.choose(5.5, 20.0, 75.0) == 1, "3 s calm with room to spare: one step dearer"
    assert g.choose(9.0, 20.0, 75.0) == 1, "the fitted point would use 68 %: not under 75 % of the headroom"
    assert g.choose(10.0, 10.0, 75.0) == 1 and g.choose(13.5, 10.0, 75.0) == 0, "light load: back to the fitted lam"
    assert g.choose(14.0, 100.0, 75.0) == 2, "more than even the cheapest point fits: the cheapest"
    assert g.moves == 4


def test_operating_points_of_the_shipped_model_get_cheaper_and_start_at_its_policy() -> None:
    policy = policy_from_config(PolicyConfig(), DEFAULT_MODEL)
    points = operating_points(DEFAULT_MODEL, policy)
    assert points[0].policy is policy and len(points) >= 3
    costs = [p.cost for p in points]
    assert costs == sorted(costs, reverse=True) and costs[-1] < 0.8 * costs[0], costs
    assert all(0.5 < p.accuracy <= 1 for p in points)
    assert operating_points(DEFAULT_MODEL, FixedExit(3))[0].cost == 1.0, "a fixed policy has one point"


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


def test_frames_dropped_behind_the_queue_move_it_cheaper_whatever_the_model_says() -> None:
    points = [OperatingPoint(lam, FixedExit(1), 0.9, cost) for lam, cost in ((0.86, 0.45), (0.7, 0.39), (0.57, 0.32))]
    g = LoadGovernor(points, headroom=0.85, workers=1)
    assert g.choose(0.0, 30.0, 40.0, answered_fps=25.0) == 0, "expected load 54 %: fits; one drop is no trend"
    assert g.choose(1.0, 30.0, 40.0, answered_fps=30.0) == 0
    assert g.choose(2.0, 30.0, 40.0, answered_fps=29.0) == 1, "6 of 90 frames dropped over 2 s: one step cheaper"
    assert g.choose(3.5, 30.0, 40.0, answered_fps=30.0) == 1
    assert g.choose(7.0, 30.0, 40.0, answered_fps=30.0) == 1, "not back to a point that dropped at this rate"
    assert g.choose(8.0, 20.0, 40.0, answered_fps=20.0) == 1 and g.choose(11.5, 20.0, 40.0, answered_fps=20.0) == 0, \
        "a third fewer frames arriving, calm for 3 s: back"
