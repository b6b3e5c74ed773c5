"""Exit 0 (the last answer, when the picture did not change), pure: the chain with exit 0 in front solved exactly
(against brute force over every adaptive policy, exit 0 with a state space of its own), the fit on labelled video
under an exploring behaviour, never holding past ``MAX_SINCE``, and the replay that counts every frame against the
label of its moment."""

from __future__ import annotations

from functools import cache

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from models.chain import solve_chain, solve_states
from models.fit import build_policy, fit_chain, states_of
from models.policies import FixedExit, run_on_trace
from models.smoothing import TemporalSmoother
from models.video import THUMB, Clips, Exit0Bins, change, explore, fit_exit0, thumbnail
from models.video_replay import notice, replay_gated, replay_index, replay_per_frame


def _brute(p_first, trans, loss, cost, lam) -> float:  # type: ignore[no-untyped-def]
    n = len(loss)

    @cache
    def best(history: tuple[int, ...]) -> float:
        k = len(history) - 1
        stop = lam * min(loss[j][s] for j, s in enumerate(history))
        if k == n - 1:
            return stop
        probs = trans[k][history[-1]]
        go = (1 - lam) * cost[k + 1] + sum(probs[t] * best((*history, t)) for t in range(len(probs)) if probs[t] > 0)
        return min(stop, go)

    return (1 - lam) * cost[0] + sum(p_first[s] * best((s,)) for s in range(len(p_first)) if p_first[s] > 0)


@settings(max_examples=120, deadline=None)
@given(seed=st.integers(0, 2**31), n=st.integers(1, 4), m0=st.integers(1, 7), m=st.integers(1, 4),
       lam=st.floats(0.0, 1.0))
def test_a_chain_whose_first_exit_has_its_own_states_is_solved_exactly(seed: int, n: int, m0: int, m: int,
                                                                       lam: float) -> None:
    rng = np.random.default_rng(seed)
    sizes = [m0] + [m] * (n - 1)
    p_first = rng.dirichlet(np.ones(m0))
    trans = [rng.dirichlet(np.ones(sizes[k + 1]) * 0.7, size=sizes[k]) for k in range(n - 1)]
    loss = [rng.uniform(0.01, 1.0, size) for size in sizes]
    cost = rng.uniform(0.0, 0.5, n)
    sigma, objective = solve_states(p_first, trans, loss, cost, lam)
    assert objective == pytest.approx(_brute(p_first, trans, loss, cost, lam), abs=1e-9)
    assert [len(s) for s in sigma] == sizes and np.isinf(sigma[-1]).all()
    if m0 == m:  # the same chain as the square solver's
        square = solve_chain(p_first, trans, np.stack(loss), cost, lam)
        assert square.expected_objective == pytest.approx(objective, abs=1e-12)


def test_the_thumbnail_is_block_means_of_the_green_plane() -> None:
    x = np.zeros((1, 3, 96, 96), np.float32)
    x[0, 1, :48] = 1.0  # the top half of the green plane
    x[0, 0] = 5.0  # red is not read
    t = thumbnail(x)
    assert t.shape == (THUMB, THUMB) and (t[:8] == 1).all() and (t[8:] == 0).all()
    assert change(t, np.zeros_like(t)) == pytest.approx(0.5)


