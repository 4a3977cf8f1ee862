"""Gaussian differential privacy: exact (ε, δ) accounting for ledgers of Gaussian releases.

A Gaussian mechanism with ℓ2 sensitivity Δ and noise σ per coordinate is ``μ``-GDP with
``μ = Δ/σ``: distinguishing neighbours is exactly as hard as telling ``N(0, 1)`` from
``N(μ, 1)`` (Dong, Roth & Su, "Gaussian Differential Privacy", JRSS-B 2022, Thm. 2.7). Gaussian
mechanisms — adaptively chosen ones included — compose *exactly* in GDP: ``k`` of them are
``√(μ₁² + … + μ_k²)``-GDP (same paper, Cor. 3.3). And ``μ``-GDP is equivalent to the whole curve
of (ε, δ(ε))-DP guarantees

    ``δ(ε) = Φ(−ε/μ + μ/2) − e^ε·Φ(−ε/μ − μ/2)``     (Dong et al. Cor. 2.13; Balle & Wang,
                                                        ICML 2018, Thm. 8)

so a ledger holding only Gaussian events has an exact (ε, δ) curve, with no conversion loss.
The zCDP route the ledgers take today (``ρ = Σ Δ²/(2σ²)``, then Canonne–Kamath–Steinke) is an
upper bound on that curve: at ``ρ`` = the tight budget of (ε = 1, δ = 1e-5), the exact ε is
0.915, 8.5 % less (``docs/privacy.md``, *Accounting*). Note ``μ² = 2ρ``: the two compositions
agree, only the conversion to (ε, δ) differs.

This module is the arithmetic and an accountant in dp_accounting's shape
(``supports / compose(event, count) / get_epsilon / get_delta``). Every function that turns a
guarantee into a noise scale or back rounds in the safe direction: ε up, μ and ρ down, σ up —
each checked in floating point against :func:`delta_for_epsilon`, never against the root finder's
tolerance. :func:`delta_for_epsilon` is evaluated with ``erfcx`` so that neither ``e^ε`` nor the
two Φ terms overflow, underflow or cancel catastrophically: its relative error stays below 1e-11
for δ down to 1e-300 (``tests/test_gdp.py`` checks it against 50-digit arithmetic).

A ledger with any non-Gaussian event (Laplace, or an (ε, δ) event) is not μ-GDP for any finite
μ in general; :class:`GaussianDPAccountant` refuses such events and the caller keeps the zCDP
route for them.

"""

from __future__ import annotations

import math
from typing import Any

import numpy as np
from scipy import optimize, special

from stream_dp import _jit
from stream_dp._jit import jitable
from stream_dp.privacy.events import GaussianEvent, NeighbouringRelation
from stream_dp.privacy.exact_sum import grow

__all__ = [
    "GaussianDPAccountant",
    "delta_for_epsilon",
    "epsilon_for_delta",
    "epsilons_for_delta",
    "gaussian_mu",
    "log_delta_for_epsilon",
    "mu_for_epsilon",
    "rho_budget",
    "sigma_for_epsilon",
]

_SQRT2 = math.sqrt(2.0)
_SQRT_PI = math.sqrt(math.pi)
#: Veltkamp's splitter for float64 (2**27 + 1): ``x = xh + xl`` with ``xh·xh`` exact.
_SPLIT = 134217729.0
#: Where :func:`_erfcx` turns to its asymptotic series (``erfc`` underflows past ~26.5).
_ASYMPTOTIC_FROM = 26.0


def gaussian_mu(sensitivity: float, sigma: float) -> float:
    """``μ = Δ/σ``: the GDP parameter of one Gaussian release.

    Examples
    --------
    >>> gaussian_mu(2.0, 4.0)
    0.5

    """
    if not (sensitivity >= 0 and math.isfinite(sensitivity)):
        raise ValueError(f"sensitivity must be finite and >= 0, got {sensitivity!r}")
    if not sigma > 0:
        raise ValueError(f"sigma must be > 0, got {sigma!r}")
    return sensitivity / sigma


def _check_mu(mu: float) -> None:
    if not mu >= 0:  # NaN fails too
        raise ValueError(f"mu must be >= 0, got {mu!r}")


