"""The T-Tamer dynamic index on a chain of exits (pure numpy, no I/O).

Model (T-Tamer, ICLR 2026, arXiv 2509.22992; our notation, exits 1-based in
the text, 0-based in arrays):

* after exit k the observed state is ``s_k`` in {0..m-1}; ``s_1 ~ p1``,
  ``s_{k+1} ~ P_k(s_k, .)``;
* the node loss of exit k in state s is ``loss[k][s] > 0`` and its weighted
  loss is ``R_k(s) = lam * loss[k][s]``;
* reaching exit k costs ``(1 - lam) * cost[k]``; the first exit is always paid;
* stopping after exit k returns the exit with the lowest loss seen so far
  (recall) and costs ``lam * min_{j<=k} loss_j(s_j) + (1 - lam) * sum_{j<=k} cost_j``.

With ``X`` the best weighted loss so far, the value after exit k is

    V_n(X, s) = X
    V_k(X, s) = min(X, C_k(X, s))
    C_k(X, s) = (1 - lam) * cost[k+1] + sum_{s'} P_k(s, s') * V_{k+1}(min(X, R_{k+1}(s')), s')

and the optimal expected objective is ``(1 - lam) * cost[1] + E_{s ~ p1} V_1(R_1(s), s)``.
``X - C_k(X, s)`` is continuous and non-decreasing in X, so the optimal rule
is an index: stop after exit k iff ``X <= sigma[k][s]``, where ``sigma[k][s]``
is the largest X at which stopping is at least as good as going on.  The last
exit of the horizon has ``sigma = +inf`` (it must stop).

Each ``V_k(., s)`` is piecewise linear; it is kept exactly as values on a
breakpoint grid (all ``R`` values, the indices found deeper in the chain,
and 0), between which it is linear, so ``np.interp`` evaluates it exactly and
the index is the exact root of a linear piece.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

import numpy as np


@dataclass(frozen=True)
class ChainSolution:
    """Result of ``solve_chain``.

    ``sigma[k, s]``: stop after exit k (0-based) in state s iff the best
    weighted loss so far ``X = lam * min loss`` is ``<= sigma[k, s]``;
    ``sigma[n-1, :] = inf``.  ``expected_objective`` is the optimum of
    ``E[lam * min loss + (1 - lam) * sum cost]``.  ``weighted_loss[k, s]`` is
    ``R_k(s)``, the number the online policy tracks.
    """

    sigma: np.ndarray  # (n, m)
    expected_objective: float
    weighted_loss: np.ndarray  # (n, m)
    lam: float

    @property
    def n_exits(self) -> int:
        return int(self.sigma.shape[0])

    def should_stop(self, k: int, state: int, best_weighted_loss: float) -> bool:
        return bool(best_weighted_loss <= self.sigma[k, state])


def _validate(p1: np.ndarray, transitions: Sequence[np.ndarray], loss: np.ndarray, cost: np.ndarray,
              lam: float) -> None:
    n, m = loss.shape
    if p1.shape != (m,) or not np.isclose(p1.sum(), 1.0) or (p1 < 0).any():
        raise ValueError(f"p1 must be a distribution over {m} states")
    if len(transitions) != n - 1:
        raise ValueError(f"need {n - 1} transition matrices for {n} exits, got {len(transitions)}")
    for k, P in enumerate(transitions):
        if P.shape != (m, m) or (P < 0).any() or not np.allclose(P.sum(axis=1), 1.0):
            raise ValueError(f"transitions[{k}] must be an {m}x{m} matrix whose rows sum to 1")
    if not (np.isfinite(loss).all() and (loss > 0).all()):
        raise ValueError("node losses must be finite and strictly positive")
    if cost.shape != (n,) or (cost < 0).any():
        raise ValueError(f"cost must hold {n} non-negative edge costs")
    if not 0.0 <= lam <= 1.0:
        raise ValueError(f"lam={lam} is outside [0, 1]")


def _indices_of(xs: np.ndarray, g: np.ndarray) -> np.ndarray:
    """Per row of ``g`` (states x grid): the largest x with g(x) <= 0, g piecewise linear through (xs, g[row]),
    non-decreasing, g(xs[-1]) > 0; 0 where g > 0 everywhere (X > 0 always: never stop there)."""
    rows = np.arange(g.shape[0])
    nonpos = g <= 0.0
    last = g.shape[1] - 1 - np.argmax(nonpos[:, ::-1], axis=1)
    nxt = np.minimum(last + 1, g.shape[1] - 1)
    gi, gn = g[rows, last], g[rows, nxt]
    exact = (gi == 0.0) | (nxt == last)
    with np.errstate(divide="ignore", invalid="ignore"):
        root = np.where(exact, xs[last], xs[last] - gi * (xs[nxt] - xs[last]) / (gn - gi))
    out: np.ndarray = np.where(nonpos.any(axis=1), root, 0.0)
    return out


def _interp(points: np.ndarray, xs: np.ndarray, values: np.ndarray) -> np.ndarray:
    """``np.interp(points, xs, values[i])`` for every row i of ``values`` at once: ``points`` (K,) shared by every
    row gives (rows, K); ``points`` (rows, 1), a point per row, gives (rows, 1). Points within [xs[0], xs[-1]]."""
    j = np.clip(np.searchsorted(xs, points, side="right") - 1, 0, len(xs) - 2)
    w = (points - xs[j]) / (xs[j + 1] - xs[j])
    rows = np.arange(values.shape[0])[:, None]
    out: np.ndarray = values[rows, j] * (1 - w) + values[rows, j + 1] * w
    return out


def solve_chain(p1: Sequence[float] | np.ndarray, transitions: Sequence[np.ndarray] | np.ndarray,
                loss: Sequence[Sequence[float]] | np.ndarray, cost: Sequence[float] | np.ndarray,
                lam: float) -> ChainSolution:
    """Backward DP with recall; see the module docstring for the exact convention."""
    p1 = np.asarray(p1, float)
    loss = np.asarray(loss, float)
    cost = np.asarray(cost, float)
    transitions = [np.asarray(P, float) for P in transitions]
    _validate(p1, transitions, loss, cost, lam)
    sigmas, objective = _backward(p1, transitions, list(loss), cost, lam)
    return ChainSolution(sigma=np.stack(sigmas), expected_objective=objective, weighted_loss=lam * loss, lam=lam)


def solve_states(p_first: np.ndarray, transitions: Sequence[np.ndarray], loss: Sequence[np.ndarray],
                 cost: np.ndarray, lam: float, check: bool = True) -> tuple[list[np.ndarray], float]:
    """The same DP on a chain whose exits have state spaces of their own sizes: exit k has ``len(loss[k])`` states
    and ``transitions[k]`` is (states of k, states of k+1). Returns each exit's index (``sigma[k][s]``) and the
    optimal expected objective. (Exit 0, the last answer, has a state space of its own: ``models.video``.)"""
    for k, P in enumerate(transitions if check else ()):
        if P.shape != (len(loss[k]), len(loss[k + 1])) or (P < 0).any() or not np.allclose(P.sum(axis=1), 1.0):
            raise ValueError(f"transitions[{k}] must be a {len(loss[k])}x{len(loss[k + 1])} stochastic matrix")
    if check and any(not (np.isfinite(v).all() and (v > 0).all()) for v in loss):
        raise ValueError("node losses must be finite and strictly positive")
    return _backward(np.asarray(p_first, float), list(transitions), [np.asarray(v, float) for v in loss],
                     np.asarray(cost, float), lam)


def _backward(p_first: np.ndarray, transitions: list[np.ndarray], loss: list[np.ndarray], cost: np.ndarray,
              lam: float) -> tuple[list[np.ndarray], float]:
    n = len(loss)
    R = [lam * v for v in loss]
    big = float(max(r.max() for r in R) + (1 - lam) * cost.sum() + 1.0)  # beyond every reachable X and every C
    xs = np.unique(np.concatenate([[0.0, big], *R]))
    values = np.tile(xs, (len(R[-1]), 1))  # V_n(X, s) = X
    sigma = [np.full(len(v), np.inf) for v in loss]
    for k in range(n - 2, -1, -1):
        P, r_next = transitions[k], R[k + 1]
        # C_k on the grid: V_{k+1}(min(X, r), s') for every s': V_{k+1} itself up to r, its value at r beyond (r is a
        # grid point, so this is exact)
        at_r = _interp(r_next[:, None], xs, values)
        inner = np.where(xs[None, :] <= r_next[:, None], values, at_r)
        cont = (1 - lam) * cost[k + 1] + P @ inner  # (states of k, len(xs)), linear between grid points
        sigma[k] = _indices_of(xs, xs[None, :] - cont)
        new_xs = np.unique(np.concatenate([xs, sigma[k][np.isfinite(sigma[k])]]))
        xs, values = new_xs, np.minimum(new_xs, _interp(new_xs, xs, cont))
    start = _interp(R[0][:, None], xs, values)[:, 0]
    return sigma, float((1 - lam) * cost[0] + p_first @ start)


def truncate(p1: np.ndarray, transitions: Sequence[np.ndarray], loss: np.ndarray, cost: np.ndarray,
             horizon: int) -> tuple[np.ndarray, list[np.ndarray], np.ndarray, np.ndarray]:
    """The chain of the first ``horizon`` exits (what a deadline allows)."""
    if not 1 <= horizon <= loss.shape[0]:
        raise ValueError(f"horizon {horizon} outside 1..{loss.shape[0]}")
    return p1, list(transitions[: horizon - 1]), loss[:horizon], cost[:horizon]


def solve_horizons(p1: np.ndarray, transitions: Sequence[np.ndarray], loss: np.ndarray, cost: np.ndarray,
                   lam: float) -> list[ChainSolution]:
    """One solution per horizon K = 1..n (index K-1), precomputed for deadline truncation."""
    return [solve_chain(*truncate(p1, transitions, loss, cost, K), lam) for K in range(1, loss.shape[0] + 1)]
