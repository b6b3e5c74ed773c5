"""Baselines, the fitted dynamic index, saved tables and the evaluation on traces."""

from __future__ import annotations

import itertools
import json
import shutil
from pathlib import Path

import numpy as np
import pytest

from models.errors import PolicyError
from models.evaluate import dominance, pareto_front, prophet, replay
from models.fit import build_policy, fit_chain, states_of
from models.policies import (
    BudgetGreedy,
    ConfidenceThreshold,
    DynamicIndex,
    EntropyThreshold,
    FixedExit,
    Patience,
    normalised_entropy,
    run_on_trace,
)
from models.policy_store import load_policy, save_policy


def onehotish(label: int, conf: float, c: int = 4) -> np.ndarray:
    p = np.full(c, (1 - conf) / (c - 1))
    p[label] = conf
    return p


def run_all(policy, seq, horizon=None):  # type: ignore[no-untyped-def]
    return run_on_trace(policy, np.asarray(seq), horizon or len(seq))


def test_baselines_stop_where_they_should() -> None:
    seq = [onehotish(1, 0.5), onehotish(2, 0.95), onehotish(2, 0.99)]
    assert run_all(FixedExit(2), seq) == (2, 1)
    assert run_all(FixedExit(3), seq, horizon=1) == (1, 0)
    assert run_all(ConfidenceThreshold(0.9), seq) == (2, 1)
    assert run_all(ConfidenceThreshold(0.999), seq) == (3, 2)
    assert run_all(ConfidenceThreshold(0.999), seq, horizon=2) == (2, 1)
    assert run_all(EntropyThreshold(normalised_entropy(seq[1]) + 1e-9), seq) == (2, 1)
    assert run_all(Patience(1), seq) == (3, 2)  # exit 2 and 3 agree
    assert run_all(Patience(1), [onehotish(2, 0.5), *seq[1:]]) == (2, 1)
    assert run_all(BudgetGreedy(), seq, horizon=2) == (2, 1)


def synthetic_traces(rng: np.random.Generator, n_frames: int = 2000, c: int = 5) -> tuple[np.ndarray, np.ndarray]:
    """Deeper exits are more often right and more confident; confidence is informative."""
    labels = rng.integers(0, c, n_frames)
    probs = np.empty((n_frames, 3, c))
    difficulty = rng.uniform(0, 1, n_frames)
    for k, skill in enumerate((0.45, 0.75, 0.92)):
        right = rng.uniform(0, 1, n_frames) < skill * (1.2 - 0.4 * difficulty)
        guess = np.where(right, labels, rng.integers(0, c, n_frames))
        conf = np.clip(np.where(right, rng.uniform(0.5, 1.0, n_frames), rng.uniform(0.2, 0.7, n_frames)), 0.21, 0.999)
        for i in range(n_frames):
            probs[i, k] = onehotish(int(guess[i]), float(conf[i]), c)
    return probs, labels


def test_fit_chain_from_traces() -> None:
    probs, labels = synthetic_traces(np.random.default_rng(0))
    chain = fit_chain(probs, labels, [2.0, 1.0, 1.0], bins=6)
    assert chain.bin_edges.shape == (3, 5) and chain.p1.shape == (6,) and chain.transitions.shape == (2, 6, 6)
    np.testing.assert_allclose(chain.transitions.sum(-1), 1.0)
    np.testing.assert_allclose(chain.cost, [0.5, 0.25, 0.25])
    assert (chain.loss > 0).all()
    # quantile bins: each state holds about 1/6 of the frames
    counts = np.bincount(states_of(probs, chain.bin_edges)[:, 0], minlength=6)
    assert counts.min() > 0.1 * len(labels)
    # calibrated error falls as confidence rises, and deeper exits are better
    assert chain.loss[0, 0] > chain.loss[0, -1] and chain.loss[2].mean() < chain.loss[0].mean()
    proxy = fit_chain(probs, labels, [2.0, 1.0, 1.0], bins=6, loss_kind="one-minus-confidence")
    assert np.all(np.diff(proxy.loss, axis=1) <= 1e-12)


def tables_stop(sol, states):  # type: ignore[no-untyped-def]
    """Exits run by the index's own tables for one frame's states (best weighted loss so far <= sigma)."""
    best = np.inf
    for k in range(len(states)):
        best = min(best, sol.weighted_loss[k, states[k]])
        if best <= sol.sigma[k, states[k]]:
            return k + 1
    return len(states)