def log_delta_for_epsilon(mu: float, epsilon: float) -> float:
    """``ln δ(ε)`` of a μ-GDP mechanism (``−inf`` when δ = 0).

    With ``a = −ε/μ + μ/2`` and ``b = −ε/μ − μ/2`` (so ``b < 0`` and ``b² = a² + 2ε``),
    ``e^ε Φ(b) = ½·erfcx(−b/√2)·e^{−a²/2}`` exactly; hence, for ``a ≤ 0``,
    ``δ = ½·e^{−a²/2}·(erfcx(−a/√2) − erfcx(−b/√2))`` — no ``e^ε``, no underflowing Φ — and for
    ``a > 0`` (then ``Φ(a) ≥ ½``) ``δ = Φ(a) − ½·erfcx(−b/√2)·e^{−a²/2}``.

    Examples
    --------
    >>> round(math.exp(log_delta_for_epsilon(1.0, 1.0)), 6)
    0.126937

    """
    _check_mu(mu)
    if not epsilon >= 0:
        raise ValueError(f"epsilon must be >= 0, got {epsilon!r}")
    if mu == 0.0 or math.isinf(epsilon):
        return -math.inf
    if math.isinf(mu):
        return 0.0
    return _log_delta_and_slope(mu, epsilon)[0]


def delta_for_epsilon(mu: float, epsilon: float) -> float:
    """``δ(ε) = Φ(−ε/μ + μ/2) − e^ε Φ(−ε/μ − μ/2)``: the exact δ of μ-GDP at ε.

    Dong, Roth & Su (2022), Cor. 2.13; Balle & Wang (ICML 2018), Thm. 8 with ``μ = Δ/σ``.

    Examples
    --------
    >>> round(delta_for_epsilon(1.0, 0.0), 6)  # ε = 0: the total variation 2Φ(μ/2) − 1
    0.382925
    >>> delta_for_epsilon(0.0, 1.0)
    0.0

    """
    return math.exp(log_delta_for_epsilon(mu, epsilon))


@jitable
def _erfcx(x):
    """``erfcx(x) = e^{x²}·erfc(x)`` for ``x ≥ 0``, to a few units in the last place.

    Below :data:`_ASYMPTOTIC_FROM`, ``erfc(x)·e^{x²}`` with ``x²`` split exactly into
    ``hi + lo`` (Veltkamp and Dekker's product), so that ``e^{x²}`` is not off by the ``x²·u``
    that rounding ``x²`` would cost; above it, where ``erfc`` underflows, the asymptotic series
    ``(1/(x√π))·Σ (−1)^k (2k−1)!!/(2x²)^k`` (Abramowitz & Stegun 7.1.23), whose terms fall by a
    factor ``(2k−1)/(2x²) < 1/1300`` there. ``tests/test_gdp.py`` holds it to SciPy's ``erfcx`` and
    to 40-digit arithmetic. Written here, not called from SciPy, so that the curve below compiles
    and caches with numba.
    """
    if x < _ASYMPTOTIC_FROM:
        hi = x * x
        c = _SPLIT * x
        xh = c - (c - x)
        xl = x - xh
        lo = ((xh * xh - hi) + 2.0 * xh * xl) + xl * xl
        return math.erfc(x) * math.exp(hi) * (1.0 + lo)
    inv = 0.5 / (x * x)
    term = 1.0
    total = 1.0
    k = 1.0
    while abs(term) > 1e-17 * total:
        term *= -(2.0 * k - 1.0) * inv
        total += term
        k += 1.0
    return total / (x * _SQRT_PI)


@jitable
def _curve(mu, epsilon):
    """``ln δ(ε)`` as :func:`log_delta_for_epsilon` derives it, and its derivative in ε, from the
    same two ``erfcx`` values (``0 < μ < ∞``, ``0 ≤ ε < ∞``).

    ``δ'(ε) = −e^ε Φ(b)`` (differentiate the curve: the two Gaussian densities cancel), which is
    ``−½·erfcx(−b/√2)·e^{−a²/2}``, a term of δ itself. ``Φ(a) = ½·erfc(−a/√2)``.
    """
    a = mu / 2.0 - epsilon / mu
    b = -mu / 2.0 - epsilon / mu
    tail = _erfcx(-b / _SQRT2)  # in (0, 1]: −b > 0
    if a <= 0.0:
        diff = _erfcx(-a / _SQRT2) - tail
        if diff <= 0.0:  # the curve below the smallest positive double
            return -math.inf, -math.inf
        return -0.5 * a * a + math.log(0.5 * diff), -tail / diff
    part = 0.5 * tail * math.exp(-0.5 * a * a)
    d = 0.5 * math.erfc(-a / _SQRT2) - part
    if d <= 0.0:
        return -math.inf, -math.inf
    return math.log(d), -part / d


