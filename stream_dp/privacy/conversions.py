"""Conversions between zero-concentrated DP (ρ-zCDP) and approximate (ε, δ)-DP.

Three conversions are offered (docs/privacy.md, *Accounting*):

* ``"exact"`` — for a ledger of **Gaussian releases only**: ``Σρ = μ²/2`` composes exactly in
  Gaussian DP (Dong, Roth & Su 2022, Cor. 3.3) and μ-GDP *is* the (ε, δ) curve of
  :func:`stream_dp.privacy.gdp.delta_for_epsilon` (Balle & Wang 2018, Thm. 8): no conversion
  loss. Not valid for a ledger with any Laplace event (the accountant refuses them).

* ``"tight"`` (default) — Canonne, Kamath & Steinke (2020), via Rényi DP: a ρ-zCDP mechanism is
  (α, ρα)-RDP for every α > 1, and (α, τ)-RDP implies (ε, δ)-DP with
  ``ε = τ + ln(1 − 1/α) − (ln δ + ln α)/(α − 1)``. We minimise over α numerically.
* ``"paper"`` — Bun & Steinke (2016) Prop. 1.3, used by Huai et al. (2020):
  ``ε = ρ + 2√(ρ ln(1/δ))``, whose inverse is ``ρ = (√(ln(1/δ) + ε) − √(ln(1/δ)))²``.

The tight conversion is always at most the paper's, and at least the exact (ε, δ) curve of a
single Gaussian mechanism with the same ρ, which is the best any conversion can do and what
``"exact"`` reports.

"""

from __future__ import annotations

import functools
import math
from collections.abc import Sequence
from typing import Literal

import numpy as np
from scipy import optimize, special

from stream_dp import _jit
from stream_dp.privacy.gdp import epsilon_for_delta, epsilons_for_delta, rho_budget

__all__ = [
    "Conversion",
    "CONVERSIONS",
    "ZCDP_CONVERSIONS",
    "epsilon_from_rho",
    "epsilons_from_rhos",
    "rho_from_epsilon",
    "gaussian_delta_exact",
    "gaussian_epsilon_exact",
]

Conversion = Literal["exact", "tight", "paper"]

CONVERSIONS = ("exact", "tight", "paper")
#: The conversions that hold for any zCDP ledger (Laplace events included).
ZCDP_CONVERSIONS = ("tight", "paper")


def _check(delta: float, conversion: str) -> None:
    if conversion not in CONVERSIONS:
        raise ValueError(f"conversion must be one of {CONVERSIONS}, got {conversion!r}")
    if not 0.0 < delta < 1.0:
        raise ValueError(f"delta must be in (0, 1), got {delta!r}")


def epsilon_from_rho(rho: float, delta: float, conversion: Conversion = "tight") -> float:
    """The ε of the (ε, δ)-DP guarantee implied by ρ-zCDP.

    Parameters
    ----------
    rho
        zCDP parameter, ``ρ ≥ 0``.
    delta
        Target δ in (0, 1).
    conversion
        ``"tight"`` (CKS 2020, default), ``"paper"`` (``ρ + 2√(ρ ln 1/δ)``) or ``"exact"``
        (the GDP curve at ``μ = √(2ρ)``; Gaussian ledgers only, rounded up).

    Examples
    --------
    >>> round(epsilon_from_rho(1 / 32, 1e-3), 6)
    0.688002
    >>> round(epsilon_from_rho(1 / 32, 1e-3, "paper"), 6)
    0.960481
    >>> round(epsilon_from_rho(1 / 32, 1e-3, "exact"), 6)
    0.592007

    """
    _check(delta, conversion)
    if not rho >= 0.0 or math.isinf(rho):
        if math.isinf(rho):
            return math.inf
        raise ValueError(f"rho must be >= 0, got {rho!r}")
    if rho == 0.0:
        return 0.0
    if conversion == "exact":
        return epsilon_for_delta(math.sqrt(2.0 * rho), delta)
    log_delta = math.log(delta)
    if conversion == "paper":
        return rho + 2.0 * math.sqrt(rho * -log_delta)
    return _tight_epsilon_now()(rho, log_delta)


