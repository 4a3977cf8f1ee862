"""Noise calibration for the Gaussian and Laplace mechanisms — every σ and b is computed here."""

from __future__ import annotations

import math

__all__ = ["gaussian_sigma_zcdp", "gaussian_sigma_approx_dp", "laplace_scale"]


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
    return sensitivity / math.sqrt(2.0 * rho)


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