@jitable
def _epsilon_root(mu, delta, z):
    """:func:`epsilon_for_delta` for a finite ``μ > 0`` and ``δ`` in (0, 1), with
    ``z = Φ⁻¹(δ)`` (its start): Newton's method on ``ln δ(ε)`` in a bracket, then rounded up."""
    # δ(0) = erf(μ/(2√2)); far above δ the exact test below cannot hold, and is skipped.
    if not math.erf(mu / (2.0 * _SQRT2)) > 2.0 * delta:
        if math.exp(_curve(mu, 0.0)[0]) <= delta:
            return 0.0
    log_target = math.log(delta)
    lo = 0.0  # ln δ(lo) > ln δ: the curve is above the target there
    hi = math.inf  # until a point below the target is seen
    eps = max(1e-300, 0.5 * mu * mu - mu * z)
    for _ in range(2200):
        value, slope = _curve(mu, eps)
        g = value - log_target
        if g > 0.0:
            lo = eps
            if math.isinf(hi):  # a guard: the start is above the root, in exact arithmetic
                eps *= 2.0
                continue
        else:
            hi = eps
        if g == 0.0:
            break
        nxt = eps - g / slope if slope < 0.0 and math.isfinite(g) else 0.5 * (lo + hi)
        if abs(nxt - eps) <= 1e-15 * eps:  # converged (a step that small stays in the bracket)
            eps = nxt
            break
        if not lo < nxt < hi:
            nxt = 0.5 * (lo + hi)
        if hi - lo <= 1e-15 * hi:
            eps = nxt
            break
        eps = nxt
    while math.exp(_curve(mu, eps)[0]) > delta:
        eps = np.nextafter(eps, math.inf) * (1.0 + 1e-15)
    return float(eps)


def _epsilon_roots(mus, delta, z, out):
    """:func:`_epsilon_root` of each μ in ``mus`` into ``out``."""
    for i in range(mus.size):
        out[i] = _epsilon_root(mus[i], delta, z)


#: (μ, δ) pairs on which the compiled search must reproduce the Python one bit for bit before
#: it is used: the small and large μ, the δ(0) ≤ δ case, both branches of the curve.
_PROBE = tuple(
    (mu, delta)
    for delta in (1e-30, 1e-10, 1e-5, 1e-3, 0.4)
    for mu in (1e-9, 1e-4, 0.01, 0.2472, 1.0, 3.7, 40.0, 1e3)
)
_COMPILED: list = []


def _search():
    """``(curve, root, roots)``: :func:`_curve`, :func:`_epsilon_root` and
    :func:`_epsilon_roots`, compiled while the learners' kernels are (``stream_dp._jit``) and the
    compiled code reproduces the Python one on :data:`_PROBE` — so that the reported ε does not
    depend on whether numba runs (a release replayed after a restart publishes the same ε)."""
    if not _jit.numba_active():
        return _curve, _epsilon_root, _epsilon_roots
    if not _COMPILED:
        found = (_curve, _epsilon_root, _epsilon_roots)
        try:
            compiled = tuple(_jit.njit(fn) for fn in found)
            curve, root, roots = compiled
            mus = np.array([mu for mu, _ in _PROBE])
            for delta in sorted({d for _, d in _PROBE}):
                z = _ndtri(delta)
                out = np.zeros(mus.size)
                roots(mus, delta, z, out)
                for mu, got in zip(mus.tolist(), out.tolist(), strict=True):
                    want = _epsilon_root(mu, delta, z)
                    if got != want or root(mu, delta, z) != want:
                        raise ArithmeticError
                    if curve(mu, want) != _curve(mu, want):
                        raise ArithmeticError
            found = compiled
        except Exception:  # noqa: BLE001 - a numba that cannot compile it, or other bits
            pass
        _COMPILED.append(found)
    return _COMPILED[0]


def _log_delta_and_slope(mu: float, epsilon: float) -> tuple[float, float]:
    """``ln δ(ε)`` and its derivative in ε (:func:`_curve`)."""
    value, slope = _search()[0](mu, epsilon)
    return float(value), float(slope)


