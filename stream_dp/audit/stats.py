"""Statistics of an empirical privacy audit: Clopper–Pearson bounds and the ε lower bound.

An (ε, δ)-DP mechanism M gives, for every test that guesses from one output whether a canary
was in the input (Kairouz et al. 2015; Jagielski et al. 2020; Nasr et al. 2021)::

    FPR + e^ε · FNR ≥ 1 − δ      and      FNR + e^ε · FPR ≥ 1 − δ

so any observed pair of error rates certifies ``ε ≥ max(log((1 − δ − FNR)/FPR),
log((1 − δ − FPR)/FNR))``. With finitely many trials the rates are replaced by Clopper–Pearson
*upper* confidence bounds, each at level ``1 − (1 − confidence)/2`` so that both hold together
with probability ``confidence`` (union bound); the resulting ε is then a lower bound on the
mechanism's true ε with at least that probability.

The threshold of the test must be chosen on trials that are *not* used to estimate the rates
(:func:`select_threshold` on a calibration half, :func:`epsilon_lower_bound` on the other half).

"""

from __future__ import annotations

import numpy as np
from scipy import stats

__all__ = [
    "clopper_pearson_upper",
    "epsilon_from_rates",
    "epsilon_lower_bound",
    "select_threshold",
    "fit_linear_test",
]


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

    A diagonal linear discriminant: ``w_j = (mean_canary_j − mean_benign_j) / pooled var_j``.
    For independent Gaussian releases with a mean shift this *is* the likelihood-ratio
    statistic; otherwise it is just a score whose threshold the audit calibrates. Fit it on the
    calibration half only.

    Parameters
    ----------
    canary, benign
        ``(trials, features)`` observations of each world.

    Examples
    --------
    >>> import numpy as np
    >>> c = np.array([[1.0, 0.0], [3.0, 0.1]]); b = np.array([[-1.0, 0.0], [-3.0, -0.1]])
    >>> fit_linear_test(c, b)  # the second feature is as informative but 20 times less noisy
    array([ 4., 40.])

    """
    canary = np.atleast_2d(np.asarray(canary, dtype=float))
    benign = np.atleast_2d(np.asarray(benign, dtype=float))
    diff = canary.mean(axis=0) - benign.mean(axis=0)
    var = 0.5 * (canary.var(axis=0) + benign.var(axis=0))
    scale = float(np.max(var)) if var.size else 0.0
    var = np.maximum(var, 1e-12 * max(scale, 1e-300))
    return diff / var


def select_threshold(
    canary_scores: np.ndarray,
    benign_scores: np.ndarray,
    delta: float,
    confidence: float = 0.95,
    max_candidates: int = 4096,
) -> tuple[float, float]:
    """The threshold τ ("canary" iff score > τ) that maximises the certified ε on these scores.

    Use calibration trials only: the returned threshold is then a fixed test for the evaluation
    trials, and their Clopper–Pearson bound is valid.

    Returns
    -------
    (threshold, epsilon_on_these_scores)

    Examples
    --------
    >>> import numpy as np
    >>> rng = np.random.default_rng(0)
    >>> tau, eps = select_threshold(rng.normal(3, 1, 4000), rng.normal(0, 1, 4000), 1e-5)
    >>> 1.0 < tau < 4.0 and eps > 2.0
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
    eps = np.asarray(epsilon_lower_bound(fp, len(b), fn, len(c), delta, confidence))
    best = int(np.argmax(eps))
    return float(candidates[best]), float(eps[best])
