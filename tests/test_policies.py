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
from models.fit import build_policy, fit_chain, load_policy, save_policy, states_of
from models.policies import (
    BudgetGreedy,
    ConfidenceThreshold,
    EntropyThreshold,
    FixedExit,
    Patience,
    normalised_entropy,
    run_on_trace,
)


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


def test_online_policy_follows_the_tables() -> None:
    probs, labels = synthetic_traces(np.random.default_rng(1), 500)
    chain = fit_chain(probs, labels, [1.0, 1.0, 1.0], bins=4)
    pol = build_policy(chain, 0.7)
    sol = pol.solutions[-1]
    states = states_of(probs, chain.bin_edges)
    for i in range(len(labels)):
        ran, choice = run_all(pol, probs[i])
        best, want_ran = np.inf, 3
        for k in range(3):
            best = min(best, sol.weighted_loss[k, states[i, k]])
            if best <= sol.sigma[k, states[i, k]]:
                want_ran = k + 1
                break
        assert ran == want_ran
        seen = [sol.weighted_loss[k, states[i, k]] for k in range(ran)]
        assert choice == int(np.argmin(seen)), "recall: the answer is the lowest-loss exit seen"


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
    from edge_app.policy_cmds import evaluate, fit_policy
    from models.manifest import read_manifest

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
