"""Temporal smoothing of per-frame answers (pure): what a source's state is, and what exit 0 answers with.

``TemporalSmoother``: an exponential moving average of the class distribution in which each analysed frame counts
in proportion to how reliable its exit is (``reliability[k]``, e.g. each exit's test accuracy relative to the
best), with hysteresis on the shown label: it changes only when another class leads the shown one by
``hysteresis``. The serve path smooths every source's answers with it (``edge_app.decision.decide``), and the offline
replay of a policy on video (``models.video``) with the same code, so what is fitted is what is served.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

import numpy as np


@dataclass(frozen=True)
class Smoothed:
    probs: np.ndarray
    label: int
    confidence: float
    label_changed: bool


class TemporalSmoother:
    def __init__(self, reliability: Sequence[float], alpha: float = 0.5, hysteresis: float = 0.1) -> None:
        if not 0 < alpha <= 1:
            raise ValueError("alpha must be in (0, 1]")
        top = max(reliability)
        self.weights = [r / top for r in reliability]
        self.alpha = alpha
        self.hysteresis = hysteresis
        self._state: np.ndarray | None = None
        self._label = -1

    def reset(self) -> None:
        self._state, self._label = None, -1

    def update(self, probs: np.ndarray, exit_index: int) -> Smoothed:
        a = self.alpha * self.weights[exit_index]
        state = probs.astype(float).copy() if self._state is None else (1 - a) * self._state + a * probs
        state /= state.sum()
        self._state = state
        lead = int(state.argmax())
        changed = False
        if self._label < 0 or state[lead] > state[self._label] + self.hysteresis:
            changed = self._label >= 0 and lead != self._label
            self._label = lead
        return Smoothed(state, self._label, float(state[self._label]), changed)