def test_online_policy_follows_the_tables() -> None:
    probs, labels = synthetic_traces(np.random.default_rng(1), 500)
    chain = fit_chain(probs, labels, [1.0, 1.0, 1.0], bins=4)
    pol = build_policy(chain, 0.7)
    sol = pol.solutions[-1]
    states = states_of(probs, chain.bin_edges)
    for i in range(len(labels)):
        ran, choice = run_all(pol, probs[i])
        assert ran == tables_stop(sol, states[i])
        last = ran - 1
        seen = [chain.answer_loss[j, last, states[i, j], states[i, last]] for j in range(ran)]
        assert choice == max(j for j in range(ran) if seen[j] == min(seen)), \
            "recall: the answer is the exit of lowest loss given what was seen (deeper on a tie)"
        marginal = DynamicIndex(chain.bin_edges, pol.solutions)  # without the table: each exit's own state
        seen = [sol.weighted_loss[k, states[i, k]] for k in range(ran)]
        assert run_all(marginal, probs[i]) == (ran, int(np.argmin(seen)))


def _frame(confs: tuple[float, ...], right: tuple[bool, ...]) -> np.ndarray:
    """One frame's (exits, 3) softmax: exit k says class 0 (the label) or 1 with confidence confs[k]."""
    out = np.empty((len(confs), 3))
    for k, (c, r) in enumerate(zip(confs, right, strict=True)):
        rest = (1 - c) / 2
        out[k] = [c, rest, rest] if r else [rest, c, rest]
    return out


def test_recall_reads_an_earlier_exit_by_what_the_later_exits_said() -> None:
    # A: every exit sure and right; B: exit 1 sure but wrong, exits 2-3 unsure and right; D: exits 2-3 unsure, wrong.
    # Exit 1's "sure" bin is right 50 / 70 times, exit 2's "unsure" bin 20 / 50: each exit's own bin says exit 1.
    frames = [_frame((0.95, 0.95, 0.95), (True, True, True))] * 50 \
        + [_frame((0.95, 0.6, 0.6), (False, True, True))] * 20 + [_frame((0.6, 0.55, 0.55), (True, False, False))] * 30
    probs, labels = np.stack(frames), np.zeros(len(frames), int)
    chain = fit_chain(probs, labels, [1.0, 1.0, 1.0], bins=2)
    s = states_of(probs[50:51], chain.bin_edges)[0]  # a B frame's states
    assert chain.loss[0, s[0]] < chain.loss[1, s[1]]  # exit 1's bin alone looks safer ...
    assert chain.answer_loss[0, 1, s[0], s[1]] > chain.answer_loss[1, 1, s[1], s[1]]  # ... but not after exit 2's
    pol = build_policy(chain, 0.99)
    for policy, want in ((pol, 1), (DynamicIndex(chain.bin_edges, pol.solutions), 0)):
        run = policy.start(2)
        run.observe(probs[50, 0])
        run.observe(probs[50, 1])  # both exits ran (as when the depth window makes a run go on)
        assert run.choice == want


def test_lam_trades_cost_for_accuracy_and_horizon_truncates() -> None:
    probs, labels = synthetic_traces(np.random.default_rng(2))
    chain = fit_chain(probs, labels, [1.0, 1.0, 1.0])
    cheap = replay(build_policy(chain, 0.01), probs, labels, chain.cost, 3)
    dear = replay(build_policy(chain, 0.99), probs, labels, chain.cost, 3)
    assert cheap.mean_cost < dear.mean_cost and cheap.accuracy < dear.accuracy
    one = replay(build_policy(chain, 0.99), probs, labels, chain.cost, 1)
    assert one.mean_exits_run == 1.0 and one.exit_usage[0] == 1.0
    oracle = prophet(probs, labels, chain.cost, 3)
    assert oracle.accuracy >= dear.accuracy and oracle.mean_cost <= dear.mean_cost


def test_pareto_and_dominance() -> None:
    probs, labels = synthetic_traces(np.random.default_rng(3), 600)
    chain = fit_chain(probs, labels, [1.0, 1.0, 1.0])
    pts = [replay(build_policy(chain, lam), probs, labels, chain.cost, 3, lam) for lam in (0.1, 0.5, 0.9, 0.99)]
    front = pareto_front(pts)
    assert all(a.mean_cost <= b.mean_cost and a.accuracy < b.accuracy for a, b in itertools.pairwise(front))
    d = dominance(pts, pts, final_accuracy=max(p.accuracy for p in pts))
    assert d["worse_at"] == [] and d["levels_not_worse"] == d["levels"]


