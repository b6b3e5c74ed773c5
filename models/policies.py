"""Exit policies on one interface: after each exit, stop or go on; when stopped, which exit answers.

    run = policy.start(horizon)          # horizon: how many exits the deadline allows (>= 1)
    for k in range(horizon):
        if run.observe(probs_of_exit_k):  # True: stop now
            break
    answer = run.choice                   # index of the exit whose result is returned

All runs stop at the horizon whatever they would prefer.  ``DynamicIndex`` is
T-Tamer's index policy with recall; the others are the baselines of the
early-exit literature.  Decisions are table look-ups and a few comparisons.

On video, an index with exit 0 (``DynamicIndex.exit0``, ``models.video``) first decides whether the source's last
answer will do; when it goes on, the chain runs as on a single frame.
"""

from __future__ import annotations

import math
from collections.abc import Callable
from dataclasses import dataclass
from typing import ClassVar, Protocol

import numpy as np

from models.chain import ChainSolution
from models.video import Exit0Tables


class PolicyRun(Protocol):
    def observe(self, probs: np.ndarray) -> bool: ...

    @property
    def choice(self) -> int: ...


class ExitPolicy(Protocol):
    @property
    def name(self) -> str: ...

    @property
    def exit0(self) -> Exit0Tables | None: ...  # the last answer's stage (an index fitted on video), else None

    def start(self, horizon: int) -> PolicyRun: ...


class _LastRun:
    """Shared by the no-recall baselines: the answer is the last exit run."""

    def __init__(self, horizon: int) -> None:
        self.horizon = horizon
        self.seen = 0

    @property
    def choice(self) -> int:
        return self.seen - 1

    def _at_horizon(self) -> bool:
        self.seen += 1
        return self.seen >= self.horizon


@dataclass(frozen=True)
class FixedExit:
    """Always run to exit ``exit`` (1-based), or to the horizon if that is shallower."""

    exit0: ClassVar[None] = None  # no stage before exit 1

    exit: int

    @property
    def name(self) -> str:
        return f"fixed-{self.exit}"

    def start(self, horizon: int) -> PolicyRun:
        return _FixedRun(min(self.exit, horizon))


class _FixedRun(_LastRun):
    def observe(self, probs: np.ndarray) -> bool:
        return self._at_horizon()


@dataclass(frozen=True)
class BudgetGreedy:
    """The deepest exit whose cost fits the budget: run until the horizon the deadline allows."""

    exit0: ClassVar[None] = None  # no stage before exit 1

    name: str = "budget-greedy"

    def start(self, horizon: int) -> PolicyRun:
        return _FixedRun(horizon)


@dataclass(frozen=True)
class ConfidenceThreshold:
    """Stop at the first exit whose max softmax reaches ``threshold`` ("1-Thr")."""

    exit0: ClassVar[None] = None  # no stage before exit 1

    threshold: float
    name: str = "confidence"

    def start(self, horizon: int) -> PolicyRun:
        return _ThresholdRun(horizon, lambda p: float(p.max()) >= self.threshold)


@dataclass(frozen=True)
class EntropyThreshold:
    """Stop at the first exit whose normalised entropy (H / log C, in [0, 1]) is at most ``threshold``."""

    exit0: ClassVar[None] = None  # no stage before exit 1

    threshold: float
    name: str = "entropy"

    def start(self, horizon: int) -> PolicyRun:
        return _ThresholdRun(horizon, lambda p: normalised_entropy(p) <= self.threshold)


def normalised_entropy(probs: np.ndarray) -> float:
    p = probs[probs > 0]
    return float(-(p * np.log(p)).sum() / math.log(len(probs)))


class _ThresholdRun(_LastRun):
    """Stop at the first exit whose softmax satisfies ``confident`` (or at the horizon)."""

    def __init__(self, horizon: int, confident: Callable[[np.ndarray], bool]) -> None:
        super().__init__(horizon)
        self.confident = confident

    def observe(self, probs: np.ndarray) -> bool:
        return self._at_horizon() or self.confident(probs)


@dataclass(frozen=True)
class Patience:
    """Stop once the predicted class has stayed the same for ``patience`` consecutive exits after the first
    that gave it (PABEE); ``patience = 1``: two agreeing exits in a row."""

    exit0: ClassVar[None] = None  # no stage before exit 1

    patience: int
    name: str = "patience"

    def start(self, horizon: int) -> PolicyRun:
        return _PatienceRun(horizon, self.patience)


class _PatienceRun(_LastRun):
    def __init__(self, horizon: int, patience: int) -> None:
        super().__init__(horizon)
        self.patience = patience
        self.last = -1
        self.streak = 0

    def observe(self, probs: np.ndarray) -> bool:
        label = int(probs.argmax())
        self.streak = self.streak + 1 if label == self.last else 0
        self.last = label
        return self._at_horizon() or self.streak >= self.patience


