"""The dynamic-index solver against brute force, Monte Carlo and the paper's recall example."""

from __future__ import annotations

from functools import cache

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from models.chain import solve_chain, solve_horizons


def random_chain(rng: np.random.Generator, n: int, m: int):  # type: ignore[no-untyped-def]
    p1 = rng.dirichlet(np.ones(m))
    trans = [rng.dirichlet(np.ones(m) * 0.7, size=m) for _ in range(n - 1)]
    loss = rng.uniform(0.01, 1.0, (n, m))
    cost = rng.uniform(0.0, 0.5, n)
    return p1, trans, loss, cost


def brute_force(p1, trans, loss, cost, lam, recall=True) -> float:  # type: ignore[no-untyped-def]
    """Best expected objective over all deterministic adaptive policies: a choice at every history."""
    n, m = loss.shape

    @cache
    def best(history: tuple[int, ...]) -> float:
        k = len(history) - 1
        seen = [loss[j, s] for j, s in enumerate(history)]
        stop = lam * (min(seen) if recall else seen[-1])
        if k == n - 1:
            return stop
        probs = trans[k][history[-1]]
        go = (1 - lam) * cost[k + 1] + sum(probs[t] * best((*history, t)) for t in range(m) if probs[t] > 0)
        return min(stop, go)

    return (1 - lam) * cost[0] + sum(p1[s] * best((s,)) for s in range(m) if p1[s] > 0)


def simulate(sol, p1, trans, loss, cost, lam, frames, rng) -> np.ndarray:  # type: ignore[no-untyped-def]
    n, m = loss.shape
    out = np.empty(frames)
    for i in range(frames):
        s = rng.choice(m, p=p1)
        paid, best = cost[0], loss[0, s]
        for k in range(n):
            if k:
                s = rng.choice(m, p=trans[k - 1][s])
                paid += cost[k]
                best = min(best, loss[k, s])
            if sol.should_stop(k, s, lam * best):
                break
        out[i] = lam * best + (1 - lam) * paid
    return out


@settings(max_examples=150, deadline=None)
@given(seed=st.integers(0, 2**31), n=st.integers(1, 4), m=st.integers(1, 5), lam=st.floats(0.0, 1.0))
def test_solver_equals_brute_force(seed: int, n: int, m: int, lam: float) -> None:
    chain = random_chain(np.random.default_rng(seed), n, m)
    sol = solve_chain(*chain, lam)
    assert sol.expected_objective == pytest.approx(brute_force(*chain, lam), abs=1e-9)
    assert np.isinf(sol.sigma[-1]).all()


@pytest.mark.parametrize("seed", range(4))
def test_monte_carlo_matches_the_expected_objective(seed: int) -> None:
    rng = np.random.default_rng(seed)
    chain = random_chain(rng, 3, 4)
    sol = solve_chain(*chain, 0.6)
    samples = simulate(sol, *chain, 0.6, 20000, rng)
    stderr = samples.std() / np.sqrt(len(samples))
    assert abs(samples.mean() - sol.expected_objective) < 4 * stderr + 1e-12


def test_zero_costs_explore_everything_and_pay_the_expected_min_loss() -> None:
    rng = np.random.default_rng(7)
    p1, trans, loss, _ = random_chain(rng, 3, 3)
    sol = solve_chain(p1, trans, loss, np.zeros(3), 1.0)
    # E[min loss] by enumerating paths
    expected = 0.0
    for a in range(3):
        for b in range(3):
            for c in range(3):
                pr = p1[a] * trans[0][a, b] * trans[1][b, c]
                expected += pr * min(loss[0, a], loss[1, b], loss[2, c])
    assert sol.expected_objective == pytest.approx(expected, abs=1e-12)
    samples = simulate(sol, p1, trans, loss, np.zeros(3), 1.0, 500, rng)
    assert samples.mean() == pytest.approx(expected, rel=0.2)
    # it never stops early: every reachable X is above the index, except when nothing can improve
    for k in range(2):
        for s in range(3):
            for x in np.unique(loss[: k + 1]):
                if x > loss[k + 1 :].min():
                    assert not sol.should_stop(k, s, x)


@pytest.mark.parametrize("alpha", [4.0, 10.0, 100.0])
def test_recall_beats_every_no_recall_policy_by_alpha(alpha: float) -> None:
    """Theorem 3.4's two-exit chain: R1 = 1/alpha^2; R2 = 0 w.p. 1 - 1/alpha, else 1/alpha; free edges.

    With recall the optimum explores and keeps min(R1, R2): E = 1/alpha^3.  Without recall the best
    policy pays 1/alpha^2 either way, so the ratio is alpha, unbounded as alpha grows.  (Losses must be
    positive, so 0 is replaced by 1e-15.)
    """
    eps = 1e-15
    p1 = np.array([1.0, 0.0])
    trans = [np.array([[1 - 1 / alpha, 1 / alpha], [1 - 1 / alpha, 1 / alpha]])]
    loss = np.array([[1 / alpha**2, 1 / alpha**2], [eps, 1 / alpha]])
    cost = np.zeros(2)
    sol = solve_chain(p1, trans, loss, cost, 1.0)
    assert sol.expected_objective == pytest.approx(1 / alpha**3, rel=1e-9)
    no_recall = brute_force(p1, trans, loss, cost, 1.0, recall=False)
    assert no_recall == pytest.approx(1 / alpha**2, rel=1e-9)
    assert no_recall / sol.expected_objective == pytest.approx(alpha, rel=1e-9)


def test_horizon_tables_truncate_the_chain() -> None:
    chain = random_chain(np.random.default_rng(3), 3, 4)
    sols = solve_horizons(*chain, 0.5)
    assert [s.n_exits for s in sols] == [1, 2, 3]
    assert np.isinf(sols[0].sigma).all()
    p1, trans, loss, cost = chain
    assert sols[1].expected_objective == pytest.approx(brute_force(p1, trans[:1], loss[:2], cost[:2], 0.5))
    # a longer horizon can only help
    assert sols[2].expected_objective <= sols[1].expected_objective + 1e-12 <= sols[0].expected_objective + 2e-12


def test_bad_inputs_are_refused() -> None:
    p1, trans, loss, cost = random_chain(np.random.default_rng(0), 2, 2)
    with pytest.raises(ValueError, match="strictly positive"):
        solve_chain(p1, trans, np.zeros_like(loss), cost, 0.5)
    with pytest.raises(ValueError, match="rows sum to 1"):
        solve_chain(p1, [trans[0] * 2], loss, cost, 0.5)
    with pytest.raises(ValueError, match="need 1 transition"):
        solve_chain(p1, [], loss, cost, 0.5)
    with pytest.raises(ValueError, match="outside"):
        solve_chain(p1, trans, loss, cost, 1.5)