def epsilons_from_rhos(
    rhos: Sequence[float], delta: float, conversion: Conversion = "tight"
) -> list[float]:
    """:func:`epsilon_from_rho` of each ρ, equal to it element for element; the exact
    conversion in one compiled call (``stream_dp.privacy.gdp.epsilons_for_delta``).

    Examples
    --------
    >>> eps = epsilons_from_rhos([0.0, 1 / 32], 1e-3, "exact")
    >>> eps == [0.0, epsilon_from_rho(1 / 32, 1e-3, "exact")]
    True

    """
    _check(delta, conversion)
    if conversion == "exact" and all(r >= 0.0 for r in rhos):
        mus = np.sqrt(2.0 * np.asarray(rhos, dtype=np.float64))  # IEEE sqrt, as math.sqrt
        return epsilons_for_delta(mus, delta).tolist()
    return [epsilon_from_rho(r, delta, conversion) for r in rhos]


def _tight_epsilon(rho: float, log_delta: float) -> float:
    # f(a) = ρa + ln(1 − 1/a) − (ln δ + ln a)/(a − 1) has f'(a) = ρ + ln(δa)/(a − 1)², so its
    # minimiser is the unique root of g(a) = ρ(a − 1)² + ln(δa), which is increasing on a > 1
    # (g' = 2ρ(a − 1) + 1/a > 0) with g(1) = ln δ < 0 and g(1 + √(ln(1/δ)/ρ)) = ln a > 0.
    # Safeguarded Newton: ~30 iterations, ~6 µs in Python and ~0.6 µs compiled, once per
    # release. Only IEEE arithmetic, sqrt and libm's log and log1p, so compiled and Python give
    # the same bits: (a − 1)² is a product, not ``** 2``, because CPython's ``**`` calls libm's
    # pow, which numba replaces by the product (they differ in the last bit now and then).
    lo, hi = 1.0, 1.0 + math.sqrt(-log_delta / rho)
    a = min(hi, 1.0 + math.sqrt(max(-log_delta, 1e-300) / rho) * 0.9)
    for _ in range(200):
        d = a - 1.0
        g = rho * (d * d) + log_delta + math.log(a)
        if g > 0:
            hi = a
        else:
            lo = a
        step = g / (2.0 * rho * d + 1.0 / a)
        nxt = a - step
        if not lo < nxt < hi:
            nxt = 0.5 * (lo + hi)
        if abs(nxt - a) <= 1e-15 * a or hi - lo <= 1e-15 * hi:
            a = nxt
            break
        a = nxt
    eps = rho * a + math.log1p(-1.0 / a) - (log_delta + math.log(a)) / (a - 1.0)
    return max(0.0, eps)


#: (ρ, ln δ) pairs the compiled conversion must reproduce bit for bit before it is used.
_PROBE = tuple(
    (rho, math.log(delta))
    for delta in (1e-12, 1e-6, 1e-3, 0.5)
    for rho in (1e-12, 3.3e-9, 1.7e-6, 1e-5, 2.2e-4, 1 / 32, 0.7, 13.0, 1e3)
)
_COMPILED: list = []


def _tight_epsilon_now():
    """:func:`_tight_epsilon`, compiled while the learners' kernels are (``stream_dp._jit``)
    and the compiled code reproduces the Python one on :data:`_PROBE`."""
    if not _jit.numba_active():
        return _tight_epsilon
    if not _COMPILED:
        fn = None
        try:
            fn = _jit.njit(_tight_epsilon)
            if any(fn(r, ld) != _tight_epsilon(r, ld) for r, ld in _PROBE):
                fn = None
        except Exception:  # pragma: no cover - a numba that cannot compile it
            fn = None
        _COMPILED.append(fn or _tight_epsilon)
    return _COMPILED[0]


