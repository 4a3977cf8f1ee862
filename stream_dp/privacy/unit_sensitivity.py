"""Unit-level sensitivity: up to k events of one privacy unit, at least b steps apart.

A learner that bounds contributions (:mod:`stream_dp.privacy.contribution`) admits at most ``k``
events of a unit, any two of them at least ``b`` steps apart on the learner's step clock. The
neighbouring relation is then *replace up to k admitted events of one unit, step indices
preserved* (``docs/units.md``). This module certifies the sensitivity of the two mechanisms for
that relation.

**Correlated noise** (:class:`~stream_dp.privacy.mf.MFMechanism`). One event at step t changes
the gradient rows by at most its influence pattern ``u`` placed at t
(:mod:`stream_dp.privacy.influence`); k events at steps ``t_1 < … < t_k`` change row r by at most
``U_r = Σ_i u[r − t_i]`` (``docs/units.md`` shows why the sum also covers a pair of two of the
unit's own events), so with C ≥ 0 the sensitivity is ``max ‖C·U‖`` over admissible placements
(``t_{i+1} − t_i ≥ b``). With ``v = C·u`` (pattern at the first step, 0-based rows) and
``R(s, N) = Σ_{m<N} v_m v_{m+s}``, a placement at 0-based steps ``τ_i`` has

    ‖C·U‖² = Σ_i R(0, n − τ_i) + 2 Σ_{i<j} R(τ_j − τ_i, n − τ_j).

Every term is ≥ 0 and shrinks when its pair moves later (fewer rows). Write ``τ*_i = i·b``
(i = 0 … k − 1) for the placement b apart from the start; any admissible placement has
``τ_i ≥ τ*_i`` and ``τ_j − τ_i ≥ (j − i)·b``. Hence the certified bound

    Δ² = Σ_i R(0, n − τ*_i) + 2 Σ_{i<j} max_{s ≥ (j−i)b} R(s, n − τ*_i − s),

valid for every Toeplitz C with non-negative, non-increasing coefficients (BLT, square-root,
independent). For ``s ≥ L − 1`` (L = len(u)) ``v_{m+s}`` is non-increasing in s, so the max is
over ``s ∈ [(j−i)b, max((j−i)b, L − 1)]`` only. When ``b ≥ L − 1`` every max sits at
``s = (j − i)b`` and Δ is ``‖C·U‖`` of the placement b apart from the start: the worst placement,
*exactly* (Kalinin & Lampert, NeurIPS 2024, Thm. 2, is the case ``L = 1``). Below that separation
the bound is exact whenever each max sits at its smallest s, which :func:`unit_sensitivity` checks
and reports.

**Output perturbation** (OnPairStrC, OnPairC). The certified recurrence of
:mod:`stream_dp.sensitivity` is subadditive over differing records, so ``‖w_t − w′_t‖ ≤
min(diam C, k·Δ_t)`` for k replaced records (:func:`replaced_events_bound`).

Derivations: ``docs/units.md``, *Sensitivity at the unit level*.

"""

from __future__ import annotations

import dataclasses
import math

import numpy as np

from stream_dp._jit import jitable
from stream_dp._signal import fftconvolve
from stream_dp.privacy.blt import BLT, _geom
from stream_dp.privacy.factorizations import (
    Factorization,
    Independent,
    ToeplitzFactorization,
    _check_horizon,
    _check_pattern,
)

__all__ = [
    "UnitSensitivity",
    "unit_sensitivity",
    "placement_sensitivity",
    "replaced_events",
    "replaced_events_bound",
]

# Δ is rounded up by this factor, as the factorizations' own sensitivities are: it covers the
# rounding of Δ's computation (sums of at most ~10⁴ positive terms), not the noise's.
_ROUND_UP = 1.0 + 1e-9
# A max over s counts as attained at the smallest s when no other s beats it by more than this.
_TIE = 1e-12
# (pair, separation) values evaluated per call of the autocorrelation (bounds its memory).
_BATCH = 4096


