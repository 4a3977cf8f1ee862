"""Continual release of running sums: several bounded series, one correlated-noise Gaussian charge.

An operator wants running totals — the penalty of the served models, how many records were
clipped — at every status interval for the whole stream. Noising each published total afresh
would cost a charge per publication. The matrix-factorization mechanism (``docs/privacy.md``,
*Correlated noise* and *Operator metrics*) perturbs the whole stream of per-step values once
instead: with ``V`` the ``n × k`` values of k series, a factorization ``A = B·C`` of the
prefix-sum matrix (:mod:`stream_dp.privacy.factorizations`) and ``M`` with ``M·C = I``, it
publishes (up to post-processing) ``Y = C·Ṽ + σZ``, and the running sums are

    Ŝ(t) = (A·M·Y)_t = S(t) + σ·Σ_{s≤t} (M·Z)_s          (A·M·C = A)

Every running sum at every step is post-processing of ``Y``, so publishing at every interval, or
at every step, costs nothing beyond the single charge ``ρ = Δ²/(2σ²)``. Both factors are lower
triangular, so ``Ŝ(t)`` depends on the values of steps ``≤ t`` only and can be published at t.

**Several series.** Series j has an *influence pattern* ``u_j``: over neighbouring streams
``|v_{j,i+k} − v′_{j,i+k}| ≤ u_j[k]`` for the changed record's step i (the approach of
:mod:`stream_dp.privacy.influence`), hence ``‖C·D_j‖ ≤ Δ_j = factorization.sensitivity(u_j)``.
Each series is divided by its ``Δ_j`` before noise (``Ṽ_j = V_j/Δ_j``), so each has sensitivity
≤ 1 and all k together ``√k`` (one record changes all of them: ``‖C·D̃‖_F² ≤ Σ_j 1``). One σ
for ``√k`` is one charge; in the series' own units the noise of series j is ``σ·Δ_j·N_j(t)``
with ``N(t) = Σ_{s≤t}(M·Z)_s`` of variance ``prefix_variance(t)`` per coordinate. Each series
thus gets the same share ``ρ/k``.

**What is kept.** Only the data-independent noise prefix ``N(t)``: the caller passes the true
running sums ``S(t)``, which it keeps anyway. ``N(t)`` is a pure function of (secret, model id,
t) — the binary tree's is the sum of the keyed node rows of t's dyadic decomposition; a BLT's is
accumulated row by row, one addition per step in step order, so it is the same to the bit
whichever steps were published — and a replayed step re-publishes its value.

**Horizons.** A known horizon n: the factorization and Δ are those of n steps. ``horizon=None``
(BLT only): Δ is the limit ``n → ∞``, which bounds every horizon (``BLT.sensitivity``), so one
charge covers an unbounded stream.
"""

from __future__ import annotations

import math
from collections.abc import Sequence

import numpy as np

from stream_dp.privacy.blt import BLT
from stream_dp.privacy.correlated_noise import CorrelatedNoise, standard_rows, tree_node_counters
from stream_dp.privacy.events import GaussianEvent, gaussian_rho
from stream_dp.privacy.factorizations import BinaryTree, Factorization
from stream_dp.privacy.mechanisms import gaussian_sigma_zcdp
from stream_dp.privacy.noise import KeyedNoise

__all__ = ["ContinualSums", "prefix_variance_at", "series_sensitivity"]

# The schedules' convention: ρ is shaved by 1e-9 relative so that the cost computed back from
# (Δ, σ) in floating point can never exceed the share it was derived from.
_SHARE = 1.0 - 1e-9
# The exact sensitivities are quadratic in the pattern's length (the tree scans every offset of
# every level, BLT sums the first L rows directly); a longer tail takes the triangle inequality.
_EXACT_PATTERN = 4096
# Noise rows are drawn at most this many steps at a time when catching up.
_CATCH_UP_ROWS = 65536


