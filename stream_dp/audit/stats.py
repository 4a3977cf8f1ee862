"""Statistics of an empirical privacy audit: the bounds one fixed test certifies.

A test guesses from one output whether a canary was in the input; on neighbouring inputs it has
a false-positive rate α (benign world, said "canary") and a false-negative rate β. Two
guarantees constrain every such pair, and each gives a lower bound:

* **(ε, δ)-DP** (Kairouz et al. 2015; Jagielski et al. 2020; Nasr et al. 2021)::

      α + e^ε·β ≥ 1 − δ      and      β + e^ε·α ≥ 1 − δ

  so an observed pair certifies ``ε ≥ max(log((1 − δ − β)/α), log((1 − δ − α)/β))``
  (:func:`epsilon_from_rates`). Only a test far in the tails certifies much: the evidence is a
  ratio of small rates.
* **μ-Gaussian DP** (Dong, Roth & Su 2022, Def. 2.6): every test has ``β ≥ Φ(Φ⁻¹(1 − α) − μ)``,
  so an observed pair certifies ``μ ≥ Φ⁻¹(1 − α) − Φ⁻¹(β)`` (:func:`gdp_mu_from_rates`). This
  needs no tail: at a central threshold, where the rates are most precisely measured, it is as
  tight as anywhere for a Gaussian mechanism. A bound on μ is *not* a bound on ε: it says the
  mechanism is not μ'-GDP for μ' below it, hence that no Gaussian-DP account of it — such as a
  ledger of Gaussian releases, which composes to ``μ = √(Σ Δ_t²/σ_t²)`` (their Cor. 3.3) — can
  certify less than :func:`gdp_epsilon` of it.

With finitely many trials the rates are replaced by Clopper–Pearson *upper* confidence bounds,
each at level ``1 − (1 − confidence)/2`` so that both hold together with probability
``confidence`` (union bound); both certified quantities only decrease when a rate increases, so
the bound holds with at least that probability.

The test — the score's weights and its threshold — must be fixed before the trials that are
counted are drawn (:func:`fit_linear_test`, :func:`central_threshold`, :func:`tail_threshold` on
pilot trials only).

"""

from __future__ import annotations

import numpy as np
from scipy import stats

from stream_dp.privacy.conversions import gaussian_epsilon_exact

__all__ = [
    "central_threshold",
    "clopper_pearson_upper",
    "epsilon_from_rates",
    "epsilon_lower_bound",
    "fit_linear_test",
    "gdp_epsilon",
    "gdp_mu_from_rates",
    "gdp_mu_lower_bound",
    "tail_threshold",
]

#: Level of the one-standard-error upper bound on a pilot rate (Φ(1)): see :func:`tail_threshold`.
_ONE_SE = 0.8413447460685429


def clopper_pearson_upper(k: int | np.ndarray, n: int, level: float) -> float | np.ndarray:
    """One-sided Clopper–Pearson upper bound on a binomial rate.

    With probability at least ``level`` the true rate is at most the returned value.

    Parameters
    ----------
    k
        Number of events (scalar or array) out of ``n`` trials.
    n
        Number of trials (> 0).
    level
        One-sided confidence level in (0, 1).

    Returns
    -------
    float or numpy.ndarray
        The bound; 1 where ``k == n``.

    Examples
    --------
    >>> round(clopper_pearson_upper(0, 1000, 0.975), 5)  # ≈ −ln(0.025)/n
    0.00368
    >>> clopper_pearson_upper(10, 10, 0.95)
    1.0

    """
    if not 0.0 < level < 1.0:
        raise ValueError(f"level must be in (0, 1), got {level!r}")
    if n <= 0:
        raise ValueError(f"need at least one trial, got n={n!r}")
    k_arr = np.asarray(k)
    if np.any(k_arr < 0) or np.any(k_arr > n):
        raise ValueError("need 0 <= k <= n")
    out = np.where(
        k_arr >= n, 1.0, stats.beta.ppf(level, np.minimum(k_arr + 1, n), np.maximum(n - k_arr, 1))
    )
    return float(out) if np.ndim(out) == 0 else out


def epsilon_from_rates(
    fpr: float | np.ndarray, fnr: float | np.ndarray, delta: float
) -> float | np.ndarray:
    """The ε certified by a test with false-positive rate ``fpr`` and false-negative ``fnr``.

    ``max(0, log((1 − δ − fnr)/fpr), log((1 − δ − fpr)/fnr))``; a zero rate with a positive
    numerator gives ``inf`` (callers pass upper confidence bounds, which are never zero).

    Examples
    --------
    >>> round(epsilon_from_rates(0.1, 0.5, 0.0), 4)  # log(0.5 / 0.1)
    1.6094
    >>> epsilon_from_rates(0.5, 0.5, 1e-5)
    0.0

    """
    fpr = np.asarray(fpr, dtype=float)
    fnr = np.asarray(fnr, dtype=float)
    with np.errstate(divide="ignore", invalid="ignore"):
        e1 = np.log(np.clip(1.0 - delta - fnr, 0.0, None) / fpr)
        e2 = np.log(np.clip(1.0 - delta - fpr, 0.0, None) / fnr)
    eps = np.fmax(np.fmax(np.nan_to_num(e1, nan=0.0, neginf=0.0), 0.0), e2)
    eps = np.nan_to_num(eps, nan=0.0, neginf=0.0)
    return float(eps) if eps.ndim == 0 else eps


