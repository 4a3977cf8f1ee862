"""Noise calibration for the Gaussian and Laplace mechanisms — every σ and b is computed here.

The first three functions are the generic mechanisms. The rest are the offline algorithms'
sensitivities and calibrations (SPEC §7), each citing its paper, lemma and equation; the
offline estimators in :mod:`stream_dp.offline` call these and nothing else.
"""

from __future__ import annotations

import math

import numpy as np

from stream_dp._jit import jitable

__all__ = [
    "ZERO_SENSITIVITY_SIGMA",
    "release_sigma",
    "gaussian_sigma_zcdp",
    "gaussian_sigma_approx_dp",
    "laplace_scale",
    # offline algorithms (SPEC §7)
    "gaussian_sigma_analytic",
    "gaussian_sigma_classic_safe",
    "laplace_scale_from_l2",
    "offpair_sensitivity",
    "dpgdsc_sensitivity",
    "dpgdc_sensitivity",
    "dpegd_sensitivity",
    "pairwise_gradient_sensitivity",
    "pairwise_sgd_sensitivity",
    "dpgdc2_sigma",
    "gradperturb_sigma",
    "pairwise_sgd_sigma",
    "dppdml_laplace_scale",
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
# Rigorous forms of the classic calibrations used by the offline algorithms (SPEC §7)
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
        return gaussian_delta_exact(sensitivity**2 / (2.0 * sigma**2), epsilon) <= delta

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


# --------------------------------------------------------------------------------------------
# Sensitivities of the offline algorithms (SPEC §7); each cites its lemma
# --------------------------------------------------------------------------------------------


def offpair_sensitivity(lipschitz: float, alpha: float, n: int) -> float:
    """OffPairStrC / OffPairC (Huai et al. 2020, Alg. 3–4): ℓ2 sensitivity ``8G ln n/(αn)``.

    The average ``w̃ = (w_1+…+w_n)/n`` of Pairwise GIGA iterates; by Lemma 4
    ``‖w_t − w'_t‖ ≤ 8G/(αt)`` and ``(1/n)Σ_t 8G/(αt) ≤ 8G ln n/(αn)``. With the classic Gaussian
    this is exactly Alg. 3 step 9's ``σ² = 128G² ln²n ln(1.25/δ)/(α²n²ε²)``.

    Examples
    --------
    >>> round(offpair_sensitivity(4.0, 1.0, 100), 4)
    1.4737

    """
    return 8.0 * lipschitz * math.log(n) / (alpha * n)


def dpgdsc_sensitivity(lipschitz: float, alpha: float, n: int) -> float:
    """DPGDSC (Xue et al. 2021, Alg. 1, Lemma 1, eq. 3): ``‖w_T − w'_T‖ ≤ 8G/(αn)``.

    Examples
    --------
    >>> dpgdsc_sensitivity(4.0, 0.5, 64)
    1.0

    """
    return 8.0 * lipschitz / (alpha * n)


def dpgdc_sensitivity(lipschitz: float, eta: float, n_iter: int, n: int) -> float:
    """DPGDC (Xue et al. 2021, Alg. 4, Lemma 7, eq. 7): average of PGD iterates, ``4GηT/n``.

    Examples
    --------
    >>> dpgdc_sensitivity(4.0, 0.5, 10, 80)
    1.0

    """
    return 4.0 * lipschitz * eta * n_iter / n


def dpegd_sensitivity(lipschitz: float, eta_i: float) -> float:
    """DPEGD epoch i (Xue et al. 2021, Alg. 3, proof of Thm. 3): ``4Gη_i T_i/n_i = 4Gη_i``.

    Examples
    --------
    >>> dpegd_sensitivity(4.0, 0.125)
    2.0

    """
    return 4.0 * lipschitz * eta_i


def pairwise_gradient_sensitivity(lipschitz: float, n: int) -> float:
    """ℓ2 sensitivity of the full pairwise gradient ``1/(n(n−1)) Σ_{i≠j} ∇ℓ``: ``4G/n``.

    Replacing one record changes the 2(n − 1) ordered pairs it takes part in, each by at most
    2G (Xue et al. 2021, proof of Lemma 1; Kang et al., App. B.2).

    Examples
    --------
    >>> pairwise_gradient_sensitivity(4.0, 100)
    0.16

    """
    return 4.0 * lipschitz / n


def pairwise_sgd_sensitivity(
    lipschitz: float, eta: float, n_iter: int, n: int, delta: float
) -> float:
    """High-probability ℓ2 sensitivity of Yang et al.'s (AISTATS 2021) averaged pairwise SGD.

    With probability ≥ 1 − δ/2 over the sampled indices (Thm. 1, eq. 3, γ = δ/2),
    ``Δ_T² ≤ 4eη²G²·B`` where, with ``l = ln(2/δ)``,

    * for ``T ≥ n``: ``B = T + 3T² ln²(eT) l²/n²`` (eq. 9, the form behind eq. 5 and SPEC §7;
      it upper-bounds eq. 3 when T ≥ n);
    * for ``T < n``, where eq. (9) does not hold: ``B = T + ln²(eT)·(T/n + l + √(T l/n))²``
      (eq. 3 at t = T, valid for every T).

    Note the factor **e**: eq. (5) of the paper (and SPEC §7, which copies it) drops the ``e``
    of eqs. (3) and (9); we keep it, so for T ≥ n σ² is exactly e times eq. (5).

    Examples
    --------
    >>> round(pairwise_sgd_sensitivity(2.0, 0.01, 100, 100, 1e-3), 4)
    4.911

    """
    if not (0 < delta < 1):
        raise ValueError(f"delta must be in (0, 1), got {delta!r}")
    T, ell = float(n_iter), math.log(2.0 / delta)
    log_et = math.log(math.e * T)
    if n_iter >= n:
        b = T + 3.0 * T**2 * log_et**2 * ell**2 / n**2
    else:
        b = T + log_et**2 * (T / n + ell + math.sqrt(T * ell / n)) ** 2
    return math.sqrt(4.0 * math.e * eta**2 * lipschitz**2 * b)


# --------------------------------------------------------------------------------------------
# Per-iteration Gaussian noise of the gradient-perturbation algorithms (SPEC §7)
# --------------------------------------------------------------------------------------------


def dpgdc2_sigma(lipschitz: float, n_iter: int, n: int, epsilon: float, delta: float) -> float:
    """DPGDC2 (Xue et al. 2021, Alg. 2): ``σ = 4G√(1.25·T·ln(1/δ))/(nε)`` per iteration.

    Examples
    --------
    >>> round(dpgdc2_sigma(4.0, 100, 256, 1.0, 1 / 256), 4)
    1.6455

    """
    return 4.0 * lipschitz * math.sqrt(1.25 * n_iter * math.log(1.0 / delta)) / (n * epsilon)


def gradperturb_sigma(lipschitz: float, n_iter: int, n: int, epsilon: float, delta: float) -> float:
    """Gradient perturbation (Kang et al., Alg. 1, Thm. 1): ``σ = 8G√(T ln(1/δ))/(nε)``.

    Examples
    --------
    >>> round(gradperturb_sigma(4.0, 4, 256, 1.0, 1 / 256), 4)
    0.5887

    """
    return 8.0 * lipschitz * math.sqrt(n_iter * math.log(1.0 / delta)) / (n * epsilon)


def pairwise_sgd_sigma(
    lipschitz: float, eta: float, n_iter: int, n: int, epsilon: float, delta: float
) -> float:
    """Yang et al. (AISTATS 2021) Alg. 2 / Thm. 4: ``σ = √(2 ln(2.5/δ))·Δ_T/ε``.

    ``Δ_T`` is :func:`pairwise_sgd_sensitivity`; for ``T ≥ n`` this is
    ``σ² = e·(8η²G² ln(2.5/δ)/ε²)(T + 3T² ln²(eT) ln²(2/δ)/n²)`` — eq. (5) times e.

    Examples
    --------
    >>> round(pairwise_sgd_sigma(2.0, 0.01, 100, 100, 1.0, 1e-3), 3)
    19.427

    """
    delta_t = pairwise_sgd_sensitivity(lipschitz, eta, n_iter, n, delta)
    return math.sqrt(2.0 * math.log(2.5 / delta)) * delta_t / epsilon


def dppdml_laplace_scale(
    kappa: int, clip: float, batch_size: int, n_rows: int, epsilon_epoch: float
) -> float:
    """DPP-DML (Li et al., TIFS 2020, Alg. 1 step 10, Thm. 1) Laplace scale per coordinate.

    One edge moves row r of the batch gradient by at most ``Δg_r = 2h/|B|`` in ℓ1 (rows are
    clipped to ℓ1 norm h); κ edges by ``κ·Δg_r``. The paper draws ``Lap(κΔg_r/ε')`` for each of
    the d' rows *independently*, but one edge moves every row at once, so the whole gradient's
    ℓ1 sensitivity is ``d'·κ·Δg_r``: we split ε' over the rows, i.e.
    ``b = κ·(2h/|B|)/(ε'/d')``. The paper's per-row scale would spend d'·ε' per epoch.

    Examples
    --------
    >>> dppdml_laplace_scale(kappa=2, clip=0.5, batch_size=50, n_rows=1, epsilon_epoch=1.0)
    0.04

    """
    if not epsilon_epoch > 0:
        raise ValueError(f"epsilon_epoch must be > 0, got {epsilon_epoch!r}")
    delta_g_row = 2.0 * clip / batch_size
    scale = kappa * delta_g_row * n_rows / epsilon_epoch
    l1 = kappa * delta_g_row * n_rows
    while scale > 0 and l1 / scale > epsilon_epoch:
        scale = math.nextafter(scale, math.inf)
    return scale