@dataclasses.dataclass(frozen=True)
class UnitSensitivity:
    """The certified sensitivity of a unit's events, and how it was obtained.

    Attributes
    ----------
    sensitivity
        Δ for up to ``max_events`` events of one unit, ``min_separation`` steps apart.
    event_sensitivity
        Δ of one event (the factorization's own ``sensitivity(pattern, horizon)``).
    max_events, min_separation, horizon
        k, b and n (None: unbounded).
    exact
        True when Δ is attained by an admissible placement (b apart from the start): no
        placement does better, and the bound is not loose.
    method
        ``"event"`` (k = 1: the event-level Δ itself), ``"placement"`` (the bound of the module
        docstring) or ``"triangle"`` (``k × Δ_event``, for a factorization that is not a
        non-increasing Toeplitz).

    """

    sensitivity: float
    event_sensitivity: float
    max_events: int
    min_separation: int
    horizon: int | None
    exact: bool
    method: str

    @property
    def ratio(self) -> float:
        """``Δ_k / Δ_1``; the ρ of the same σ grows by its square."""
        return self.sensitivity / self.event_sensitivity


def unit_sensitivity(
    factorization: Factorization,
    pattern,
    horizon: int | None,
    max_events: int,
    min_separation: int,
) -> UnitSensitivity:
    """Certified ``sup ‖C(G − G′)‖_F`` when up to k events of one unit, ≥ b steps apart, differ.

    Parameters
    ----------
    factorization
        The strategy C.
    pattern
        The influence pattern u of one event (:mod:`stream_dp.privacy.influence`).
    horizon
        n; ``None`` for an unbounded stream (BLT only, as :class:`~stream_dp.privacy.mf.
        MFMechanism`).
    max_events, min_separation
        k ≥ 1 and b ≥ 1 of the contribution bound.

    Examples
    --------
    >>> from stream_dp.privacy.blt import BLT
    >>> from stream_dp.privacy.influence import PairTermBounds, window_pattern
    >>> u = window_pattern(8, 8, PairTermBounds(1.0, 1.0))
    >>> blt = BLT.fit(1000)
    >>> one = unit_sensitivity(blt, u, 1000, max_events=1, min_separation=1)
    >>> one.sensitivity == blt.sensitivity(u, 1000)
    True
    >>> four = unit_sensitivity(blt, u, 1000, max_events=4, min_separation=9)
    >>> four.method, four.exact, bool(2 < four.ratio < 4)
    ('placement', True, True)

    """
    k = _positive_int(max_events, "max_events")
    b = _positive_int(min_separation, "min_separation")
    u = _check_pattern(pattern)
    if horizon is None and not isinstance(factorization, BLT):
        raise ValueError("an unknown horizon needs BLT noise (its column norms converge)")
    n = None if horizon is None else _check_horizon(horizon)
    event = float(factorization.sensitivity(u, n))
    if k == 1:
        return UnitSensitivity(event, event, 1, b, n, True, "event")
    auto = _autocorrelation(factorization, u, n)
    if auto is None:
        return UnitSensitivity(k * event * _ROUND_UP, event, k, b, n, False, "triangle")
    square, exact = _placement_bound(auto, len(u), k, b, n)
    delta = math.sqrt(square) * _ROUND_UP
    return UnitSensitivity(max(delta, event), event, k, b, n, exact, "placement")


def placement_sensitivity(factorization: Factorization, pattern, steps, horizon: int) -> float:
    """``‖C·Σ_i S^{t_i} u‖`` over n rows for the 1-based steps ``t_i`` (no rounding up).

    The exact value of one placement: the brute-force maximum the tests and the audit hold
    :func:`unit_sensitivity` to. Steps past the horizon contribute nothing.

    Examples
    --------
    >>> from stream_dp.privacy.factorizations import Independent
    >>> placement_sensitivity(Independent(), [3.0, 4.0], [1], horizon=5)
    5.0

    """
    n = _check_horizon(horizon)
    u = _check_pattern(pattern)
    U = np.zeros(n)
    for t in steps:
        t = int(t)
        if not 1 <= t:
            raise ValueError(f"steps are 1-based, got {t}")
        if t <= n:
            m = min(len(u), n - t + 1)
            U[t - 1 : t - 1 + m] += u[:m]
    if isinstance(factorization, ToeplitzFactorization):
        v = fftconvolve(factorization.coefficients(n), U)[:n]
    else:
        v = factorization.strategy_matrix(n) @ U
    return float(math.sqrt(math.fsum(v * v)))


