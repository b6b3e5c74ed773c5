"""Exit 0: the last answer, when the picture did not change. Its state, its fit on video, its tables (pure numpy).

A camera's frames mostly repeat the one before. Exit 0 is a stage before segment 1 whose answer is the source's
last answer (its smoothed state, ``models.smoothing``) and whose cost is a change measure of the picture the model
sees: ``thumbnail`` is a 16 x 16 grey image of the model's input (block means of its green plane), and ``change``
the mean absolute difference between this frame's and that of the last frame the model analysed. Exit 0's state
(``Exit0Bins``) is the change (binned at quantiles of what calibration video showed, finer in the tail), how many
frames ago the model last ran (1, 2-3, 4-7, 8-15, 16-31, 32+) and the last answer's confidence (tertiles).

**The fit** (``fit_exit0``) is on clips in time order (``Clips``): per clip, a behaviour that analyses frames at
random gaps (log-uniform over 1..64 frames, so every state is seen) answers the analysed frames with the chain's
own index and smooths them as the serve path does; at every frame, exit 0's state, whether the smoothed answer
names the label of that moment, and exit 1's state on that frame give exit 0's node loss ``loss0[s]`` and its
transitions to exit 1's states, each shrunk towards the change bin's own figures (5 frames' weight) where a state
was seldom seen. ``solve_exit0`` solves the chain with exit 0 in front for every horizon (``models.chain``): stop at
exit 0 iff ``lam * loss0[s] <= sigma0[K][s]``; otherwise the chain runs as on a single frame. (Recall of the last
answer after the exits ran, with exit 0's loss as the best so far, was tried and taken out: after a change, an
unsure exit moves the smoothed answer only part way, the old label still looks sure, and recall kept choosing it
at every refresh: changes went unnoticed for 300-800 frames on the calibration clips.)

**Never stuck.** A state exit 0 holds in comes back on the next frame (the change is measured against the same
frame), so a change it misses would be missed for good: exit 0 never answers ``MAX_SINCE`` frames or more after the
model last ran, and the fit chooses lam and the hold for the time to notice a change too (``models.video_fit``).

**The hold.** The chain decides one frame, but on video an answer the model gives is served for the frames after
it too (exit 0 keeps it while the picture stays), whereas a wrong last answer at exit 0 costs about one frame (the
change that made it wrong stays in view, so the next frame decides again). So with exit 0, exits 1..n's node
losses count ``hold`` times (``Exit0Fit.hold``, chosen with lam on the calibration clips: ``models.video_fit``):
the model is run deeper when it runs, and run less often.
"""

from __future__ import annotations

import itertools
from bisect import bisect_right
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from typing import Any

import cv2
import numpy as np

from models.chain import solve_states
from models.smoothing import TemporalSmoother

THUMB = 16
SINCE_EDGES = (2, 4, 8, 16, 32)  # frames since the model last ran: 1, 2-3, 4-7, 8-15, 16-31, 32+
MAX_SINCE = 32  # exit 0 never answers this many frames after the model last ran: a missed change is not kept
CHANGE_QUANTILES = (0.2, 0.4, 0.6, 0.8, 0.9, 0.95, 0.98)
CONF_QUANTILES = (1 / 3, 2 / 3)
PRIOR = 5.0  # frames' weight of the change bin's figures in a state's
MAX_GAP = 64  # the exploring behaviour's longest gap between analysed frames
MIN_LOSS = 1e-6


def thumbnail(x: np.ndarray) -> np.ndarray:
    """(1, 3, H, W) model input -> (16, 16) float32: its green plane area-resized (block means when H and W are
    multiples of 16; OpenCV's, 13 us at 96 px where numpy's reshape-and-mean took 62)."""
    out: np.ndarray = cv2.resize(x[0, 1], (THUMB, THUMB), interpolation=cv2.INTER_AREA)
    return out


def change(a: np.ndarray, b: np.ndarray) -> float:
    """How much the picture changed between two thumbnails: mean absolute difference (the input's units)."""
    return float(cv2.norm(a, b, cv2.NORM_L1)) / a.size


@dataclass(frozen=True)
class Clips:
    """Labelled video in time order: each frame's softmax at every exit, its label, its thumbnail, and its clip
    (frames of a clip are consecutive)."""

    probs: np.ndarray  # (N, n, C)
    labels: np.ndarray  # (N,)
    thumbs: np.ndarray  # (N, 16, 16)
    clip: np.ndarray  # (N,) clip id
    fps: float

    def spans(self) -> Iterator[tuple[int, int]]:
        """(start, end) of each clip."""
        cuts = np.flatnonzero(np.diff(self.clip)) + 1
        bounds = [0, *cuts.tolist(), len(self.clip)]
        yield from itertools.pairwise(bounds)

    def static_clips(self, hold_s: float = 5.0) -> np.ndarray:
        """The clips whose states hold ``hold_s`` or more on average (a gate, a door), not a picture a second."""
        out = []
        for start, end in self.spans():
            changes = int(np.count_nonzero(np.diff(self.labels[start:end])))
            if (end - start) / (changes + 1) >= hold_s * self.fps:
                out.append(int(self.clip[start]))
        return np.asarray(out, int)

    def changes(self) -> np.ndarray:
        """Frames whose label differs from the frame before in the same clip (a state change)."""
        same_clip = self.clip[1:] == self.clip[:-1]
        return np.flatnonzero(same_clip & (self.labels[1:] != self.labels[:-1])) + 1


