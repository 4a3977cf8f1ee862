"""Projected gradient descent on the full pairwise risk, shared by Xue et al. and Kang et al.

DPGDSC, DPGDC, DPGDC2, DPEGD (:mod:`stream_dp.offline.xue`) and GradPerturb
(:mod:`stream_dp.offline.kang`) minimise the empirical risk
``L(w; D) = 1/(n(n−1)) Σ_{i≠j} ℓ(w; z_i, z_j)`` (Xue et al. 2021, eq. 1) with
:func:`pgd`. The gradient-perturbation variants release that full gradient at every step: its
sensitivity and the zCDP ledger of those releases are here too.
"""

from __future__ import annotations

import math

import numpy as np

from stream_dp.constraints import ConstraintSet
from stream_dp.losses import PairwiseLoss
from stream_dp.offline.base import OfflinePairwiseBase, _positive, _positive_int, make_constraint
from stream_dp.privacy.budget import PrivacyBudget
from stream_dp.privacy.events import gaussian_rho
from stream_dp.privacy.mechanisms import gaussian_sigma_zcdp

__all__ = ["PGDBase", "calibrate_iterations", "pairwise_gradient_sensitivity", "pgd"]


def pairwise_gradient_sensitivity(lipschitz: float, n: int) -> float:
    """ℓ2 sensitivity of the full pairwise gradient ``1/(n(n−1)) Σ_{i≠j} ∇ℓ``: ``4G/n``.

    Replacing one record changes the 2(n − 1) ordered pairs it takes part in, each gradient by
    at most 2G (Xue et al. 2021, proof of Lemma 1; Kang et al., App. B.2): the query that
    DPGDC2 and Kang et al.'s GradPerturb perturb at every iteration.

    Examples
    --------
    >>> pairwise_gradient_sensitivity(4.0, 100)
    0.16

    """
    return 4.0 * lipschitz / n


def pgd(
    loss: PairwiseLoss,
    constraint: ConstraintSet,
    X: np.ndarray,
    Y: np.ndarray,
    w0: np.ndarray,
    eta: float,
    n_iter: int,
    average: str = "none",
    gradient_noise=None,
) -> np.ndarray:
    """Projected gradient descent ``w_t = Π_C(w_{t−1} − η(∇L(w_{t−1}; D) + ζ_t))``.

    ``average``: ``"none"`` returns ``w_T``; ``"last_T"`` returns ``(w_1+…+w_T)/T``
    (Xue Alg. 4); ``"with_start"`` returns ``(w_0+…+w_T)/(T+1)`` (Xue Alg. 2 and Lemma 9).
    ``gradient_noise(t, w)`` returns ζ_t for the gradient queried at ``w = w_{t−1}`` (Xue
    Alg. 2, Kang Alg. 1); None for plain PGD.

    Examples
    --------
    >>> import numpy as np
    >>> from stream_dp.losses import LogisticAUCLoss
    >>> from stream_dp.constraints import L2Ball
    >>> X, Y = np.array([[1.0, 0.0], [0.0, 1.0]]), np.array([1.0, -1.0])
    >>> pgd(LogisticAUCLoss(), L2Ball(1.0), X, Y, np.zeros(2), 0.5, 50).round(3)
    array([ 0.707, -0.707])

    """
    w = np.array(w0, dtype=float)
    total = w.copy() if average == "with_start" else np.zeros_like(w)
    for t in range(1, n_iter + 1):
        g = loss.all_pairs_gradient(w, X, Y)
        if gradient_noise is not None:
            g = g + gradient_noise(t, w)
        w = constraint.project(w - eta * g)
        total += w
    if average == "last_T":
        return total / n_iter
    if average == "with_start":
        return total / (n_iter + 1)
    return w


def calibrate_iterations(
    budget: PrivacyBudget, sensitivity: float, sigma: float, n_iter: int
) -> tuple[float, bool]:
    """σ for ``n_iter`` Gaussian gradient releases that fit the zCDP budget.

    Returns ``(σ, raised)``: the paper's σ when ``n_iter·Δ²/(2σ²) ≤ ρ_budget``, otherwise the
    smallest σ that fits (the paper's composition argument is then not backed by the ledger's
    rigorous conversion, and we say so).

    Examples
    --------
    >>> from stream_dp.privacy import zcdp_budget
    >>> budget = zcdp_budget(epsilon=1.0, delta=1e-5)
    >>> calibrate_iterations(budget, sensitivity=0.05, sigma=1.0, n_iter=10)
    (1.0, False)
    >>> sigma, raised = calibrate_iterations(budget, sensitivity=1.0, sigma=1.0, n_iter=10)
    >>> raised and 10 / (2 * sigma**2) <= budget.limit
    True

    """
    rho_each = gaussian_rho(sensitivity, sigma)
    limit = budget.limit * (1.0 - 1e-9)  # shave: n correctly rounded ρ's never overrun
    if n_iter * rho_each <= limit:
        return sigma, False
    return gaussian_sigma_zcdp(sensitivity, limit / n_iter), True


class PGDBase(OfflinePairwiseBase):
    """Shared by the full-gradient estimators: the regularised loss, T and η validation, C."""

    def _loss(self) -> PairwiseLoss:
        return self._regularized(float(self.alpha))

    def _check_params(self) -> None:
        if isinstance(self.alpha, bool) or not (
            isinstance(self.alpha, int | float) and self.alpha >= 0 and math.isfinite(self.alpha)
        ):
            raise ValueError(f"alpha must be a finite number >= 0, got {self.alpha!r}")
        _positive_int("n_iter", self.n_iter)
        _positive("eta", self.eta, allow_none=True)

    def _setup(self, X: np.ndarray):
        constraint = make_constraint(self.task, float(self.model_radius))
        loss = self._loss()
        c = self._constants(loss)
        self.constants_ = c
        w0 = np.zeros(loss.param_shape(X.shape[1]))
        return loss, constraint, c, w0