def epsilon_lower_bound(
    false_positives: int | np.ndarray,
    n_negative: int,
    false_negatives: int | np.ndarray,
    n_positive: int,
    delta: float,
    confidence: float = 0.95,
) -> float | np.ndarray:
    """Clopper–Pearson lower bound on ε from the error counts of one fixed test.

    Both error rates are bounded at level ``1 − (1 − confidence)/2`` (union bound), so the
    returned ε is below the mechanism's true ε with probability at least ``confidence``.

    Parameters
    ----------
    false_positives, n_negative
        Trials without the canary in which the test said "canary", and how many there were.
    false_negatives, n_positive
        Trials with the canary in which the test said "no canary", and how many there were.
    delta
        The δ of the claim being audited.
    confidence
        Joint confidence of the two bounds (default 0.95).

    Examples
    --------
    >>> round(epsilon_lower_bound(3, 5000, 4000, 5000, 1e-5), 3)  # FPR ≤ 0.0018, FNR ≤ 0.81
    4.681
    >>> epsilon_lower_bound(2500, 5000, 2500, 5000, 1e-5)  # a coin flip certifies nothing
    0.0

    """
    level = 1.0 - (1.0 - confidence) / 2.0
    fpr_ub = clopper_pearson_upper(false_positives, n_negative, level)
    fnr_ub = clopper_pearson_upper(false_negatives, n_positive, level)
    return epsilon_from_rates(fpr_ub, fnr_ub, delta)


def fit_linear_test(canary: np.ndarray, benign: np.ndarray) -> np.ndarray:
    """Weights of a linear score that separates canary from benign observations.

    Fisher's linear discriminant: ``w = Σ⁻¹·(mean_canary − mean_benign)`` with Σ the pooled
    covariance of the two worlds (plus a ridge of 1e-12 of its mean variance). For Gaussian
    releases with a mean shift — independent or correlated (noise correlated across steps) —
    this *is* the log-likelihood-ratio statistic, the most powerful test (Neyman–Pearson);
    otherwise it is just a score whose thresholds the audit calibrates. Fit it on pilot trials
    only.

    Parameters
    ----------
    canary, benign
        ``(trials, features)`` observations of each world.

    Examples
    --------
    Two releases with shared noise, the second without signal: the discriminant uses it to
    cancel the first release's noise (a diagonal one would ignore it).

    >>> rng = np.random.default_rng(0)
    >>> def world(m, n=200_000):
    ...     z, e = rng.normal(size=n), rng.normal(scale=0.1, size=n)
    ...     return np.column_stack([m + z, z + e])
    >>> w = fit_linear_test(world(0.1), world(-0.1))
    >>> np.round(w / w[0], 1)  # the score is ≈ x₁ − x₂ = m − e: the shared noise is gone
    array([ 1., -1.])

    """
    canary = np.asarray(canary, dtype=float)
    benign = np.asarray(benign, dtype=float)
    canary = canary.reshape(len(canary), -1)
    benign = benign.reshape(len(benign), -1)
    diff = canary.mean(axis=0) - benign.mean(axis=0)
    cov = 0.5 * (
        np.atleast_2d(np.cov(canary, rowvar=False, bias=True))
        + np.atleast_2d(np.cov(benign, rowvar=False, bias=True))
    )
    ridge = 1e-12 * max(float(np.trace(cov)) / len(cov), 1e-300)
    return np.linalg.solve(cov + ridge * np.eye(len(cov)), diff)


def gdp_mu_from_rates(fpr: float | np.ndarray, fnr: float | np.ndarray) -> float | np.ndarray:
    """The μ a test with false-positive rate ``fpr`` and false-negative ``fnr`` certifies.

    ``max(0, Φ⁻¹(1 − fpr) − Φ⁻¹(fnr))``: a μ-GDP mechanism has ``fnr ≥ Φ(Φ⁻¹(1 − fpr) − μ)``.
    The expression is symmetric in the two rates, as the GDP trade-off curve is.

    Examples
    --------
    >>> from scipy import stats
    >>> round(gdp_mu_from_rates(stats.norm.sf(0.5), stats.norm.cdf(-0.5)), 12)  # N(0,1), N(1,1)
    1.0
    >>> gdp_mu_from_rates(0.5, 0.5)
    0.0

    """
    fpr = np.asarray(fpr, dtype=float)
    fnr = np.asarray(fnr, dtype=float)
    mu = np.fmax(stats.norm.isf(fpr) + stats.norm.isf(fnr), 0.0)
    mu = np.nan_to_num(mu, nan=0.0)
    return float(mu) if mu.ndim == 0 else mu