def epsilon_for_delta(mu: float, delta: float) -> float:
    """The smallest ε with ``δ(ε) ≤ δ`` for μ-GDP: the exact ε of the whole ledger.

    Found on ``ln δ(ε)`` (decreasing in ε) and then rounded **up** until
    ``delta_for_epsilon(μ, ε) ≤ δ`` holds in floating point, so the reported ε is never below
    the curve. The root is found by Newton's method on ``ln δ(ε)``, kept inside a bracket that
    every step narrows (bisection when a step leaves it): the engine converts its ledger at
    every release, and this takes ~5 evaluations of the curve where Brent's method took ~25.
    The start, ``μ²/2 + μ·z`` with ``Φ(−z) = δ``, solves ``Φ(a) = δ`` and is above the root
    since ``δ(ε) < Φ(a)``; it depends on (μ, δ) only, so the result does too. The search runs
    compiled when the learners do, ~1 µs (:func:`epsilons_for_delta` runs it for many μ at once).

    Examples
    --------
    >>> eps = epsilon_for_delta(0.5, 1e-5)
    >>> round(eps, 4), delta_for_epsilon(0.5, eps) <= 1e-5
    (1.9931, True)
    >>> epsilon_for_delta(0.0, 1e-5)
    0.0

    """
    _check_mu(mu)
    if not 0.0 < delta < 1.0:
        raise ValueError(f"delta must be in (0, 1), got {delta!r}")
    if math.isinf(mu):
        return math.inf
    if mu == 0.0:
        return 0.0
    return float(_search()[1](float(mu), float(delta), _ndtri(delta)))


def epsilons_for_delta(mus: np.ndarray, delta: float) -> np.ndarray:
    """:func:`epsilon_for_delta` of each μ in ``mus`` (one compiled call; equal, element for
    element, to the one-at-a-time result: it runs the same code).

    Examples
    --------
    >>> eps = epsilons_for_delta(np.array([0.0, 0.5, 1.0]), 1e-5)
    >>> eps.round(4).tolist(), eps.tolist()[1] == epsilon_for_delta(0.5, 1e-5)
    ([0.0, 1.9931, 4.3772], True)

    """
    mus = np.ascontiguousarray(mus, dtype=np.float64)
    if mus.size and not (mus >= 0).all():  # NaN fails too
        _check_mu(float(mus[~(mus >= 0)][0]))
    if not 0.0 < delta < 1.0:
        raise ValueError(f"delta must be in (0, 1), got {delta!r}")
    out = np.zeros(mus.shape)
    out[np.isinf(mus)] = math.inf
    inner = np.isfinite(mus) & (mus > 0)  # μ = 0: ε = 0, as out holds
    if inner.any():
        found = np.zeros(int(inner.sum()))
        _search()[2](mus[inner], float(delta), _ndtri(delta), found)
        out[inner] = found
    return out


def _ndtri(delta: float) -> float:
    return float(special.ndtri(delta))


def mu_for_epsilon(epsilon: float, delta: float) -> float:
    """The largest μ for which μ-GDP is (ε, δ)-DP — the budget of a Gaussian ledger.

    ``δ(ε)`` increases with μ; the root is rounded **down** until
    ``delta_for_epsilon(μ, ε) ≤ δ`` and ``epsilon_for_delta(μ, δ) ≤ ε`` hold in floating point
    (a ledger that spends the whole budget never reports more than its ε).

    Examples
    --------
    >>> mu = mu_for_epsilon(1.0, 1e-5)
    >>> round(mu, 5), delta_for_epsilon(mu, 1.0) <= 1e-5
    (0.26805, True)

    """
    if not (epsilon > 0 and math.isfinite(epsilon)):
        raise ValueError(f"epsilon must be a positive finite number, got {epsilon!r}")
    if not 0.0 < delta < 1.0:
        raise ValueError(f"delta must be in (0, 1), got {delta!r}")
    log_target = math.log(delta)
    lo, hi = 0.0, 1.0
    while log_delta_for_epsilon(hi, epsilon) <= log_target:
        lo, hi = hi, hi * 2.0
    mu = float(
        optimize.brentq(
            lambda m: log_delta_for_epsilon(m, epsilon) - log_target,
            max(lo, 1e-300),
            hi,
            xtol=1e-300,
            rtol=1e-15,
        )
    )
    # Rounded down until the curve holds at ε and the ε reported back is not above the target.
    while delta_for_epsilon(mu, epsilon) > delta or epsilon_for_delta(mu, delta) > epsilon:
        mu = math.nextafter(mu, 0.0) * (1.0 - 1e-15)
    return mu


