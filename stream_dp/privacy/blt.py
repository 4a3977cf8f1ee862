"""Buffered linear Toeplitz (BLT) factorizations, fitted in closed form without JAX.

A BLT (Dvijotham, McMahan, Pillutla, Steinke, Thakurta 2024, arXiv 2404.16706; McMahan, Xu,
Zhang 2024, arXiv 2408.08868) is the lower-triangular Toeplitz ``C`` whose generating function is
the rational function

    c(x) = Π_j (1 − λ_j x) / Π_j (1 − θ_j x)        (k poles θ_j, k zeros λ_j)

Both ``C`` and ``C⁻¹`` (generating function ``1/c(x)``) are then sums of k geometric sequences:

    c_0 = 1,  c_m = Σ_j ω_j θ_j^{m−1}        d_0 = 1,  d_m = Σ_j β_j λ_j^{m−1}        (m ≥ 1)

with ``ω_i = Π_j (θ_i − λ_j) / Π_{j≠i} (θ_i − θ_j)`` and ``β_i = Π_j (λ_i − θ_j) / Π_{j≠i} (λ_i −
λ_j)`` (partial fractions). The noise ``C⁻¹Z`` is therefore a k-buffer linear recurrence: O(k·p)
state and work per step (:mod:`stream_dp.privacy.correlated_noise`).

**Interlacing.** We only use ``0 < λ_1 < θ_1 < λ_2 < θ_2 < … < λ_k < θ_k < 1``. Then every
``ω_i > 0`` and every ``β_i < 0`` (count the negative factors), so ``C`` has positive,
decreasing coefficients — which the exact sensitivity of
:meth:`~stream_dp.privacy.factorizations.ToeplitzFactorization.sensitivity` needs — and
``c_1 = Σθ − Σλ < 1``.

**Closed forms** (horizon n; ``g(q, N) = Σ_{m<N} q^m = expm1(N·ln q)/expm1(ln q)``, accurate to
a few ulps for every ``q ∈ (0, 1)``, however close to 1):

* squared first column norm ``1 + Σ_{i,j} ω_i ω_j g(θ_i θ_j, n − 1)``;
* the prefix sums of ``d`` are ``D_m = a + Σ_j b_j λ_j^m`` with ``b_j = −β_j/(1 − λ_j) > 0`` and
  ``a = 1/c(1) = Π(1 − θ_j)/Π(1 − λ_j) > 0``, so the largest prefix-sum variance is
  ``Σ_{m<n} D_m² = a² n + 2a Σ_j b_j g(λ_j, n) + Σ_{i,j} b_i b_j g(λ_i λ_j, n)``.

Every term is positive: nothing cancels, so the loss is exact to ~1e-14 even for ``n = 10⁷``.

**Fit.** :meth:`BLT.fit` minimises ``log(sensitivity²) + log(max error)`` — the single-
participation max-error objective of Dvijotham et al. (2024) — over the ``2k`` interlaced
values, parametrised by the positive gaps of ``s = −ln(1 − v)`` (so values within ``10⁻⁸`` of 1
are represented exactly), with BFGS and central differences evaluated as one vectorised batch.
It takes ~0.01 s of CPU for ``n ≤ 10⁷`` (section 1 of ``benchmarks/onpairmf_utility.py``) and
needs only NumPy and SciPy.

"""

from __future__ import annotations

import functools
import math
import warnings

import numpy as np
from scipy import optimize

from stream_dp.privacy.factorizations import ToeplitzFactorization, _check_horizon

__all__ = ["BLT", "DEFAULT_BUFFERS", "buffers_for_horizon"]

#: Buffers by horizon: within 1 % of the square-root factorization's loss (0.5 % in noise
#: standard deviation) up to the largest horizon of each row (measured by
#: ``tests/test_factorizations.py::test_blt_matches_sqrt_toeplitz``).
DEFAULT_BUFFERS = ((2_000, 3), (50_000, 4), (1_000_000, 5), (math.inf, 6))


