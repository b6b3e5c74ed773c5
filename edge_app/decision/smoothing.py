"""Temporal smoothing of per-frame results: pure, no I/O.

* ``TemporalSmoother`` (``models.smoothing``, re-exported here): an exponential
  moving average of the class distribution in which each frame counts in
  proportion to how reliable its exit is, with hysteresis on the shown label.
* ``depth_window``: how far the exit depth may move from one frame to the
  next (step by step, not a cliff); the deadline's horizon still wins.
* ``flicker_stats``: label flips per minute and mean quality jump between
  consecutive frames, to compare smoothing on and off.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

import numpy as np

from models.smoothing import Smoothed, TemporalSmoother

__all__ = ["FlickerStats", "Smoothed", "TemporalSmoother", "depth_window", "flicker_stats"]


def depth_window(previous_exit: int | None, horizon: int, n_exits: int, max_step: int | None = 1
                 ) -> tuple[int, int]:
    """(earliest exit the policy may stop at, latest exit allowed), 1-based.

    The depth may rise or fall by ``max_step`` per frame (``None``: any
    amount); the deadline's ``horizon`` caps the latest exit and overrides
    the fall limit.
    """
    hi = min(horizon, n_exits)
    if previous_exit is None or max_step is None:
        return 1, hi
    hi = min(hi, previous_exit + max_step)
    lo = min(max(1, previous_exit - max_step), hi)
    return lo, hi


@dataclass(frozen=True)
class FlickerStats:
    label_flips_per_min: float
    mean_quality_jump: float


def flicker_stats(labels: Sequence[int], exits: Sequence[int], fps: float,
                  exit_quality: Sequence[float]) -> FlickerStats:
    """Flips of the shown label per minute, and mean |quality(exit_t) - quality(exit_t-1)|."""
    lab = np.asarray(labels)
    ex = np.asarray(exits)
    if len(lab) < 2:
        return FlickerStats(0.0, 0.0)
    minutes = len(lab) / fps / 60
    q = np.asarray(exit_quality)[ex]
    return FlickerStats(float(np.count_nonzero(lab[1:] != lab[:-1]) / minutes), float(np.abs(np.diff(q)).mean()))