def sigma_for_epsilon(sensitivity: float, epsilon: float, delta: float) -> float:
    """The smallest σ for which a Gaussian release of sensitivity Δ is (ε, δ)-DP: ``Δ/μ``.

    The analytic Gaussian mechanism (Balle & Wang 2018, Thm. 8), rounded **up** until
    ``Δ/σ`` satisfies the curve in floating point. For a ledger of many releases calibrate
    their μ's so that ``√Σμ² ≤ mu_for_epsilon(ε, δ)`` instead.

    Examples
    --------
    >>> s = sigma_for_epsilon(1.0, 1.0, 1e-5)
    >>> round(s, 4), delta_for_epsilon(1.0 / s, 1.0) <= 1e-5
    (3.7306, True)

    """
    if not (sensitivity >= 0 and math.isfinite(sensitivity)):
        raise ValueError(f"sensitivity must be finite and >= 0, got {sensitivity!r}")
    if sensitivity == 0:
        return 0.0
    mu = mu_for_epsilon(epsilon, delta)
    sigma = sensitivity / mu
    while delta_for_epsilon(sensitivity / sigma, epsilon) > delta:
        sigma = math.nextafter(sigma, math.inf) * (1.0 + 1e-15)
    return sigma


def rho_budget(epsilon: float, delta: float) -> float:
    """The ρ limit of a ledger of Gaussian events accounted exactly: ``μ²/2``, rounded down.

    Gaussian events compose in ρ exactly as in GDP (``μ² = 2Σρ``), so a budget kept in ρ with
    this limit — the ledgers' and schedules' currency today — spends exactly the (ε, δ)
    guarantee of the GDP curve. Rounded down until the μ it implies meets the curve in floating
    point.

    Examples
    --------
    >>> rho = rho_budget(1.0, 1e-5)
    >>> round(rho, 5), delta_for_epsilon(math.sqrt(2 * rho), 1.0) <= 1e-5
    (0.03593, True)

    """
    mu = mu_for_epsilon(epsilon, delta)
    rho = 0.5 * mu * mu
    while (
        delta_for_epsilon(math.sqrt(2.0 * rho), epsilon) > delta
        or epsilon_for_delta(math.sqrt(2.0 * rho), delta) > epsilon
    ):
        rho = math.nextafter(rho, 0.0) * (1.0 - 1e-15)
    return rho


class GaussianDPAccountant:
    """Composes Gaussian releases exactly in μ-GDP; reports the exact (ε, δ) curve.

    The interface of dp_accounting's accountants: :meth:`supports`, :meth:`compose` (with a
    ``count`` for a release repeated with the same parameters), :meth:`get_epsilon`,
    :meth:`get_delta`. Only :class:`~stream_dp.privacy.events.GaussianEvent` is supported; a
    ledger with any other event keeps the zCDP route. Composition is ``μ² = Σ count·(Δ/σ)²``,
    summed exactly (``math.fsum`` over Shewchuk partials, as the zCDP ledger sums ρ).

    Parameters
    ----------
    neighbouring_relation
        The relation the events' sensitivities are computed for (the project's: replace-one).

    Examples
    --------
    >>> acc = GaussianDPAccountant()
    >>> _ = acc.compose(GaussianEvent(step=1, sensitivity=13.68, sigma=55.35))
    >>> round(acc.mu, 4), round(acc.get_epsilon(1e-5), 3)
    (0.2472, 0.915)

    """

    def __init__(
        self, neighbouring_relation: NeighbouringRelation = NeighbouringRelation.REPLACE_ONE
    ) -> None:
        self.neighbouring_relation = neighbouring_relation
        self._partials: list[float] = []

    def supports(self, event: Any) -> bool:
        """Whether ``event`` is a Gaussian release (the only kind μ-GDP composes exactly)."""
        return isinstance(event, GaussianEvent)

    def compose(self, event: Any, count: int = 1) -> GaussianDPAccountant:
        """Compose ``count`` releases with ``event``'s parameters; returns ``self``."""
        if not self.supports(event):
            raise TypeError(f"GaussianDPAccountant composes Gaussian releases only, not {event!r}")
        if isinstance(count, bool) or not isinstance(count, int) or count < 0:
            raise ValueError(f"count must be an int >= 0, got {count!r}")
        mu = gaussian_mu(event.sensitivity, event.sigma)
        grow(self._partials, count * mu * mu)  # exact running sum, as the ledgers
        return self

    @property
    def mu_squared(self) -> float:
        """``Σμ²`` over everything composed (correctly rounded)."""
        return math.fsum(self._partials)

    @property
    def mu(self) -> float:
        """The GDP parameter of everything composed: ``√Σμ²``."""
        return math.sqrt(self.mu_squared)

    def get_epsilon(self, target_delta: float) -> float:
        """The exact ε at ``target_delta`` (rounded up)."""
        return epsilon_for_delta(self.mu, target_delta)

    def get_delta(self, target_epsilon: float) -> float:
        """The exact δ at ``target_epsilon``."""
        return delta_for_epsilon(self.mu, target_epsilon)

    def __repr__(self) -> str:
        return f"GaussianDPAccountant(μ={self.mu:.6g})"