def buffers_for_horizon(n: int) -> int:
    """The number of buffers :meth:`BLT.fit` uses by default for a horizon ``n``.

    Examples
    --------
    >>> buffers_for_horizon(537), buffers_for_horizon(35_169), buffers_for_horizon(10**7)
    (3, 4, 6)

    """
    n = _check_horizon(n)
    return next(k for limit, k in DEFAULT_BUFFERS if n <= limit)


def _geom(log_q: np.ndarray, count: float) -> np.ndarray:
    """``Σ_{m<count} q^m`` for ``q = exp(log_q) ∈ (0, 1)``; ``count = inf`` gives ``1/(1 − q)``."""
    if math.isinf(count):
        return -1.0 / np.expm1(log_q)
    return np.expm1(count * log_q) / np.expm1(log_q)


def _partial_fractions(poles_c: np.ndarray, zeros_c: np.ndarray) -> np.ndarray:
    """``Π_j (p_i − z_j) / Π_{j≠i} (p_i − p_j)`` from complements ``1 − p`` and ``1 − z``.

    Works on the last axis (batches allowed). Differences of values near 1 are taken between
    their complements, which are known to full relative precision.
    """
    num = np.prod(zeros_c[..., None, :] - poles_c[..., :, None], axis=-1)
    den = poles_c[..., None, :] - poles_c[..., :, None]
    k = poles_c.shape[-1]
    den = den + np.eye(k)  # the diagonal (j = i) is excluded: multiply by 1 there
    return num / np.prod(den, axis=-1)


def _loss_terms(theta_c: np.ndarray, lam_c: np.ndarray, n: float) -> tuple[np.ndarray, ...]:
    """(squared first column norm, largest prefix-sum variance) from complements; batched."""
    omega = _partial_fractions(theta_c, lam_c)
    beta = _partial_fractions(lam_c, theta_c)
    log_t = np.log1p(-theta_c)
    log_l = np.log1p(-lam_c)
    pair_t = log_t[..., :, None] + log_t[..., None, :]
    pair_l = log_l[..., :, None] + log_l[..., None, :]
    omega2 = omega[..., :, None] * omega[..., None, :]
    sens2 = 1.0 + np.sum(omega2 * _geom(pair_t, n - 1), axis=(-2, -1))
    a = np.prod(theta_c, axis=-1) / np.prod(lam_c, axis=-1)
    b = -beta / lam_c
    b2 = b[..., :, None] * b[..., None, :]
    if math.isinf(n):
        err = np.full(np.shape(a), np.inf)
    else:
        err = (
            a * a * n
            + 2.0 * a * np.sum(b * _geom(log_l, n), axis=-1)
            + np.sum(b2 * _geom(pair_l, n), axis=(-2, -1))
        )
    return sens2, err