@dataclass(frozen=True)
class Exit0Bins:
    change_edges: np.ndarray  # inner edges of the change bins
    since_edges: np.ndarray
    conf_edges: np.ndarray
    _lists: tuple[list[float], list[float], list[float]] = field(init=False, repr=False, compare=False)

    def __post_init__(self) -> None:  # per frame, bisect on lists: a tenth of np.searchsorted's time on a scalar
        lists = (self.change_edges.tolist(), self.since_edges.tolist(), self.conf_edges.tolist())
        object.__setattr__(self, "_lists", lists)

    @property
    def sizes(self) -> tuple[int, int, int]:
        return len(self.change_edges) + 1, len(self.since_edges) + 1, len(self.conf_edges) + 1

    @property
    def count(self) -> int:
        mc, ms, mq = self.sizes
        return mc * ms * mq

    def state(self, change_value: float, since: int, confidence: float) -> int:
        changes, sinces, confs = self._lists
        ms, mq = len(sinces) + 1, len(confs) + 1
        c, f, q = bisect_right(changes, change_value), bisect_right(sinces, since), bisect_right(confs, confidence)
        return (c * ms + f) * mq + q

    def states(self, changes: np.ndarray, since: np.ndarray, conf: np.ndarray) -> np.ndarray:
        _, ms, mq = self.sizes
        c = np.searchsorted(self.change_edges, changes, side="right")
        f = np.searchsorted(self.since_edges, since, side="right")
        q = np.searchsorted(self.conf_edges, conf, side="right")
        out: np.ndarray = (c * ms + f) * mq + q
        return out

    def change_bin(self, states: np.ndarray) -> np.ndarray:
        _, ms, mq = self.sizes
        out: np.ndarray = states // (ms * mq)
        return out


@dataclass(frozen=True)
class Exit0Fit:
    """Exit 0's part of a fitted chain (lam-free)."""

    bins: Exit0Bins
    loss: np.ndarray  # (m0,) error of the last answer in each state
    transitions: np.ndarray  # (m0, m1) to exit 1's state
    cost: float  # exit 0's cost as a share of full depth
    samples: int
    hold: float = 1.0  # frames a model answer is served for: exits 1..n's losses count this many times


@dataclass(frozen=True)
class Exit0Tables:
    """Exit 0 for one lam: what ``DynamicIndex`` carries (``sigma[K-1]``: the index at horizon K)."""

    bins: Exit0Bins
    loss: np.ndarray  # (m0,)
    sigma: np.ndarray  # (n, m0)
    lam: float
    cost: float

    def decide(self, horizon: int, change_value: float, since: int, confidence: float) -> bool:
        """Answer with the last answer? Never past ``MAX_SINCE`` frames: a state exit 0 holds in is held again on
        the next frame (its change is measured against the same frame), so a change it missed would be kept."""
        s = self.bins.state(change_value, since, confidence)
        k = min(max(horizon, 1), self.sigma.shape[0]) - 1
        return since < MAX_SINCE and self.lam * float(self.loss[s]) <= float(self.sigma[k, s])


# --- fitting --------------------------------------------------------------------------------------------------

Answerer = Callable[[np.ndarray], tuple[np.ndarray, int]]  # (n, C) softmax of a frame -> (answer probs, exit)


@dataclass(frozen=True)
class Samples:
    """Exit 0 as the exploring behaviour met it, one row per frame (the first frame of a clip has none)."""

    change: np.ndarray
    since: np.ndarray
    conf: np.ndarray
    correct: np.ndarray  # the smoothed answer named the label of the moment
    next_state: np.ndarray  # exit 1's state on that frame


def explore(clips: Clips, answer: Answerer, exit1_states: np.ndarray, smoother: Callable[[], TemporalSmoother],
            seed: int = 0) -> Samples:
    """Exit 0's samples under a behaviour that analyses frames at log-uniform random gaps of 1..``MAX_GAP``."""
    rng = np.random.default_rng(seed)
    rows: list[tuple[float, int, float, bool, int]] = []
    for start, end in clips.spans():
        sm = smoother()
        ref, last_run, smoothed = None, start, None
        next_run = start
        for t in range(start, end):
            if smoothed is not None and ref is not None:
                rows.append((change(clips.thumbs[t], ref), t - last_run, smoothed.confidence,
                             smoothed.label == clips.labels[t], int(exit1_states[t])))
            if t == next_run:
                probs, k = answer(clips.probs[t])
                smoothed = sm.update(probs, k)
                ref, last_run = clips.thumbs[t], t
                next_run = t + int(np.exp(rng.uniform(0, np.log(MAX_GAP))))
    a = np.array(rows, dtype=object) if rows else np.empty((0, 5), dtype=object)
    return Samples(a[:, 0].astype(float), a[:, 1].astype(int), a[:, 2].astype(float), a[:, 3].astype(bool),
                   a[:, 4].astype(int))


