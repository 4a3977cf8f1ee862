"""The generic noise mechanisms: σ of a Gaussian and b of a Laplace from a sensitivity.

Gaussian for ρ-zCDP, Gaussian for (ε, δ)-DP (the classic calibration, the exact one, and the
classic raised to the exact where it falls short), Laplace for ε-DP (from an ℓ1 or an ℓ2
sensitivity). Each algorithm derives its own sensitivity next to its code, citing its paper
(e.g. :mod:`stream_dp.offline.xue`), and calibrates its noise here.
"""

from __future__ import annotations

import math

import numpy as np

from stream_dp._jit import jitable
from stream_dp.privacy.events import gaussian_rho

__all__ = [
    "ZERO_SENSITIVITY_SIGMA",
    "release_sigma",
    "gaussian_sigma_analytic",
    "gaussian_sigma_approx_dp",
    "gaussian_sigma_classic_safe",
    "gaussian_sigma_zcdp",
    "laplace_scale",
    "laplace_scale_from_l2",
]


def gaussian_sigma_zcdp(sensitivity: float, rho: float) -> float:
    """σ such that the Gaussian mechanism with ℓ2 sensitivity Δ is ρ-zCDP: ``σ = Δ/√(2ρ)``.

    Examples
    --------
    >>> gaussian_sigma_zcdp(1.0, 0.5)
    1.0

    """
    if not rho > 0:
        raise ValueError(f"rho must be > 0, got {rho!r}")
    if not sensitivity >= 0:
        raise ValueError(f"sensitivity must be >= 0, got {sensitivity!r}")
    return _zcdp_sigma(sensitivity, rho)


@jitable
def _zcdp_sigma(sensitivity, rho):
    return sensitivity / math.sqrt(2.0 * rho)


#: σ of a release whose sensitivity is 0: it carries no information about the data, and a
#: Gaussian event needs σ > 0.
ZERO_SENSITIVITY_SIGMA = 1e-300


@jitable
def release_sigma(sensitivity, rho):
    """σ of a Gaussian release of sensitivity Δ ≥ 0 at a ρ > 0 share of the budget.

    :func:`gaussian_sigma_zcdp` for Δ > 0, :data:`ZERO_SENSITIVITY_SIGMA` for Δ = 0. Called by
    the online learners' reference step and, compiled, by their fast path (one rule for both).

    Examples
    --------
    >>> release_sigma(2.0, 2.0), release_sigma(0.0, 1.0)
    (1.0, 1e-300)

    """
    if sensitivity > 0:
        return _zcdp_sigma(sensitivity, rho)
    return ZERO_SENSITIVITY_SIGMA


def gaussian_sigma_approx_dp(sensitivity: float, epsilon: float, delta: float) -> float:
    """Classic (ε, δ) Gaussian calibration (Dwork & Roth Thm. A.1): ``σ = Δ√(2 ln(1.25/δ))/ε``.

    Valid for ε < 1; the papers use it beyond that, which we reproduce but report honestly.

    Examples
    --------
    >>> round(gaussian_sigma_approx_dp(1.0, 1.0, 1e-5), 4)
    4.8448

    """
    if not (epsilon > 0 and 0 < delta < 1):
        raise ValueError(f"need epsilon > 0 and delta in (0, 1), got {epsilon!r}, {delta!r}")
    return sensitivity * math.sqrt(2.0 * math.log(1.25 / delta)) / epsilon


def laplace_scale(l1_sensitivity: float, epsilon: float) -> float:
    """Laplace scale ``b = Δ₁/ε`` for pure ε-DP.

    Examples
    --------
    >>> laplace_scale(2.0, 0.5)
    4.0

    """
    if not epsilon > 0:
        raise ValueError(f"epsilon must be > 0, got {epsilon!r}")
    return l1_sensitivity / epsilon


# --------------------------------------------------------------------------------------------
# Rigorous forms of the classic calibrations the papers use
# --------------------------------------------------------------------------------------------