def replaced_events_bound(event_bound: float, max_events: int, diameter: float) -> float:
    """``min(diam C, k·Δ_t)``: the iterate's sensitivity when k records differ.

    The certified recurrence ``Δ_t(I) ≤ min(diam, q_t·Δ_{t−1}(I) + e_t(I))`` has
    ``e_t(I) ≤ Σ_{i∈I} e_t(i)`` (a pair term with two differing records still differs by at most
    2G), and ``x ↦ min(diam, q·x + e)`` is monotone and ``min(diam, a + b) ≤ min(diam, a) +
    min(diam, b)``; by induction ``Δ_t(I) ≤ Σ_{i∈I} Δ_t(i) ≤ |I|·Δ_t``. Both iterates lie in C,
    so the diameter caps it. OnPairStrC's and OnPairC's release noise for k events is then this
    bound over ``√(2ρ_k)``, and ρ grows by k² at the same σ (group privacy, no better).

    Examples
    --------
    >>> replaced_events_bound(0.3, 4, diameter=2.0), replaced_events_bound(0.3, 10, diameter=2.0)
    (1.2, 2.0)
    >>> replaced_events_bound(2.5, 1, diameter=2.0)  # k = 1: the event-level bound, unchanged
    2.5

    """
    k = _positive_int(max_events, "max_events")
    e, diam = float(event_bound), float(diameter)
    if not (e >= 0 and diam > 0 and math.isfinite(e) and math.isfinite(diam)):
        raise ValueError(f"need a finite bound >= 0 and a diameter > 0, got {e!r}, {diam!r}")
    return replaced_events(e, k, diam)


@jitable
def replaced_events(event_bound: float, max_events: int, diameter: float) -> float:
    """:func:`replaced_events_bound` without its checks: the rule itself, which the compiled
    release of output perturbation calls too (one rule for both paths)."""
    if max_events == 1:  # the event-level bound itself, bit for bit (Lemma 4's may exceed diam)
        return event_bound
    return min(diameter, max_events * event_bound)


# -- the autocorrelation R(s, N) = Σ_{m<N} v_m v_{m+s} of v = C·u --------------------------------


class _DenseAutocorrelation:
    """R(s, N) from ``v = C·u`` over n rows (any non-increasing Toeplitz C, finite n)."""

    def __init__(self, v: np.ndarray) -> None:
        self.v = v

    def __call__(self, s: np.ndarray, N: np.ndarray) -> np.ndarray:
        v = self.v
        out = np.zeros(len(s))
        for i, (si, Ni) in enumerate(zip(s.tolist(), N.tolist(), strict=True)):
            Ni = int(Ni)
            if Ni > 0:
                out[i] = math.fsum(v[:Ni] * v[si : si + Ni])
        return out