def _complements(params: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """Interlaced ``(1 − θ, 1 − λ)`` from the log-gaps of ``s = −ln(1 − v)``; batched."""
    s = np.cumsum(np.exp(params), axis=-1)
    comp = np.exp(-s)  # 1 − v, decreasing: λ_1 < θ_1 < λ_2 < …
    return comp[..., 1::2], comp[..., 0::2]


@functools.lru_cache(maxsize=64)
def _fitted_decays(n: int, k: int) -> tuple[tuple[float, ...], tuple[float, ...]]:
    """The fitted (θ, λ) for (n, k): a pure function, so learners of one horizon share it."""
    dim = 2 * k
    step = 1e-6

    def objective(p: np.ndarray) -> tuple[float, np.ndarray]:
        # f(p) and its central-difference gradient, evaluated as one batch.
        batch = np.repeat(p[None, :], 2 * dim + 1, axis=0)
        batch[1 : dim + 1] += step * np.eye(dim)
        batch[dim + 1 :] -= step * np.eye(dim)
        theta_c, lam_c = _complements(batch)
        sens2, err = _loss_terms(theta_c, lam_c, float(n))
        f = np.log(sens2) + np.log(err)
        f = np.where(np.isfinite(f), f, 1e300)
        return float(f[0]), (f[1 : dim + 1] - f[dim + 1 :]) / (2 * step)

    # Start from s = −ln(1 − v) evenly spaced from 0.5 to ln(n): the fitted values are close
    # to that (decays 1 − v falling geometrically from ~0.6 to ~1/n).
    top = max(math.log(n), 1.0)
    s0 = np.linspace(min(0.5, top / (dim + 1)), top, dim)
    p0 = np.log(np.diff(np.concatenate([[0.0], s0])))
    with np.errstate(all="ignore"), warnings.catch_warnings():
        warnings.simplefilter("ignore", RuntimeWarning)
        # BFGS: the problem has 2k ≤ 16 unconstrained variables; SciPy's L-BFGS-B finds the
        # same minimum but spends ~3 ms per iteration in its compiled core on a busy machine.
        res = optimize.minimize(
            objective, p0, jac=True, method="BFGS", options={"maxiter": 500, "gtol": 1e-8}
        )
    theta_c, lam_c = _complements(res.x)
    return tuple((1.0 - theta_c).tolist()), tuple((1.0 - lam_c).tolist())


class BLT(ToeplitzFactorization):
    """A buffered linear Toeplitz factorization with interlaced poles θ and zeros λ.

    Parameters
    ----------
    theta
        The k decays of ``C`` (poles of ``c(x)``), in ``(0, 1)``.
    lam
        The k decays of ``C⁻¹`` (zeros of ``c(x)``), interlacing with ``theta`` from below:
        ``λ_1 < θ_1 < λ_2 < … < λ_k < θ_k``.
    horizon
        The horizon the parameters were fitted for (informational; any horizon may be used).

    Examples
    --------
    >>> blt = BLT.fit(1000)
    >>> blt.buffers
    3
    >>> from stream_dp.privacy.factorizations import SqrtToeplitz
    >>> ratio = blt.loss(1000) / SqrtToeplitz().loss(1000)
    >>> bool(0.99 < ratio < 1.01)
    True
    >>> c = blt.coefficients(5)
    >>> bool(c[0] == 1.0 and all(c[1:] > 0) and all(c[1:] < c[:-1]))
    True

    """

    name = "blt"

    def __init__(self, theta, lam, horizon: int | None = None) -> None:
        theta = np.asarray(theta, dtype=float)
        lam = np.asarray(lam, dtype=float)
        if theta.ndim != 1 or theta.shape != lam.shape or theta.size == 0:
            raise ValueError("theta and lam must be 1-D arrays of the same, non-zero length")
        order = np.argsort(theta)
        theta, lam = theta[order], np.sort(lam)
        merged = np.empty(2 * len(theta))
        merged[0::2], merged[1::2] = lam, theta
        if not (merged[0] > 0 and merged[-1] < 1 and np.all(np.diff(merged) > 0)):
            raise ValueError(
                "a BLT needs interlaced decays 0 < λ_1 < θ_1 < λ_2 < … < λ_k < θ_k < 1, "
                f"got θ = {theta.tolist()}, λ = {lam.tolist()}"
            )
        self.theta = theta
        self.lam = lam
        self.horizon = None if horizon is None else int(horizon)
        # 1 − θ and 1 − λ are exact for values >= 1/2 (Sterbenz) and accurate below.
        self._theta_c = 1.0 - theta
        self._lam_c = 1.0 - lam
        self.omega = _partial_fractions(self._theta_c, self._lam_c)
        self.beta = _partial_fractions(self._lam_c, self._theta_c)

    # -- construction -------------------------------------------------------------------------
    @classmethod
    def fit(cls, n: int, buffers: int | None = None) -> BLT:
        """The BLT with ``buffers`` buffers minimising sensitivity² × max error at horizon n.

        ``buffers`` defaults to :func:`buffers_for_horizon`. Deterministic (no random restarts):
        the result is a pure function of ``(n, buffers)``, so a checkpoint can store it or
        recompute it.
        """
        n = _check_horizon(n)
        k = buffers_for_horizon(n) if buffers is None else int(buffers)
        if not 1 <= k <= 8:
            raise ValueError(f"buffers must be between 1 and 8, got {buffers!r}")
        theta, lam = _fitted_decays(n, k)
        return cls(theta, lam, horizon=n)

    @classmethod
    def from_state_dict(cls, state: dict) -> BLT:
        if state.get("kind") != cls.name:
            raise ValueError(f"not a BLT state: {state.get('kind')!r}")
        return cls(state["theta"], state["lam"], state.get("horizon"))

    def state_dict(self) -> dict:
        return {
            "kind": self.name,
            "theta": self.theta.tolist(),
            "lam": self.lam.tolist(),
            "horizon": self.horizon,
        }

    @property
    def buffers(self) -> int:
        """k, the number of buffers of the noise recurrence."""
        return len(self.theta)

    # -- coefficients -------------------------------------------------------------------------
    def _series(self, scales: np.ndarray, decays: np.ndarray, n: int) -> np.ndarray:
        m = np.arange(n - 1, dtype=float)
        out = np.empty(n)
        out[0] = 1.0
        if n > 1:
            out[1:] = (decays[None, :] ** m[:, None]) @ scales
        return out

    def coefficients(self, n: int) -> np.ndarray:
        return self._series(self.omega, self.theta, _check_horizon(n))

    def inverse_coefficients(self, n: int) -> np.ndarray:
        return self._series(self.beta, self.lam, _check_horizon(n))

    # -- closed forms -------------------------------------------------------------------------
    def max_column_norm(self, n: int) -> float:
        sens2, _ = _loss_terms(self._theta_c, self._lam_c, float(_check_horizon(n)))
        return math.sqrt(float(sens2))

    def limit_column_norm(self) -> float:
        """``lim_{n→∞} max_j ‖C e_j‖`` (finite: every θ < 1); bounds every horizon."""
        sens2, _ = _loss_terms(self._theta_c, self._lam_c, math.inf)
        return math.sqrt(float(sens2))

    def max_error(self, n: int) -> float:
        _, err = _loss_terms(self._theta_c, self._lam_c, float(_check_horizon(n)))
        return float(err)

    def sensitivity(self, pattern, n: int | None) -> float:
        """Exact ``‖C u‖`` at the first step, in O(L² + k²) for a pattern of length L.

        Rows ``r < L`` of ``C u`` are computed directly; from row L on,
        ``(C u)_r = Σ_j γ_j θ_j^{r−L}`` with ``γ_j = ω_j Σ_s u_s θ_j^{L−1−s}``, whose squares sum
        in closed form to ``Σ_{i,j} γ_i γ_j g(θ_i θ_j, n − L)``. ``n = None`` gives the limit
        for an unbounded stream, which bounds every horizon.
        """
        u = np.asarray(pattern, dtype=float)
        if u.ndim != 1 or u.size == 0 or not np.all(np.isfinite(u)) or np.any(u < 0):
            raise ValueError("an influence pattern is a non-empty 1-D array of finite values >= 0")
        count = math.inf if n is None else float(_check_horizon(n))
        if count <= len(u):
            return super().sensitivity(u, int(count))
        L = len(u)
        c = self.coefficients(L)
        head = np.convolve(c, u)[:L]
        powers = self.theta[None, :] ** np.arange(L - 1, -1, -1, dtype=float)[:, None]
        gamma = self.omega * (u @ powers)
        log_t = np.log1p(-self._theta_c)
        tail = np.sum(np.outer(gamma, gamma) * _geom(log_t[:, None] + log_t[None, :], count - L))
        return math.sqrt(math.fsum(head * head) + float(tail)) * (1.0 + 1e-9)

    def __repr__(self) -> str:
        return (
            f"BLT(buffers={self.buffers}, horizon={self.horizon}, "
            f"theta={np.array2string(self.theta, precision=8)})"
        )