def gaussian_sigma_analytic(sensitivity: float, epsilon: float, delta: float) -> float:
    """The smallest σ for which the Gaussian mechanism is (ε, δ)-DP (Balle & Wang 2018, Thm. 8).

    Found by bisection on the exact privacy profile
    ``δ(ε) = Φ(μ/2 − ε/μ) − e^ε Φ(−μ/2 − ε/μ)`` with ``μ = Δ/σ``; the result is rounded up.

    Examples
    --------
    >>> s = gaussian_sigma_analytic(1.0, 1.0, 1e-5)
    >>> 3.7 < s < gaussian_sigma_approx_dp(1.0, 1.0, 1e-5)
    True

    """
    from stream_dp.privacy.conversions import gaussian_delta_exact

    if not (epsilon > 0 and 0 < delta < 1):
        raise ValueError(f"need epsilon > 0 and delta in (0, 1), got {epsilon!r}, {delta!r}")
    if sensitivity == 0:
        return 0.0

    def ok(sigma: float) -> bool:
        return gaussian_delta_exact(gaussian_rho(sensitivity, sigma), epsilon) <= delta

    lo, hi = sensitivity * 1e-3, sensitivity
    while not ok(hi):
        hi *= 2.0
    while ok(lo):
        lo /= 2.0
    for _ in range(200):
        mid = 0.5 * (lo + hi)
        if ok(mid):
            hi = mid
        else:
            lo = mid
        if hi - lo <= 1e-12 * hi:
            break
    return hi


def gaussian_sigma_classic_safe(sensitivity: float, epsilon: float, delta: float) -> float:
    """The papers' classic σ = Δ√(2 ln(1.25/δ))/ε, raised if it is not (ε, δ)-DP.

    The classic calibration (Dwork & Roth Thm. A.1) is proven for ε < 1 only; Huai, Xue and Yang
    use it for any ε. Below ε ≈ 1 it is always larger than the exact minimum
    (:func:`gaussian_sigma_analytic`) and is returned unchanged, so ledgers show the paper's σ;
    for large ε (e.g. ε = 10, δ = 1e-5) the classic σ is *not* enough, and the exact σ is
    returned instead. Never smaller than the paper's σ.

    Examples
    --------
    >>> gaussian_sigma_classic_safe(1.0, 0.5, 1e-5) == gaussian_sigma_approx_dp(1.0, 0.5, 1e-5)
    True
    >>> gaussian_sigma_classic_safe(1.0, 10.0, 1e-5) > gaussian_sigma_approx_dp(1.0, 10.0, 1e-5)
    True

    """
    classic = gaussian_sigma_approx_dp(sensitivity, epsilon, delta)
    if sensitivity == 0:
        return classic
    return max(classic, gaussian_sigma_analytic(sensitivity, epsilon, delta))


def laplace_scale_from_l2(l2_sensitivity: float, epsilon: float, n_coordinates: int) -> float:
    """Laplace scale for a vector whose ℓ2 sensitivity is known: ``b = √p·Δ₂/ε``.

    ``‖v‖₁ ≤ √p‖v‖₂`` for ``v ∈ R^p``, so ``√p·Δ₂`` bounds the ℓ1 sensitivity. This is Xue et
    al.'s ``λ = 8G√d/(αnε)`` etc. with **p the number of noised coordinates** (``d²`` for a
    d × d metric, not d). Rounded up so that ``ℓ1 sensitivity / b ≤ ε`` holds in floating point.

    Examples
    --------
    >>> laplace_scale_from_l2(1.0, 1.0, 4)
    2.0

    """
    if not (isinstance(n_coordinates, int | np.integer) and n_coordinates >= 1):
        raise ValueError(f"n_coordinates must be an int >= 1, got {n_coordinates!r}")
    l1 = math.sqrt(int(n_coordinates)) * l2_sensitivity
    b = laplace_scale(l1, epsilon)
    while b > 0 and l1 / b > epsilon:
        b = math.nextafter(b, math.inf)
    return b
