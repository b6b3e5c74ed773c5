"""Policies replayed on video in time order, counted as users see them (pure numpy).

Every frame of every clip gets an answer: the source's smoothed answer after that frame (``models.smoothing``, as
the serve path smooths), scored against the label of the moment the frame was taken, so an answer that lags a
change is wrong until it catches up. What each frame cost is in units of full depth: the segments it ran, plus
exit 0's change measure where the policy measures change.

The families (``replay_*``):

- ``index``: the dynamic index with exit 0 (``DynamicIndex.exit0``): the last answer when exit 0's index says
  so, else the chain;
- ``per_frame``: any exit policy on every frame (the threshold shipped today, full depth);
- ``gated``: a motion gate in front of a policy: the model runs when the picture changed by more than ``gate``
  since the frame it last analysed (as Frigate's state classifiers run on motion), else the last answer;
- ``refresh``: the model every ``k`` frames, the last answer between.

``notice`` gives, for every state change, how many frames the served answer took to name the new state.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

import numpy as np

from models.policies import DynamicIndex, ExitPolicy, run_on_trace
from models.smoothing import Smoothed, TemporalSmoother
from models.video import Clips, change


@dataclass(frozen=True)
class VideoRun:
    cost: np.ndarray  # (N,) what each frame cost, in units of full depth
    correct: np.ndarray  # (N,) the answer served after the frame named the label of the moment
    exit: np.ndarray  # (N,) 0: the last answer served (the model not run); k: exit k answered (1-based)
    served: np.ndarray  # (N,) the label served

    @property
    def accuracy(self) -> float:
        return float(self.correct.mean())

    @property
    def mean_cost(self) -> float:
        return float(self.cost.mean())

    @property
    def exit0_share(self) -> float:
        return float((self.exit == 0).mean())


Decide = Callable[[float, int, Smoothed], bool]
# (change since the last analysed frame, frames since, smoothed answer) -> run the model?


def _replay(clips: Clips, policy: ExitPolicy, costs: np.ndarray, smoother: Callable[[], TemporalSmoother],
            decide: Decide, measure_cost: float) -> VideoRun:
    n_frames, n = len(clips.labels), clips.probs.shape[1]
    cum = np.concatenate([[0.0], np.cumsum(costs)])
    cost = np.full(n_frames, measure_cost)
    exit_used = np.zeros(n_frames, int)
    served = np.empty(n_frames, int)
    for start, end in clips.spans():
        sm, smoothed, ref, last_run = smoother(), None, None, start
        for t in range(start, end):
            moved = 0.0 if ref is None else change(clips.thumbs[t], ref)
            if smoothed is None or decide(moved, t - last_run, smoothed):
                ran, choice = run_on_trace(policy, clips.probs[t], n)
                cost[t] += cum[ran]
                ref, last_run = clips.thumbs[t], t
                smoothed = sm.update(clips.probs[t, choice], choice)
                exit_used[t] = choice + 1
            assert smoothed is not None
            served[t] = smoothed.label
    return VideoRun(cost, served == clips.labels, exit_used, served)


def replay_index(policy: DynamicIndex, clips: Clips, costs: np.ndarray,
                 smoother: Callable[[], TemporalSmoother]) -> VideoRun:
    tables = policy.exit0
    if tables is None:
        return replay_per_frame(policy, clips, costs, smoother)
    horizon = clips.probs.shape[1]

    def decide(moved: float, since: int, sm: Smoothed) -> bool:
        assert tables is not None
        return not tables.decide(horizon, moved, since, sm.confidence)

    return _replay(clips, policy, costs, smoother, decide, tables.cost)


def replay_per_frame(policy: ExitPolicy, clips: Clips, costs: np.ndarray,
                     smoother: Callable[[], TemporalSmoother]) -> VideoRun:
    return _replay(clips, policy, costs, smoother, lambda moved, since, sm: True, 0.0)


def replay_gated(policy: ExitPolicy, clips: Clips, costs: np.ndarray, smoother: Callable[[], TemporalSmoother],
                 gate: float, measure_cost: float) -> VideoRun:
    return _replay(clips, policy, costs, smoother, lambda moved, since, sm: moved > gate, measure_cost)


def replay_refresh(policy: ExitPolicy, clips: Clips, costs: np.ndarray, smoother: Callable[[], TemporalSmoother],
                   every: int) -> VideoRun:
    return _replay(clips, policy, costs, smoother, lambda moved, since, sm: since >= every, 0.0)


def notice(clips: Clips, served: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """For every state change: (frames until the served answer first named the new state, noticed at all before
    the next change or the clip's end)."""
    ends = np.empty(len(clips.labels), int)
    for start, end in clips.spans():
        ends[start:end] = end
    changes = clips.changes()
    delays = np.empty(len(changes), int)
    seen = np.empty(len(changes), bool)
    for i, t in enumerate(changes):
        stop = min(ends[t], changes[i + 1] if i + 1 < len(changes) else ends[t])
        hit = np.flatnonzero(served[t:stop] == clips.labels[t])
        seen[i] = hit.size > 0
        delays[i] = int(hit[0]) if hit.size else stop - t
    return delays, seen