def fit_exit0(samples: Samples, m1: int, cost: float) -> Exit0Fit:
    """Bins at quantiles of the samples, each state's loss and transitions shrunk towards its change bin's."""
    if len(samples.change) < 100:
        raise ValueError(f"{len(samples.change)} exit-0 samples: too few to fit (clips of at least a few minutes)")
    bins = Exit0Bins(np.quantile(samples.change, CHANGE_QUANTILES), np.asarray(SINCE_EDGES, float),
                     np.quantile(samples.conf, CONF_QUANTILES))
    states = bins.states(samples.change, samples.since, samples.conf)
    m0 = bins.count
    cbin = bins.change_bin(np.arange(m0))
    wrong = (~samples.correct).astype(float)
    overall = float(np.clip(wrong.mean(), 1 / (len(wrong) + 2), None))
    n_c = np.bincount(bins.change_bin(states), minlength=bins.sizes[0]).astype(float)
    err_c = (np.bincount(bins.change_bin(states), weights=wrong, minlength=bins.sizes[0]) + PRIOR * overall) / (
        n_c + PRIOR)
    seen = np.bincount(states, minlength=m0).astype(float)
    loss = (np.bincount(states, weights=wrong, minlength=m0) + PRIOR * err_c[cbin]) / (seen + PRIOR)
    counts = np.zeros((m0, m1))
    np.add.at(counts, (states, samples.next_state), 1.0)
    by_c = np.zeros((bins.sizes[0], m1))
    np.add.at(by_c, (bins.change_bin(states), samples.next_state), 1.0)
    p_c = (by_c + 1.0) / (by_c.sum(axis=1, keepdims=True) + m1)
    trans = (counts + PRIOR * p_c[cbin]) / (seen[:, None] + PRIOR)
    return Exit0Fit(bins, np.maximum(loss, MIN_LOSS), trans, float(cost), len(states))


def solve_exit0(fit: Exit0Fit, transitions: np.ndarray, loss: np.ndarray, cost: np.ndarray, lam: float
                ) -> Exit0Tables:
    """Exit 0's index at every horizon K (exits 1..K after it) for the chain of exits 1..n (``FittedChain``'s
    transitions, losses, costs)."""
    n = loss.shape[0]
    m0 = fit.bins.count
    sigma = np.empty((n, m0))
    for horizon in range(n, 0, -1):  # the longest first: its check covers the shorter ones
        sigmas, _ = solve_states(np.full(m0, 1 / m0), [fit.transitions, *transitions[: horizon - 1]],
                                 [fit.loss, *loss[:horizon]], np.concatenate([[fit.cost], cost[:horizon]]), lam,
                                 check=horizon == n)
        sigma[horizon - 1] = sigmas[0]
    return Exit0Tables(fit.bins, fit.loss, sigma, lam, fit.cost)


# --- on disk (policy.json's "exit0") ------------------------------------------------------------------------

def exit0_to_json(fit: Exit0Fit, tables: Exit0Tables) -> dict[str, Any]:
    b = fit.bins
    return {"change_edges": b.change_edges.tolist(), "since_edges": b.since_edges.tolist(),
            "conf_edges": b.conf_edges.tolist(), "loss": fit.loss.tolist(), "transitions": fit.transitions.tolist(),
            "cost": fit.cost, "samples": fit.samples, "hold": fit.hold,
            "sigma_by_horizon": [[None if not np.isfinite(v) else float(v) for v in row] for row in tables.sigma]}


def exit0_from_json(d: dict[str, Any], lam: float) -> tuple[Exit0Fit, Exit0Tables]:
    """The fit and the tables at ``lam`` as saved; ``ValueError`` / ``KeyError`` / ``TypeError`` when malformed."""
    bins = Exit0Bins(np.asarray(d["change_edges"], float), np.asarray(d["since_edges"], float),
                     np.asarray(d["conf_edges"], float))
    loss = np.asarray(d["loss"], float)
    trans = np.asarray(d["transitions"], float)
    sigma = np.array([[np.inf if v is None else v for v in row] for row in d["sigma_by_horizon"]], dtype=float)
    if loss.shape != (bins.count,) or trans.shape[0] != bins.count or sigma.shape[1] != bins.count:
        raise ValueError(f"exit-0 tables of {loss.shape}, {trans.shape}, {sigma.shape} for {bins.count} states")
    fit = Exit0Fit(bins, loss, trans, float(d["cost"]), int(d["samples"]), float(d.get("hold", 1.0)))
    return fit, Exit0Tables(bins, loss, sigma, lam, fit.cost)