def test_saved_tables_round_trip(tmp_path: Path) -> None:
    probs, labels = synthetic_traces(np.random.default_rng(4), 400)
    chain = fit_chain(probs, labels, [1.0, 2.0, 1.0], bins=5)
    pol = build_policy(chain, 0.8)
    save_policy(tmp_path, chain, pol, "ab" * 32, {"note": "test"})
    loaded = load_policy(tmp_path, 3, "ab" * 32)
    for h in (1, 2, 3):
        for i in range(100):
            assert run_all(pol, probs[i], h) == run_all(loaded, probs[i], h)
    assert loaded.answer_loss is not None and pol.answer_loss is not None
    np.testing.assert_array_equal(loaded.answer_loss, pol.answer_loss)  # +inf (not reachable) survives JSON
    with pytest.raises(PolicyError, match="other calibration traces"):
        load_policy(tmp_path, 3, "cd" * 32)
    with pytest.raises(PolicyError, match="not a valid policy table"):
        load_policy(tmp_path, 4)
    (tmp_path / "policy.json").write_text("{")
    with pytest.raises(PolicyError, match="not a valid policy table"):
        load_policy(tmp_path, 3)
    with pytest.raises(PolicyError, match="is missing: fit it"):
        load_policy(tmp_path / "nowhere", 3)


@pytest.mark.train
def test_fit_policy_and_evaluate_on_an_exported_model(tiny_model_folder: Path, tmp_path: Path) -> None:
    from edge_app.bench.evaluate import evaluate
    from models.manifest import read_manifest
    from models.policy_store import fit_policy

    folder = tmp_path / "m"
    shutil.copytree(tiny_model_folder, folder)
    info = fit_policy(folder, bins=4, target_accuracy=0.05)
    manifest = read_manifest(folder)
    pol = load_policy(folder, 3, manifest.traces["calibration"].sha256)
    assert pol.lam == pytest.approx(info["lam"])
    res = evaluate(folder, tmp_path / "eval", bins=4)
    for name in ("table.txt", "pareto.png", "points.json"):
        assert (tmp_path / "eval" / name).stat().st_size > 0
    data = json.loads((tmp_path / "eval" / "points.json").read_text())
    names = {p["policy"] for p in data["points"]["3"]}
    assert {"dynamic-index", "confidence", "entropy", "patience", "fixed-1", "fixed-3", "budget-greedy",
            "prophet"} <= names
    assert set(data["points"]) == {"1", "2", "3"}
    assert "Dynamic index vs baselines" in res["table"]


@pytest.mark.parametrize("statistic", ["margin", "confidence"])
def test_the_live_policy_reads_the_state_the_chain_was_fitted_on(tmp_path: Path, statistic: str) -> None:
    """A chain fitted on the margin (top-1 minus top-2) with isotonic errors, saved and loaded as the server loads
    it: the online run's states and stops are those of the offline tables frame by frame."""
    probs, labels = synthetic_traces(np.random.default_rng(7), 600)
    chain = fit_chain(probs, labels, [1.0, 1.0, 1.0], bins=6, statistic=statistic, isotonic=True)
    assert all(np.all(np.diff(chain.loss[k]) <= 1e-12) for k in range(3)), "isotonic: error never rises with it"
    save_policy(tmp_path, chain, build_policy(chain, 0.7), "ab" * 32, {})
    live = load_policy(tmp_path, 3, "ab" * 32)
    assert live.statistic == statistic
    sol = live.solutions[-1]
    states = states_of(probs, chain.bin_edges, statistic=statistic)
    other = states_of(probs, chain.bin_edges, statistic="confidence" if statistic == "margin" else "margin")
    assert (states != other).any(), "the two statistics bin these frames differently"
    for i in range(len(labels)):
        assert run_all(live, probs[i])[0] == tables_stop(sol, states[i])


def test_paired_bootstrap_fronts_tell_a_cheaper_family_from_a_tie() -> None:
    """``models.compare``: a family that pays less for the same answers is cheaper at every level with an interval
    under 0; a family against itself differs by 0 with an interval around it; levels one front never reaches have
    no difference."""
    from models.compare import Family, compare

    rng = np.random.default_rng(3)
    n, params = 800, 6
    correct = rng.random((params, n)) < np.linspace(0.80, 0.95, params)[:, None]
    cost = np.linspace(0.3, 1.0, params)[:, None] + 0.05 * rng.random((params, n))
    dear = Family("dear", tuple(range(params)), cost, correct)
    cheap = Family("cheap", tuple(range(params)), 0.8 * cost, correct)
    levels = np.round(np.arange(0.80, 0.951, 0.01), 3)
    res = compare(cheap, dear, levels, resamples=200)
    settled = [r for r in res["rows"] if np.isfinite(r["diff"]) and not np.isnan(r["lo"])]
    assert settled and all(r["hi"] < 0 for r in settled) and res["cheaper"] == len(settled)
    assert res["area_hi"] < 0 < res["area_lo"] + 1.0
    same = compare(dear, dear, levels, resamples=200)
    assert same["area"] == 0 and same["costlier"] == same["cheaper"] == 0
    assert any(not np.isfinite(r["diff"]) for r in res["rows"]) or res["levels_both"] == len(levels)
