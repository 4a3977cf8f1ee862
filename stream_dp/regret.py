"""Online regret (Huai et al. 2020, eq. 4), for the trusted operator.

``R(T) = Σ_t L̂_t(w̃_{t−1}) − min_{w ∈ C} Σ_t L̂_t(w)``: each model that was served is charged
the penalty of the *next* record against its buffer. These numbers are computed from raw data:
they go to logs and metrics for the operator, never to the release topic.

"""

from __future__ import annotations

import math

import numpy as np

__all__ = ["RegretTracker"]


class RegretTracker:
    """Cumulative penalty of the served models, and the best fixed comparator in hindsight.

    Parameters
    ----------
    keep_history
        Keep every (clipped) record and its buffer membership so that
        :meth:`best_fixed_comparator` can be solved at the end of a finite run. Costs O(n·d)
        memory; off by default.

    """

    def __init__(self, keep_history: bool = False) -> None:
        self.keep_history = keep_history
        self.cumulative = 0.0
        self.steps = 0
        self._xs: list[np.ndarray] = []
        self._ys: list[float] = []
        self._members: list[np.ndarray | None] = []
        self._row_of_step: dict[int, int] = {}

    def record(self, penalty: float) -> None:
        self.cumulative += penalty
        self.steps += 1

    def remember(
        self,
        x: np.ndarray,
        y: float,
        member_ids: np.ndarray,
        step: int | None = None,
        scored: bool = True,
    ) -> None:
        """Store record ``step`` and the ids (1-based arrival steps) of its buffer partners.

        Every record must be remembered, even on a step with no served model (``scored=False``):
        it can still be a partner of later scored steps, whose ``member_ids`` name it by step.
        """
        if self.keep_history:
            step = len(self._xs) + 1 if step is None else int(step)
            self._row_of_step[step] = len(self._xs)
            self._xs.append(x.copy())
            self._ys.append(y)
            self._members.append(member_ids.copy() if scored else None)

    def nbytes(self) -> int:
        """Bytes of the records kept for the comparator (0 without ``keep_history``)."""
        return sum(a.nbytes for a in self._xs) + sum(
            a.nbytes for a in self._members if a is not None
        )

    @property
    def average_penalty(self) -> float:
        return self.cumulative / self.steps if self.steps else math.nan

    def best_fixed_comparator(
        self,
        loss,
        constraint,
        shape: tuple[int, ...],
        iterations: int = 300,
        max_pairs: int = 2_000_000,
        seed: int = 0,
    ) -> tuple[np.ndarray, float, bool]:
        """``argmin_{w∈C} Σ_t L̂_t(w)`` by projected gradient descent (step ``1/L``).

        Returns ``(w*, Σ_t L̂_t(w*), exact)``. If the run holds more than ``max_pairs`` pairs,
        the objective is estimated on a fixed uniform sample of pairs, reweighted by
        ``1/|B_t|`` (unbiased), and ``exact`` is False.
        """
        if not self.keep_history:
            raise RuntimeError("construct the learner with keep_history=True to solve this")
        X = np.asarray(self._xs)
        Y = np.asarray(self._ys)
        a_idx, b_idx, weight = [], [], []
        lookup = np.full(max(self._row_of_step, default=0) + 2, -1, dtype=np.int64)
        lookup[list(self._row_of_step)] = list(self._row_of_step.values())
        n_steps = 0
        for t, m in enumerate(self._members):
            if m is None:
                continue  # not a scored step (no model was served yet)
            n_steps += 1
            ids = np.asarray(m, dtype=np.int64)
            rows = lookup[ids[(ids >= 0) & (ids < len(lookup))]]
            rows = rows[rows >= 0]
            if len(rows):
                a_idx.append(np.full(len(rows), t))
                b_idx.append(rows)
                weight.append(np.full(len(rows), 1.0 / len(rows)))
        if not a_idx:
            return np.zeros(shape), 0.0, True
        a = np.concatenate(a_idx)
        b = np.concatenate(b_idx)
        wt = np.concatenate(weight)
        exact = len(a) <= max_pairs
        scale = 1.0
        if not exact:
            rng = np.random.default_rng(seed)
            pick = rng.choice(len(a), size=max_pairs, replace=False)
            scale = len(a) / max_pairs
            a, b, wt = a[pick], b[pick], wt[pick]
        D = X[a] - X[b]
        c = loss.pair_coefficients(Y[a], Y[b])
        const = loss.constants(float(np.max(np.linalg.norm(X, axis=1))), constraint.radius)
        lr = 1.0 / max(const.smoothness, 1e-12) if math.isfinite(const.smoothness) else 0.1

        def objective(w: np.ndarray) -> float:
            return float(scale * (wt * loss.pair_values(w, D, c)).sum())

        w = np.zeros(shape)
        for _ in range(iterations):
            # The mean objective (÷ number of steps) is L-smooth; its gradient:
            g = scale * loss.pair_gradient_sum(w, D, c, wt) / n_steps
            w = constraint.project(w - lr * g)
        return w, objective(w), exact
