"""PairwiseSGD: pairwise SGD with output perturbation, for non-smooth (hinge) losses.

Yang, Lei, Lyu, Ying. *Stability and Differential Privacy of Stochastic Gradient Descent for
Pairwise Learning with Non-Smooth Loss.* AISTATS 2021, Algorithm 2, Theorems 1 and 4. The
high-probability sensitivity (Theorem 1) and its Gaussian calibration (Theorem 4) are here
(``docs/algorithms.md``, *PairwiseSGD*).
"""

from __future__ import annotations

import math

import numpy as np

from stream_dp.losses import get_loss
from stream_dp.offline.base import OfflinePairwiseBase, _positive, _positive_int, make_constraint
from stream_dp.privacy.mechanisms import gaussian_sigma_analytic

__all__ = ["PairwiseSGD", "pairwise_sgd_sensitivity", "pairwise_sgd_sigma"]


def pairwise_sgd_sensitivity(
    lipschitz: float, eta: float, n_iter: int, n: int, delta: float
) -> float:
    """High-probability ℓ2 sensitivity of Yang et al.'s (AISTATS 2021) averaged pairwise SGD.

    With probability ≥ 1 − δ/2 over the sampled indices (Thm. 1, eq. 3, γ = δ/2),
    ``Δ_T² ≤ 4eη²G²·B`` where, with ``l = ln(2/δ)``,

    * for ``T ≥ n``: ``B = T + 3T² ln²(eT) l²/n²`` (eq. 9, the form behind eq. 5; it
      upper-bounds eq. 3 when T ≥ n);
    * for ``T < n``, where eq. (9) does not hold: ``B = T + ln²(eT)·(T/n + l + √(T l/n))²``
      (eq. 3 at t = T, valid for every T).

    Note the factor **e**: eq. (5) of the paper drops the ``e`` of eqs. (3) and (9); we keep
    it, so for T ≥ n σ² is exactly e times eq. (5) (``docs/algorithms.md``, *Where the project
    departs from the papers*, 6).

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


class PairwiseSGD(OfflinePairwiseBase):
    """Private SGD for pairwise learning with output perturbation (Yang et al., Algorithm 2).

    From ``w_1 = 0`` and ``i_1`` uniform, for t = 1..T draw ``i_{t+1}`` uniformly (with
    replacement, keyed and data-independent) and step against every index drawn so far:
    ``w_{t+1} = Π_C(w_t − (η/t) Σ_{k≤t} ∂ℓ(w_t; z_{i_{t+1}}, z_{i_k}))``; release
    ``Π_C(w̄_T + N(0, σ²I))`` with ``w̄_T = (w_1+…+w_T)/T``.

    **Noise.** With probability ≥ 1 − δ/2 over the indices the sensitivity of ``w̄_T`` is at
    most ``Δ_T`` with ``Δ_T² = 4eη²G²(T + 3T² ln²(eT) ln²(2/δ)/n²)`` (Thm. 1, eq. 9, T ≥ n;
    for T < n the general eq. 3 at t = T), and the Gaussian is calibrated to (ε, δ/2):
    ``σ = √(2 ln(2.5/δ))·Δ_T/ε`` (Thm. 4). For T ≥ n this is ``e`` times eq. (5)'s
    ``σ² = (8η²G² ln(2.5/δ)/ε²)(T + 3T² ln²(eT) ln²(2/δ)/n²)``: the paper's eq. (5) drops the
    factor e of its own eqs. (3) and (9), which would under-noise by √e; we keep it.

    **Guarantee.** (ε, δ)-DP (Theorem 4); one ``ApproxDPEvent``; δ > 0 only. (Where the
    classic calibration is not (ε, δ/2)-DP — large ε — σ is raised to the exact value.)

    **Cost.** O(T²·d) for AUC (O(T²·d²) metric): the inner sum grows with t. The paper's
    ``T = n²`` (Corollaries 2 and 4) costs O(n⁴d), so **T is a parameter with
    default n** (one pass worth of sampled records, O(n²d)), and the default step size
    ``η = diam(C)/(G√(n·T))`` extends the paper's choice (``T = n², η = O(n^{−3/2})``) to any
    T. The noise stays ``Õ(ηG√T/ε)``, i.e. ``Õ(diam/(√n ε))`` with these defaults.

    Parameters
    ----------
    task
        ``"auc"``: hinge ranking loss ``(1 − wᵀ(x − x'))₊`` on pairs of opposite labels, L2
        ball. ``"metric"``: hinge metric loss ``(1 + τ(y, y')(x−x')ᵀW(x−x'))₊``, PSD ∩
        Frobenius or nuclear-norm ball.
    loss
        ``"hinge"`` (the paper) or ``"logistic"`` (any G-Lipschitz convex loss works).
    constraint
        Metric only: ``"frobenius"`` (``‖W‖_F ≤ D``) or ``"nuclear"`` (``‖W‖_{S1} ≤ D``,
        Yang et al. Lemma 5). AUC uses the L2 ball.
    n_iter
        T; default n.
    eta
        Step size; default ``diam(C)/(G√(n·T))``.
    epsilon, delta, data_radius, model_radius, seed, reproducible, model_id
        As :class:`stream_dp.offline.OffPairStrC` (δ > 0 required).

    Examples
    --------
    >>> import numpy as np
    >>> from stream_dp.offline import PairwiseSGD
    >>> rng = np.random.default_rng(0)
    >>> X, y = rng.normal(size=(50, 3)), rng.integers(0, 3, 50)
    >>> model = PairwiseSGD(task="metric", constraint="nuclear", epsilon=1.0, delta=1e-3)
    >>> model = model.fit(X, y)
    >>> float(np.linalg.eigvalsh(model.private_weights).sum()) <= 1.0 + 1e-9
    True

    """

    _supports_pure = False

    def __init__(
        self,
        task: str = "auc",
        epsilon: float = 1.0,
        delta: float = 1e-5,
        loss: str = "hinge",
        constraint: str = "default",
        n_iter: int | None = None,
        eta: float | None = None,
        data_radius: float = 1.0,
        model_radius: float = 1.0,
        seed: int | None = None,
        reproducible: bool = False,
        model_id: str = "pairwise-sgd",
    ) -> None:
        self.task = task
        self.epsilon = epsilon
        self.delta = delta
        self.loss = loss
        self.constraint = constraint
        self.n_iter = n_iter
        self.eta = eta
        self.data_radius = data_radius
        self.model_radius = model_radius
        self.seed = seed
        self.reproducible = reproducible
        self.model_id = model_id

    def _check_params(self) -> None:
        _positive_int("n_iter", self.n_iter)
        _positive("eta", self.eta, allow_none=True)
        if self.loss not in ("hinge", "logistic"):
            raise ValueError(f"loss must be 'hinge' or 'logistic', got {self.loss!r}")

    def _base_loss(self):
        return get_loss(self.task, self.loss)

    def _statistic(self, X, Y, noise):
        n = len(Y)
        constraint = make_constraint(self.task, float(self.model_radius), self.constraint)
        loss = self._base_loss()
        c = self._constants(loss)
        T = n if self.n_iter is None else int(self.n_iter)
        eta = (
            constraint.diameter / (c.lipschitz * math.sqrt(n * T))
            if self.eta is None
            else float(self.eta)
        )
        self.n_iter_, self.eta_, self.constants_ = T, eta, c
        # i_1..i_{T+1}, uniform with replacement, from the keyed "sampling" lane.
        idx = noise.generator(0, "sampling").integers(0, n, size=T + 1)
        w = np.zeros(loss.param_shape(X.shape[1]))
        total = np.zeros_like(w)
        for t in range(1, T + 1):
            total += w  # w_t
            new, past = idx[t], idx[:t]
            D = X[new] - X[past]
            cf = loss.pair_coefficients(Y[new], Y[past])
            g = loss.pair_gradient_sum(w, D, cf) / t
            w = constraint.project(w - eta * g)
        w_bar = total / T
        sens = pairwise_sgd_sensitivity(c.lipschitz, eta, T, n, self.delta)
        return w_bar, sens, constraint

    def _fit_private(self, X, Y):
        noise = self._make_noise()
        stat, sens, constraint = self._statistic(X, Y, noise)
        n = len(Y)
        c = self.constants_
        sigma = pairwise_sgd_sigma(
            c.lipschitz, self.eta_, self.n_iter_, n, self.epsilon, self.delta
        )
        # The classic calibration of Thm. 4 is proven for ε < 1; never go below the exact σ of
        # an (ε, δ/2) Gaussian (binding only for large ε).
        sigma = max(sigma, gaussian_sigma_analytic(sens, self.epsilon, self.delta / 2.0))
        self.sensitivity_ = sens
        return self._perturb_output(stat, sens, constraint, noise, step=0, sigma=sigma)
