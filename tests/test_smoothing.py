"""Temporal smoothing, depth limits and flicker statistics with plain numbers."""

from __future__ import annotations

import numpy as np
import pytest

from edge_app.decision.smoothing import TemporalSmoother, depth_window, flicker_stats


def p(label: int, conf: float, c: int = 3) -> np.ndarray:
    v = np.full(c, (1 - conf) / (c - 1))
    v[label] = conf
    return v


def test_hysteresis_holds_the_label_through_one_odd_frame() -> None:
    sm = TemporalSmoother([0.7, 0.9, 1.0], alpha=0.5, hysteresis=0.1)
    for _ in range(5):
        out = sm.update(p(0, 0.9), 2)
    assert out.label == 0
    out = sm.update(p(1, 0.6), 0)  # one shaky early-exit frame
    assert out.label == 0 and not out.label_changed
    for _ in range(4):
        out = sm.update(p(1, 0.95), 2)
        if out.label == 1:
            break
    assert out.label == 1 and out.label_changed


def test_reliable_exits_count_more() -> None:
    a = TemporalSmoother([0.5, 1.0], alpha=0.5)
    b = TemporalSmoother([0.5, 1.0], alpha=0.5)
    a.update(p(0, 0.9), 1)
    b.update(p(0, 0.9), 1)
    weak = a.update(p(1, 0.9), 0).probs[1]
    strong = b.update(p(1, 0.9), 1).probs[1]
    assert weak < strong


def test_depth_moves_step_by_step_but_the_deadline_wins() -> None:
    assert depth_window(None, 3, 3) == (1, 3)
    assert depth_window(1, 3, 3) == (1, 2)
    assert depth_window(3, 3, 3) == (2, 3)
    assert depth_window(3, 1, 3) == (1, 1), "a tight deadline overrides the fall limit"
    assert depth_window(1, 3, 3, None) == (1, 3) and depth_window(3, 2, 3, None) == (1, 2), "no limit: the horizon"


def test_flicker_stats() -> None:
    s = flicker_stats([0, 0, 1, 1, 0, 0], [0, 2, 0, 2, 2, 2], fps=6.0, exit_quality=[0.7, 0.8, 0.9])
    assert s.label_flips_per_min == pytest.approx(2 / (1 / 60))
    assert s.mean_quality_jump == pytest.approx(0.2 * 3 / 5)