def series_sensitivity(factorization: Factorization, pattern, horizon: int | None) -> float:
    """``sup ‖C·D‖`` over series differences bounded by ``pattern`` (placed anywhere).

    The factorization's own bound (exact for Toeplitz, BLT and the tree) for the first 4096
    entries of the pattern; a longer pattern's tail adds ``‖tail‖₁ · max_j ‖C e_j‖`` (the
    triangle inequality, valid for every C: ``sup ‖C(D_head + D_tail)‖ ≤ sup ‖C D_head‖ +
    sup ‖C D_tail‖``), because the exact computations are quadratic in the pattern's length.

    Examples
    --------
    >>> from stream_dp.privacy.factorizations import BinaryTree
    >>> round(series_sensitivity(BinaryTree(), [1.0], 1000) ** 2, 9)  # one step: √(levels)
    10.0

    """
    u = np.asarray(pattern, dtype=float)
    if horizon is None and not isinstance(factorization, BLT):
        raise ValueError("an unbounded stream needs BLT noise (its column norms converge)")
    head, tail = u[:_EXACT_PATTERN], u[_EXACT_PATTERN:]
    bound = float(factorization.sensitivity(head, horizon))
    if len(tail):
        # One step's exact sensitivity is the largest column norm max_j ‖C e_j‖.
        bound += float(np.abs(tail).sum()) * float(factorization.sensitivity(np.ones(1), horizon))
    return bound


def prefix_variance_at(factorization: Factorization, t: int) -> float:
    """Per-coordinate variance of ``N(t) = Σ_{s≤t}(M·Z)_s``: the noise of a running sum at t.

    ``popcount(t)`` for the binary tree (the plain estimator); the prefix-sum variance of step t,
    which is the largest up to t, for the Toeplitz factorizations and ``Independent`` (closed
    form for BLT).

    Examples
    --------
    >>> from stream_dp.privacy.factorizations import BinaryTree, Independent
    >>> prefix_variance_at(BinaryTree(), 7), prefix_variance_at(Independent(), 7)
    (3.0, 7.0)

    """
    t = int(t)
    if t < 1:
        return 0.0
    if isinstance(factorization, BinaryTree):
        return float(bin(t).count("1"))
    return float(factorization.max_error(t))