class DynamicIndex:
    """T-Tamer's index policy with recall, one precomputed table per horizon.

    After exit k in state s (the confidence bin), the best weighted loss so
    far ``X`` is updated; the run stops when ``X <= sigma_K[k][s]`` and then
    answers with the exit of lowest calibrated loss seen.

    ``answer_loss`` (n, n, m, m), when given, refines that last step: the loss
    of exit j's answer is read as ``answer_loss[j, k, s_j, s_k]``, its
    calibrated error given its own state *and* the state of the last exit run
    k (``models.fit``), instead of its own state alone.  The chain treats the
    exits' losses as independent given their own states, but they are not: a
    confident exit 1 followed by an unsure exit 2 is wrong far more often than
    exit 1's bin says, and marginal recall then answers with it.  Stopping
    still follows the chain's index.

    ``min_exit`` (1-based) is a floor: the run goes on to that exit whatever the index says (unless the horizon
    is shallower) and answers from it or deeper.  A taught model gets one from its check recording: calibration
    frames that are near copies of training frames make early exits look perfect, and the index alone would stop
    at exit 1 everywhere.
    """

    def __init__(self, bin_edges: np.ndarray, solutions: list[ChainSolution], name: str = "dynamic-index",
                 agreement: bool = False, answer_loss: np.ndarray | None = None, min_exit: int = 1,
                 statistic: str = "confidence", exit0: Exit0Tables | None = None) -> None:
        self.bin_edges = bin_edges  # (n, bins-1) inner edges of the confidence bins, per exit
        self.solutions = solutions  # index K-1 holds the table for horizon K
        self.name = name
        self.agreement = agreement  # state also says whether the exit agrees with the previous one
        self.answer_loss = answer_loss
        self.min_exit = max(1, min(min_exit, len(solutions)))
        self.statistic = statistic  # what the bins are of: max softmax, or "margin" (top-1 minus top-2)
        self.exit0 = exit0  # the last answer's stage, fitted on video (None: every frame runs exit 1)

    @property
    def lam(self) -> float:
        return self.solutions[-1].lam

    def start(self, horizon: int) -> PolicyRun:
        sol = self.solutions[min(horizon, len(self.solutions)) - 1]
        return _IndexRun(self.bin_edges, sol, self.bin_edges.shape[1] + 1 if self.agreement else 0,
                         self.answer_loss, self.min_exit, self.statistic == "margin")


class _IndexRun:
    __slots__ = ("_agree_offset", "_answer_loss", "_best", "_choice", "_edges", "_floor", "_k", "_last", "_margin",
                 "_r", "_sigma", "_states")

    def __init__(self, edges: np.ndarray, sol: ChainSolution, agree_offset: int,
                 answer_loss: np.ndarray | None = None, min_exit: int = 1, margin: bool = False) -> None:
        self._margin = margin
        self._edges = edges
        self._sigma = sol.sigma
        self._r = sol.weighted_loss
        self._agree_offset = agree_offset  # 0: confidence bins only
        self._answer_loss = answer_loss
        self._k = 0
        self._best = math.inf
        self._choice = 0
        self._last = -1
        self._states: list[int] = []
        self._floor = min(min_exit, sol.sigma.shape[0]) - 1  # 0-based: the shallowest exit that may answer

    def observe(self, probs: np.ndarray) -> bool:
        k = self._k
        if self._margin:
            top2 = np.partition(probs, -2)[-2:]
            stat = float(top2[1] - top2[0])
        else:
            stat = float(probs.max())
        state = int(np.searchsorted(self._edges[k], stat, side="right"))
        if self._agree_offset:
            label = int(probs.argmax())
            if label == self._last:
                state += self._agree_offset
            self._last = label
        self._states.append(state)
        r = self._r[k, state]
        self._k += 1
        if k < self._floor:  # below the floor: go on; cut short by the deadline, the deepest exit run answers
            self._choice = k
            return False
        if r <= self._best:  # on a tie the deeper exit answers
            self._best, self._choice = float(r), k
        return bool(self._best <= self._sigma[k, state])  # sigma is +inf at the horizon's last exit

    @property
    def choice(self) -> int:
        if self._answer_loss is None or self._k < 2:
            return self._choice
        k, s = self._k - 1, self._states
        table = self._answer_loss
        best = k  # on a tie the deeper exit answers
        for j in range(k - 1, min(self._floor, k) - 1, -1):
            if table[j, k, s[j], s[k]] < table[best, k, s[best], s[k]]:
                best = j
        return best


def run_on_trace(policy: ExitPolicy, exit_probs: np.ndarray, horizon: int) -> tuple[int, int]:
    """Replay one frame's per-exit softmax ``exit_probs`` (n, C): (exits run, index of the answering exit)."""
    run = policy.start(horizon)
    k = 0
    while not run.observe(exit_probs[k]):
        k += 1
    return k + 1, run.choice
