"""Replaying a policy on traces all frames at once gives, frame for frame, what the per-frame run gives: every
option of the index (agreement states, the margin statistic, the answer-loss refinement, a floor, a shorter
horizon), on the shipped model's calibration traces."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest

from models.fit import LAM_GRID, build_policy, fit_chain, replay_frames, replay_index
from models.folder import load_traces
from models.manifest import read_manifest
from models.policies import run_on_trace

DEFAULT_MODEL = Path(__file__).resolve().parents[1] / "models" / "default"


@pytest.mark.parametrize("agreement,statistic,loss_kind,min_exit,horizon", [
    (False, "confidence", "error", 1, 3), (True, "confidence", "error", 1, 3), (False, "margin", "error", 1, 3),
    (False, "confidence", "one-minus-confidence", 2, 3), (True, "margin", "error", 3, 3),
    (False, "confidence", "error", 1, 2)])
def test_all_frames_at_once_is_frame_by_frame(agreement: bool, statistic: str, loss_kind: str, min_exit: int,
                                             horizon: int) -> None:
    manifest = read_manifest(DEFAULT_MODEL)
    probs, labels = load_traces(DEFAULT_MODEL, manifest, "calibration")
    chain = fit_chain(probs, labels, manifest.costs_ms, agreement=agreement, statistic=statistic,
                      loss_kind=loss_kind)
    assert chain.answer_loss is not None, "the recall refinement is exercised"
    stops = set()
    for lam in LAM_GRID[::4]:
        policy = build_policy(chain, lam, min_exit)
        ran, choice = replay_frames(policy, probs, horizon)
        one = np.array([run_on_trace(policy, probs[i], horizon) for i in range(len(labels))])
        assert (ran == one[:, 0]).all() and (choice == one[:, 1]).all(), lam
        assert ran.min() >= min(min_exit, horizon) and ran.max() <= horizon
        stops |= set(ran.tolist())
    assert len(stops) > 1 or min_exit > 1, "the lams tried stop at more than one depth"
    acc, cost = replay_index(policy, probs, labels, chain.cost)
    assert 0 < acc <= 1 and 0 < cost <= 1