@functools.lru_cache(maxsize=256)  # a pure function, ~1 ms of root finding, asked per learner
def rho_from_epsilon(epsilon: float, delta: float, conversion: Conversion = "tight") -> float:
    """The largest ρ whose ρ-zCDP guarantee implies (ε, δ)-DP.

    The tight conversion is inverted numerically (``epsilon_from_rho`` is increasing in ρ); the
    result is then nudged down so that ``epsilon_from_rho(result) <= epsilon`` always holds —
    a budget must never be rounded up.

    Examples
    --------
    >>> rho = rho_from_epsilon(1.0, 1e-5)
    >>> epsilon_from_rho(rho, 1e-5) <= 1.0
    True
    >>> round(rho_from_epsilon(1.0, 1e-5, "paper"), 6)
    0.02082
    >>> round(rho_from_epsilon(1.0, 1e-5, "exact"), 6)  # μ²/2 of the GDP curve
    0.035926

    """
    _check(delta, conversion)
    if not epsilon > 0.0 or math.isinf(epsilon):
        raise ValueError(f"epsilon must be a positive finite number, got {epsilon!r}")
    if conversion == "exact":
        return rho_budget(float(epsilon), float(delta))
    ln_inv_delta = -math.log(delta)
    if conversion == "paper":
        # ε²/(√(L+ε) + √L)² equals (√(L+ε) − √L)² without its cancellation; either way the last
        # ulp can round up, so the result is nudged down like the tight one below.
        rho = (epsilon / (math.sqrt(ln_inv_delta + epsilon) + math.sqrt(ln_inv_delta))) ** 2
        return _nudge_down(rho, epsilon, delta, "paper")
    # The paper's ρ is a lower bound for the tight one (tight ε ≤ paper ε), so it brackets below.
    lo = (math.sqrt(ln_inv_delta + epsilon) - math.sqrt(ln_inv_delta)) ** 2
    hi = max(2.0 * lo, epsilon)
    while epsilon_from_rho(hi, delta) < epsilon:
        hi *= 2.0
    rho = optimize.brentq(
        lambda r: epsilon_from_rho(r, delta) - epsilon, lo, hi, xtol=1e-15, rtol=1e-13
    )
    return _nudge_down(float(rho), epsilon, delta, "tight")


def _nudge_down(rho: float, epsilon: float, delta: float, conversion: Conversion) -> float:
    """Lower ρ until ``epsilon_from_rho(ρ) <= ε`` holds in floating point (never round up)."""
    while epsilon_from_rho(rho, delta, conversion) > epsilon:
        rho = math.nextafter(rho, 0.0) * (1.0 - 1e-12)
    return rho


def _norm_cdf(x: float) -> float:
    return 0.5 * special.erfc(-x / math.sqrt(2.0))


def gaussian_delta_exact(rho: float, epsilon: float) -> float:
    """Exact δ(ε) of one Gaussian mechanism with ``Δ²/(2σ²) = ρ`` (Balle & Wang 2018, Thm. 8).

    With ``μ = Δ/σ = √(2ρ)``: ``δ = Φ(μ/2 − ε/μ) − e^ε Φ(−μ/2 − ε/μ)``.
    """
    if rho <= 0.0:
        return 0.0
    mu = math.sqrt(2.0 * rho)
    return _norm_cdf(mu / 2.0 - epsilon / mu) - math.exp(epsilon) * _norm_cdf(
        -mu / 2.0 - epsilon / mu
    )


def gaussian_epsilon_exact(rho: float, delta: float) -> float:
    """Smallest ε for which one Gaussian mechanism with parameter ρ is (ε, δ)-DP.

    This is the best any zCDP → (ε, δ) conversion can achieve (a lower bound for both of ours).
    """
    if rho <= 0.0 or gaussian_delta_exact(rho, 0.0) <= delta:
        return 0.0
    hi = 1.0
    while gaussian_delta_exact(rho, hi) > delta:
        hi *= 2.0
    return float(
        optimize.brentq(lambda e: gaussian_delta_exact(rho, e) - delta, 0.0, hi, xtol=1e-14)
    )