def _video(rng: np.random.Generator, frames_per_state: int = 150, states: int = 12) -> Clips:
    """Three classes; a state holds ``frames_per_state`` frames; each exit is right more often deeper, its
    confidence says so; thumbnails move only at a change (plus noise)."""
    n, c = 3, 3
    labels = np.repeat(rng.integers(0, c, states), frames_per_state)
    probs = np.empty((len(labels), n, c))
    for k, right in enumerate((0.7, 0.85, 0.97)):
        ok = rng.random(len(labels)) < right
        answer = np.where(ok, labels, (labels + 1 + rng.integers(0, c - 1, len(labels))) % c)
        conf = np.where(ok, rng.uniform(0.6, 0.99, len(labels)), rng.uniform(0.34, 0.7, len(labels)))
        probs[:, k] = ((1 - conf) / (c - 1))[:, None]
        probs[np.arange(len(labels)), k, answer] = conf
    level = np.repeat(rng.uniform(-1, 1, states), frames_per_state)
    thumbs = level[:, None, None] + rng.normal(0, 0.01, (len(labels), THUMB, THUMB))
    return Clips(probs, labels, thumbs.astype(np.float32), np.repeat(np.arange(2), len(labels) // 2), 15.0)


def test_exit0_fitted_on_static_video_answers_most_frames_and_notices_changes() -> None:
    rng = np.random.default_rng(0)
    cal, test = _video(rng), _video(rng)
    costs = np.array([0.3, 0.35, 0.35])
    chain = fit_chain(cal.probs.reshape(-1, 3, 3), cal.labels, costs)
    smoother = lambda: TemporalSmoother([0.7, 0.85, 0.97])  # noqa: E731
    base = build_policy(chain, 0.9)

    def answer(p: np.ndarray) -> tuple[np.ndarray, int]:
        choice = run_on_trace(base, p, 3)[1]
        return p[choice], choice

    samples = explore(cal, answer, states_of(cal.probs, chain.bin_edges)[:, 0], smoother)
    fit = fit_exit0(samples, chain.loss.shape[1], 0.01)
    assert fit.samples == len(cal.labels) - 2, "every frame but a clip's first is a sample"
    cbin = fit.bins.change_bin(np.arange(fit.bins.count))
    assert fit.loss[cbin == cbin.max()].mean() > 0.5, "a big change makes the last answer wrong"
    assert fit.loss[cbin <= 2].mean() < 0.15, "no change: the last answer stands"
    from dataclasses import replace

    policy = build_policy(replace(chain, exit0=fit), 0.9)
    run = replay_index(policy, test, costs, smoother)
    full = replay_per_frame(FixedExit(3), test, costs, smoother)
    delays, seen = notice(test, run.served)
    print(f"exit 0 on synthetic static video: accuracy {run.accuracy:.3f} (full depth {full.accuracy:.3f}) at "
          f"{run.mean_cost:.3f} of full depth; exit 0 answered {run.exit0_share:.2f}; notice p95 "
          f"{np.percentile(delays, 95):.0f} frames")
    assert run.exit0_share > 0.8 and run.mean_cost < 0.25
    assert run.accuracy >= full.accuracy - 0.01
    assert seen.all() and np.percentile(delays, 95) <= 3
    gate = replay_gated(FixedExit(3), test, costs, smoother, gate=0.1, measure_cost=0.01)
    assert gate.exit0_share > 0.9, "the gate answers unchanged frames from the last answer too"


def test_a_change_exit0_would_hold_in_is_noticed_within_max_since_frames() -> None:
    """Exit 0 tables that would always hold (every state stops): the model still runs every ``MAX_SINCE`` frames,
    so a change is noticed after a refresh or two (the smoother, alpha 0.5, needs two runs to change its label)."""
    from models.video import MAX_SINCE, Exit0Tables

    rng = np.random.default_rng(2)
    clips = _video(rng, frames_per_state=200, states=6)
    costs = np.array([0.3, 0.35, 0.35])
    chain = fit_chain(clips.probs, clips.labels, costs)
    policy = build_policy(chain, 0.9)
    bins = Exit0Bins(np.array([0.5]), np.asarray([2.0, 4.0, 8.0, 16.0, 32.0]), np.array([0.5]))
    policy.exit0 = Exit0Tables(bins, np.full(bins.count, 1e-6), np.full((3, bins.count), np.inf), 0.9, 0.01)
    smoother = lambda: TemporalSmoother([0.7, 0.85, 0.97])  # noqa: E731
    run = replay_index(policy, clips, costs, smoother)
    delays, _ = notice(clips, run.served)
    ran = np.flatnonzero(run.exit > 0)
    assert np.diff(ran).max() <= MAX_SINCE and run.exit0_share > 0.9
    assert delays.max() <= 2 * MAX_SINCE, delays