class _BLTAutocorrelation:
    """R(s, N) in closed form for a BLT, any N (``inf`` included) in O(L + k²) per value.

    ``v_m`` for ``m < L`` is computed directly; from ``m = L`` on it is ``Σ_j γ_j θ_j^{m−L}``
    (:meth:`BLT.sensitivity`), so ``Σ_{m=L}^{N−1} v_m v_{m+s} = Σ_{i,j} γ_i γ_j θ_j^s
    g(θ_iθ_j, N − L)``. Every term is positive: nothing cancels.
    """

    def __init__(self, blt: BLT, u: np.ndarray) -> None:
        L = len(u)
        self.L = L
        self.head = np.convolve(blt.coefficients(L), u)[:L]
        powers = blt.theta[None, :] ** np.arange(L - 1, -1, -1, dtype=float)[:, None]
        self.gamma = blt.omega * (u @ powers)
        self.log_theta = np.log(blt.theta)
        self.pair = self.log_theta[:, None] + self.log_theta[None, :]
        self.gamma2 = np.outer(self.gamma, self.gamma)

    def values(self, m: np.ndarray) -> np.ndarray:
        """``v_m`` for an integer array m ≥ 0."""
        m = np.asarray(m, dtype=np.int64)
        out = np.empty(m.shape)
        head = m < self.L
        out[head] = self.head[m[head]]
        e = (m[~head] - self.L).astype(float)
        out[~head] = np.exp(e[:, None] * self.log_theta[None, :]) @ self.gamma
        return out

    def __call__(self, s: np.ndarray, N: np.ndarray) -> np.ndarray:
        L = self.L
        s = np.asarray(s, dtype=np.int64)
        N = np.asarray(N, dtype=float)
        m = np.arange(L)
        # Head: Σ_{m < min(N, L)} v_m v_{m+s} (all terms ≥ 0), computed once per distinct s.
        us, which = np.unique(s, return_inverse=True)
        shifted = self.values((m[None, :] + us[:, None]).ravel()).reshape(len(us), L)
        partial = np.cumsum(self.head[None, :] * shifted, axis=1)
        count = np.clip(np.minimum(N, L), 0, L).astype(np.int64)
        out = np.where(count > 0, partial[which, np.maximum(count - 1, 0)], 0.0)
        # Tail: rows L … N − 1 in closed form.
        far = N > L
        if np.any(far):
            decay = np.exp(s[far, None] * self.log_theta[None, :])
            rest = N[far] - L
            if np.all(np.isinf(rest)):
                sums = np.broadcast_to(_geom(self.pair, math.inf), (len(rest), *self.pair.shape))
            else:  # _geom's Σ_{m<N} q^m, for an array of N
                sums = np.expm1(rest[:, None, None] * self.pair) / np.expm1(self.pair)
            out[far] += np.einsum("ij,sj,sij->s", self.gamma2, decay, sums)
        return out


def _autocorrelation(f: Factorization, u: np.ndarray, n: int | None):
    """The R(s, N) oracle of v = C·u, or None when C is not a non-increasing Toeplitz."""
    if isinstance(f, BLT):
        return _BLTAutocorrelation(f, u)
    if n is None:  # pragma: no cover - guarded by unit_sensitivity
        return None
    if isinstance(f, Independent):
        c = np.zeros(n)
        c[0] = 1.0
    elif isinstance(f, ToeplitzFactorization):
        c = f.coefficients(n)
    else:
        return None
    if np.any(c < 0) or np.any(np.diff(c) > 0):
        return None
    # Direct convolution: exact zeros stay zeros (an FFT would leave ±1e-17 where v is 0).
    return _DenseAutocorrelation(np.convolve(c, u)[:n])


def _placement_bound(R, L: int, k: int, b: int, n: int | None) -> tuple[float, bool]:
    """Δ² of the module docstring and whether it is attained (every max at its smallest s)."""
    rows = math.inf if n is None else float(n)
    starts = np.array([i * b for i in range(k) if i * b < rows], dtype=float)
    terms = [R(np.zeros(len(starts), dtype=np.int64), rows - starts)]
    exact = True
    for gap in range(1, len(starts)):
        d = gap * b
        s = np.arange(d, max(d, L - 1) + 1, dtype=np.int64)
        taus = starts[: len(starts) - gap]
        # One call per gap, in chunks of at most _BATCH (pair, s) values: every pair i < j that
        # far apart, every candidate separation s.
        for first in range(0, len(taus), max(1, _BATCH // len(s))):
            tau = taus[first : first + max(1, _BATCH // len(s))]
            vals = R(np.tile(s, len(tau)), (rows - tau[:, None] - s[None, :]).ravel())
            vals = vals.reshape(len(tau), len(s))
            best = vals.max(axis=1)
            if np.any(best > vals[:, 0] * (1.0 + _TIE)):
                exact = False
            terms.append(2.0 * best)
    return math.fsum(np.concatenate(terms)), exact


def _positive_int(v, name: str) -> int:
    if isinstance(v, bool) or not isinstance(v, int | np.integer) or v < 1:
        raise ValueError(f"{name} must be a positive integer, got {v!r}")
    return int(v)