class ContinualSums:
    """Running sums of k bounded series, released at any step under one zCDP charge.

    Parameters
    ----------
    factorization
        :class:`~stream_dp.privacy.blt.BLT` (the default choice: lowest error, O(k) state, and
        the only one for an unbounded stream) or
        :class:`~stream_dp.privacy.factorizations.BinaryTree`.
    patterns
        One influence pattern per series (see the module docstring).
    horizon
        The last step covered; ``None`` for an unbounded stream (BLT only).
    rho
        The zCDP cost of the whole mechanism (> 0).
    keyed
        The keyed noise of the model these sums describe; its ``purpose`` lane is used.
    purpose
        The :data:`~stream_dp.privacy.noise.PURPOSES` lane of the noise.

    Examples
    --------
    >>> from stream_dp.privacy.factorizations import BinaryTree
    >>> sums = ContinualSums(BinaryTree(), [[1.0], [1.0]], horizon=64, rho=0.5,
    ...                      keyed=KeyedNoise(secret=3, model_id="m"))
    >>> round(sums.sigma, 6), sums.charged_rho <= 0.5
    (1.414214, True)
    >>> a = sums.release(10, np.array([4.0, 1.0]))
    >>> b = ContinualSums(BinaryTree(), [[1.0], [1.0]], 64, 0.5, KeyedNoise(3, "m"))
    >>> bool(np.array_equal(a, b.release(10, np.array([4.0, 1.0]))))  # keyed: a replay
    True

    """

    def __init__(
        self,
        factorization: Factorization,
        patterns: Sequence,
        horizon: int | None,
        rho: float,
        keyed: KeyedNoise,
        purpose: str = "metrics",
    ) -> None:
        if not isinstance(factorization, BLT | BinaryTree):
            raise ValueError(f"continual sums stream with BLT or the binary tree, not "
                             f"{factorization!r}")  # fmt: skip
        if not patterns:
            raise ValueError("give at least one series")
        if not (rho > 0 and math.isfinite(rho)):
            raise ValueError(f"rho must be positive and finite, got {rho!r}")
        self.factorization = factorization
        self.horizon = None if horizon is None else int(horizon)
        self.patterns = [np.asarray(u, dtype=float) for u in patterns]
        self.size = len(self.patterns)
        self.sensitivities = np.array(
            [series_sensitivity(factorization, u, self.horizon) for u in self.patterns]
        )
        if not np.all(self.sensitivities > 0):
            raise ValueError("every series needs a non-zero influence pattern")
        self.rho = float(rho)
        self.sigma = gaussian_sigma_zcdp(self.joint_sensitivity, self.rho * _SHARE)
        self.keyed = keyed
        self.purpose = purpose
        self._rows = (
            None
            if isinstance(factorization, BinaryTree)
            else CorrelatedNoise(factorization, keyed, self.size, purpose)
        )
        self._at = 0  # N(t) below is the noise prefix through step _at
        self._prefix = np.zeros(self.size)

    @property
    def joint_sensitivity(self) -> float:
        """``√k``: each series is scaled to sensitivity 1 before noise."""
        return math.sqrt(self.size)

    @property
    def charged_rho(self) -> float:
        """The zCDP cost ``Δ²/(2σ²)`` of the mechanism's one charge (just under ``rho``)."""
        return gaussian_rho(self.joint_sensitivity, self.sigma)

    def event(self, step: int, mechanism: str) -> GaussianEvent:
        """The one ledger event of the whole mechanism (charge it before the first release)."""
        return GaussianEvent(int(step), self.joint_sensitivity, self.sigma, mechanism)

    # -- noise ------------------------------------------------------------------------------
    def standard_prefix(self, t: int) -> np.ndarray:
        """``N(t) = Σ_{s≤t}(M·Z)_s`` (σ = 1, unscaled); t may not go back for BLT noise."""
        t = int(t)
        if t < 0 or (self.horizon is not None and t > self.horizon):
            raise ValueError(f"step {t} is outside 0 … {self.horizon}")
        if t == 0:
            return np.zeros(self.size)
        if self._rows is None:  # the tree: the nodes of t's decomposition
            nodes = BinaryTree.decomposition(t)
            rows = standard_rows(self.keyed, tree_node_counters(nodes), self.size, self.purpose)
            return rows.sum(axis=0)
        if t < self._at:
            raise ValueError(f"the running sums have reached step {self._at}; {t} is behind")
        while self._at < t:
            m = min(t - self._at, _CATCH_UP_ROWS)
            rows = self._rows.next_rows(m)
            # One addition per step, in step order: the same bits whatever was published.
            self._prefix = np.cumsum(np.vstack([self._prefix, rows]), axis=0)[-1]
            self._at += m
        return self._prefix.copy()

    def noise(self, t: int) -> np.ndarray:
        """The noise of the running sums at step t, in the series' own units."""
        return self.sigma * self.sensitivities * self.standard_prefix(t)

    def std(self, t: int) -> np.ndarray:
        """The standard deviation of that noise, per series (data-independent)."""
        return (
            self.sigma * self.sensitivities * math.sqrt(prefix_variance_at(self.factorization, t))
        )

    def release(self, t: int, totals) -> np.ndarray:
        """``S(t) + noise``: the private running sums at step t from the true ones."""
        totals = np.asarray(totals, dtype=float)
        if totals.shape != (self.size,):
            raise ValueError(f"expected {self.size} running sums, got shape {totals.shape}")
        return totals + self.noise(t)

    # -- checkpoints ------------------------------------------------------------------------
    def state_dict(self) -> dict:
        state: dict = {"at": self._at, "prefix": self._prefix.tolist()}
        if self._rows is not None:
            state["rows"] = self._rows.state_dict()
        return state

    def load_state_dict(self, state: dict) -> None:
        if self._rows is not None:
            self._rows.load_state_dict(state["rows"])
        self._at = int(state["at"])
        self._prefix = np.asarray(state["prefix"], dtype=float)