def gdp_mu_lower_bound(
    false_positives: int | np.ndarray,
    n_negative: int,
    false_negatives: int | np.ndarray,
    n_positive: int,
    confidence: float = 0.95,
) -> float | np.ndarray:
    """Clopper–Pearson lower bound on the GDP μ of a mechanism from one fixed test's errors.

    With probability at least ``confidence`` the mechanism is not μ-GDP for any μ below the
    result (both rates bounded at ``1 − (1 − confidence)/2``, as in
    :func:`epsilon_lower_bound`).

    Examples
    --------
    >>> round(gdp_mu_lower_bound(30_854, 100_000, 30_854, 100_000), 3)  # rates Φ(−½): μ = 1
    0.984
    >>> gdp_mu_lower_bound(50_000, 100_000, 50_000, 100_000)
    0.0

    """
    level = 1.0 - (1.0 - confidence) / 2.0
    fpr_ub = clopper_pearson_upper(false_positives, n_negative, level)
    fnr_ub = clopper_pearson_upper(false_negatives, n_positive, level)
    return gdp_mu_from_rates(fpr_ub, fnr_ub)


def gdp_epsilon(mu: float, delta: float) -> float:
    """The smallest ε for which a μ-GDP mechanism is (ε, δ)-DP (Balle & Wang 2018, Thm. 8).

    The exact privacy profile of a Gaussian mechanism with ``Δ/σ = μ``
    (:func:`stream_dp.privacy.conversions.gaussian_epsilon_exact` with ``ρ = μ²/2``).

    Examples
    --------
    >>> round(gdp_epsilon(0.2472, 1e-5), 3)  # the ledger's ρ = 0.0306 at ε = 1, δ = 1e-5
    0.915

    """
    return gaussian_epsilon_exact(0.5 * float(mu) ** 2, delta)


def central_threshold(canary_scores: np.ndarray, benign_scores: np.ndarray) -> float:
    """The midpoint of the two worlds' median scores: the GDP test's threshold.

    For a location family this equalises the two error rates; there the rates have the least
    relative error, and for Gaussian scores the GDP bound is as tight as at any threshold.
    Use pilot scores only.

    Examples
    --------
    >>> central_threshold(np.array([1.0, 2.0, 3.0]), np.array([-1.0, 0.0, 1.0]))
    1.0

    """
    return 0.5 * float(np.median(canary_scores) + np.median(benign_scores))


def tail_threshold(
    canary_scores: np.ndarray,
    benign_scores: np.ndarray,
    n_eval: int,
    delta: float,
    confidence: float = 0.95,
    max_candidates: int = 4096,
) -> float:
    """The threshold τ ("canary" iff score > τ) of the (ε, δ) test, planned on pilot scores.

    Each candidate (a pilot score, in either tail) is judged by the bound it would certify on
    ``n_eval`` fresh trials per world if the fresh rates were the pilot's rates raised by one
    standard error (their Clopper–Pearson bound at Φ(1)): the raise keeps a threshold whose few
    pilot events happened to fall favourably from winning (the winner's curse). Only the choice
    depends on this; the bound is then computed on the fresh trials alone.

    Examples
    --------
    >>> rng = np.random.default_rng(0)
    >>> tau = tail_threshold(rng.normal(1, 1, 20_000), rng.normal(0, 1, 20_000), 200_000, 1e-5)
    >>> 1.5 < abs(tau - 0.5) < 4.0  # in a tail (both are alike for a Gaussian shift)
    True

    """
    c = np.sort(np.asarray(canary_scores, dtype=float))
    b = np.sort(np.asarray(benign_scores, dtype=float))
    pooled = np.unique(np.concatenate([c, b]))
    if len(pooled) > max_candidates:
        pooled = np.unique(np.quantile(pooled, np.linspace(0.0, 1.0, max_candidates)))
    candidates = np.concatenate([[pooled[0] - 1.0], pooled])
    fp = len(b) - np.searchsorted(b, candidates, side="right")  # benign scored above τ
    fn = np.searchsorted(c, candidates, side="right")  # canary scored at or below τ
    fpr = clopper_pearson_upper(fp, len(b), _ONE_SE)
    fnr = clopper_pearson_upper(fn, len(c), _ONE_SE)
    expected = epsilon_lower_bound(fpr * n_eval, n_eval, fnr * n_eval, n_eval, delta, confidence)
    return float(candidates[int(np.argmax(expected))])
