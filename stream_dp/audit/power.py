"""The power of an audit: how likely its GDP test is to flag a mechanism that leaks more.

A test's verdict depends only on its two error counts, which are independent binomials given the
error rates at its threshold. :func:`flag_probability` sums the exact binomial probabilities of
the counts that would flag; :func:`predicted_power` applies it to an alternative built from the
audit's own evaluation scores: the canary world's scores moved away from the benign world's by
``k − 1`` times their measured separation. For noise that is symmetric around the model, this is
what dividing the noise by ``k`` does near the centre of the score distributions (a location
family's trade-off depends only on separation / spread), where the GDP test's threshold lies; so
``k = 2`` predicts the chance of catching a variant of the audited configuration whose release
noise is halved (σ/2).

It is a prediction, not a guarantee: it assumes the central part of the scores keeps its shape
when the noise shrinks. The (ε, δ) test gets no such prediction: it lives in the tails, whose
shape the projection of the releases onto C changes with the noise (``docs/privacy.md``,
*Empirical audit*, gives its measured power instead).

"""

from __future__ import annotations

import math
from collections.abc import Callable

import numpy as np
from scipy import optimize, stats

from stream_dp.audit.stats import central_threshold, clopper_pearson_upper

__all__ = [
    "detectable_noise_divisor",
    "flag_probability",
    "gdp_boundary",
    "predicted_power",
]

#: Binomial counts further than this many standard deviations from their mean are ignored.
_SPAN = 9.0


def gdp_boundary(mu: float) -> Callable[[np.ndarray], np.ndarray]:
    """The GDP test flags iff the FNR bound is below ``Φ(Φ⁻¹(1 − α) − μ)`` of the FPR bound α.

    Examples
    --------
    >>> round(float(gdp_boundary(1.0)(np.array(0.5))), 4)  # Φ(−1)
    0.1587

    """
    return lambda a: stats.norm.sf(mu - stats.norm.isf(a))


def _window(n: int, p: float) -> np.ndarray:
    sd = math.sqrt(n * p * (1.0 - p))
    lo = max(0, math.floor(n * p - _SPAN * sd) - 1)
    hi = min(n, math.ceil(n * p + _SPAN * sd) + 1)
    return np.arange(lo, hi + 1)


def flag_probability(
    fpr: float,
    fnr: float,
    n_negative: int,
    n_positive: int,
    level: float,
    boundary: Callable[[np.ndarray], np.ndarray],
) -> float:
    """Probability that a test with these true error rates flags, on these many trials.

    The test flags when ``CP(fn) < boundary(CP(fp))``, ``CP`` the one-sided Clopper–Pearson
    upper bound at ``level`` (e.g. :func:`gdp_boundary`). With
    ``fp ~ Bin(n_negative, fpr)`` and ``fn ~ Bin(n_positive, fnr)`` independent, the result is
    ``Σ_fp P(fp)·P(fn ≤ k*(fp))`` with ``k*`` the largest count that still flags; counts beyond
    9 standard deviations are dropped (less than 1e-18 of probability).

    Examples
    --------
    >>> from scipy import stats
    >>> mu = 1.0  # N(0, 1) vs N(1, 1) at the midpoint, 1000 trials per world, claim μ = 0.5
    >>> p = flag_probability(stats.norm.sf(0.5), stats.norm.sf(0.5), 1000, 1000, 0.975,
    ...                      gdp_boundary(0.5))
    >>> 0.9 < p < 1.0
    True

    """
    fps = _window(n_negative, float(fpr))
    fns = _window(n_positive, float(fnr))
    pmf = stats.binom.pmf(fps, n_negative, fpr)
    keep = pmf > 0.0
    fps, pmf = fps[keep], pmf[keep]
    b_star = boundary(np.asarray(clopper_pearson_upper(fps, n_negative, level), dtype=float))
    fn_ub = np.asarray(clopper_pearson_upper(fns, n_positive, level), dtype=float)
    idx = np.searchsorted(fn_ub, b_star, side="left") - 1  # last count whose bound is below
    k_star = np.where(idx >= 0, fns[np.maximum(idx, 0)], fns[0] - 1)
    return float(np.clip(np.sum(pmf * stats.binom.cdf(k_star, n_positive, fnr)), 0.0, 1.0))


def _shifted_rates(canary, benign, shift) -> tuple[float, float]:
    """Error rates at the central threshold when the canary scores move by ``shift``."""
    tau = central_threshold(canary + shift, benign)
    return float(np.mean(benign > tau)), float(np.mean(canary + shift <= tau))


def _separation(canary: np.ndarray, benign: np.ndarray) -> float:
    return max(0.0, float(np.median(canary) - np.median(benign)))


def predicted_power(
    canary_scores: np.ndarray,
    benign_scores: np.ndarray,
    k: float,
    n_eval: int,
    level: float,
    gdp_mu: float,
) -> float:
    """Chance that the GDP test flags the audited mechanism with its noise divided by ``k``.

    ``canary_scores``/``benign_scores`` are the audit's evaluation scores; the alternative moves
    the canary scores by ``(k − 1)·(median_c − median_b)`` (never towards the benign ones), the
    test's threshold is the alternative's central threshold, and :func:`flag_probability` gives
    the chance with ``n_eval`` trials per world, Clopper–Pearson at ``level`` per rate and the
    claim ``gdp_mu``.

    Examples
    --------
    >>> rng = np.random.default_rng(1)
    >>> c, b = rng.normal(0.25, 1, 50_000), rng.normal(0, 1, 50_000)
    >>> predicted_power(c, b, 2.0, 50_000, 0.9975, gdp_mu=0.25) > 0.99
    True
    >>> predicted_power(c, b, 1.0, 50_000, 0.9975, gdp_mu=0.25) < 0.01  # at the claim
    True

    """
    c = np.asarray(canary_scores, dtype=float)
    b = np.asarray(benign_scores, dtype=float)
    fpr, fnr = _shifted_rates(c, b, _separation(c, b) * (float(k) - 1.0))
    return flag_probability(fpr, fnr, n_eval, n_eval, level, gdp_boundary(gdp_mu))


def detectable_noise_divisor(
    canary_scores: np.ndarray,
    benign_scores: np.ndarray,
    n_eval: int,
    level: float,
    gdp_mu: float,
    probability: float = 0.9,
    largest: float = 64.0,
) -> float:
    """The smallest ``k`` for which the GDP test flags the noise divided by ``k`` with
    ``probability`` (as :func:`predicted_power`); ``inf`` if not even ``largest`` is caught.

    Examples
    --------
    >>> rng = np.random.default_rng(2)
    >>> c, b = rng.normal(0.25, 1, 50_000), rng.normal(0, 1, 50_000)
    >>> 1.0 < detectable_noise_divisor(c, b, 50_000, 0.9975, 0.25) < 1.3
    True

    """
    c = np.asarray(canary_scores, dtype=float)
    b = np.asarray(benign_scores, dtype=float)
    gap = _separation(c, b)

    def power(k: float) -> float:
        return predicted_power(c, b, k, n_eval, level, gdp_mu)

    if power(1.0) >= probability:
        return 1.0
    if gap == 0.0 or power(largest) < probability:
        return math.inf
    return float(optimize.brentq(lambda k: power(k) - probability, 1.0, largest, xtol=1e-3))
