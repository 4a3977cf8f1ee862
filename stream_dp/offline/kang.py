"""GradPerturb: full-batch gradient perturbation for pairwise losses.

Kang, Liu, Li, Wang. *Towards Sharper Utility Bounds for Differentially Private Pairwise
Learning.* Algorithm 1, Theorems 1–2. The per-iteration σ of Theorem 1 is here; the query it
perturbs is the full pairwise gradient of :mod:`stream_dp.offline.pgd`, whose sensitivity is
:func:`stream_dp.offline.pgd.pairwise_gradient_sensitivity` (``docs/algorithms.md``,
*GradPerturb*).
"""

from __future__ import annotations

import math
import warnings

import numpy as np

from stream_dp.offline.pgd import PGDBase, calibrate_iterations, pairwise_gradient_sensitivity, pgd
from stream_dp.privacy.budget import PrivacyBudget, zcdp_budget
from stream_dp.privacy.events import GaussianEvent

__all__ = ["GradPerturb", "gradperturb_sigma"]


def gradperturb_sigma(lipschitz: float, n_iter: int, n: int, epsilon: float, delta: float) -> float:
    """Gradient perturbation (Kang et al., Alg. 1, Thm. 1): ``σ = 8G√(T ln(1/δ))/(nε)``.

    Theorem 1 states this σ (moments accountant, composition over the T iterations included)
    for the full pairwise gradient of ℓ2 sensitivity ``4G/n``.

    Examples
    --------
    >>> round(gradperturb_sigma(4.0, 4, 256, 1.0, 1 / 256), 4)
    0.5887

    """
    return 8.0 * lipschitz * math.sqrt(n_iter * math.log(1.0 / delta)) / (n * epsilon)


class GradPerturb(PGDBase):
    """Gradient perturbation for pairwise learning (Kang et al., Algorithm 1).

    ``θ_t = Π_C(θ_{t−1} − η(∇L(θ_{t−1}; D) + b_t))``, ``b_t ~ N(0, σ²I_p)`` with
    ``σ = 8G√(T ln(1/δ))/(nε)`` (Theorem 1), ``η = 1/L`` and ``T = ⌈ln(nε/√p)⌉``
    (Theorem 2's ``T = O(log(nε/√p))``), from a keyed random ``θ_0 ∈ C``; returns ``θ_T``.
    Only G-Lipschitzness is needed for privacy (no convexity). The projection onto C is not in
    the paper's update: it is post-processing of the noisy step and keeps G valid when a
    regulariser is used.

    **Composition and ledger.** Each iteration releases the full pairwise gradient, whose ℓ2
    sensitivity is ``4G/n`` (:func:`stream_dp.offline.pgd.pairwise_gradient_sensitivity`),
    with Gaussian noise σ (the ``"gradient"`` noise purpose); it is charged as one
    ``GaussianEvent`` to a ``ZCDPAccountant``
    (zCDP composes additively). The paper's σ, derived with the moments accountant, includes
    the composition over T: in zCDP it costs ``ρ = ε²/(8 ln(1/δ))`` in total, about half of
    the ε budget after conversion, so the ledger always shows exactly the paper's σ for
    reasonable (ε, δ); if it ever did not fit, σ is raised (warning, ``sigma_raised_``).

    **Guarantee.** (ε, δ)-DP, ``accountant.spent() ≤ (ε, δ)``; δ > 0 only.
    **Cost.** O(T·n²) pair evaluations with a small T (≈ ln n).

    Parameters
    ----------
    task, epsilon, delta, data_radius, model_radius, seed, reproducible, model_id
        As :class:`stream_dp.offline.OffPairStrC`.
    alpha
        Optional regulariser ``(α/2)‖θ‖²`` (the PL condition of Theorem 2 holds with it).
    n_iter
        T; default ``max(1, ⌈ln(nε/√p)⌉)``.
    eta
        Step size; default ``1/L`` (Theorem 2).
    conversion
        zCDP → (ε, δ) of the ledger.

    Examples
    --------
    >>> import numpy as np
    >>> from stream_dp.offline import GradPerturb
    >>> rng = np.random.default_rng(0)
    >>> X, y = rng.normal(size=(100, 3)), rng.integers(0, 2, 100)
    >>> model = GradPerturb(task="auc", epsilon=1.0, delta=1e-3).fit(X, y)
    >>> model.n_iter_, len(model.accountant.ledger)
    (5, 5)

    """

    _supports_pure = False

    def __init__(
        self,
        task: str = "auc",
        epsilon: float = 1.0,
        delta: float = 1e-5,
        alpha: float = 0.0,
        n_iter: int | None = None,
        eta: float | None = None,
        conversion: str = "tight",
        data_radius: float = 1.0,
        model_radius: float = 1.0,
        seed: int | None = None,
        reproducible: bool = False,
        model_id: str = "gradperturb",
    ) -> None:
        self.task = task
        self.epsilon = epsilon
        self.delta = delta
        self.alpha = alpha
        self.n_iter = n_iter
        self.eta = eta
        self.conversion = conversion
        self.data_radius = data_radius
        self.model_radius = model_radius
        self.seed = seed
        self.reproducible = reproducible
        self.model_id = model_id

    def _new_budget(self) -> PrivacyBudget:
        return zcdp_budget(self.epsilon, self.delta, self.conversion)

    def _plan(self, X, Y, noise):
        loss, constraint, c, w0 = self._setup(X)
        n, p = len(Y), int(w0.size)
        if self.n_iter is not None:
            T = int(self.n_iter)
        else:
            T = max(1, math.ceil(math.log(n * self.epsilon / math.sqrt(p))))
        eta = 1.0 / c.smoothness if self.eta is None else float(self.eta)
        theta0 = constraint.sample(noise.generator(0, "init"), w0.shape)  # "randomly set θ0"
        sens = pairwise_gradient_sensitivity(c.lipschitz, n)
        sigma = gradperturb_sigma(c.lipschitz, T, n, self.epsilon, self.delta)
        self.eta_, self.n_iter_, self.sensitivity_ = eta, T, sens
        return loss, constraint, theta0, T, eta, sens, sigma

    def _query(self, w: np.ndarray, X: np.ndarray, Y: np.ndarray) -> np.ndarray:
        """The quantity each iteration privatises: the full pairwise gradient at θ."""
        return self._loss().all_pairs_gradient(w, X, Y)

    def _fit_private(self, X, Y):
        noise = self._make_noise()
        loss, constraint, theta0, T, eta, sens, sigma = self._plan(X, Y, noise)
        sigma, raised = calibrate_iterations(self.budget_, sens, sigma, T)
        self.sigma_raised_ = raised
        if raised:
            warnings.warn(
                f"GradPerturb: the paper's σ does not fit the (ε={self.epsilon}, "
                f"δ={self.delta}) budget for T = {T}; σ is raised to {sigma:.4g}",
                RuntimeWarning,
                stacklevel=3,
            )
        self.noise_scale_ = sigma
        trace = [] if getattr(self, "_keep_trace", False) else None

        def gradient_noise(t, w):
            if trace is not None:
                trace.append(w.copy())
            self._charge(GaussianEvent(step=t, sensitivity=sens, sigma=sigma))
            return noise.gaussian(t, w.shape, sigma, purpose="gradient")

        theta = pgd(loss, constraint, X, Y, theta0, eta, T, "none", gradient_noise)
        self.trace_ = trace
        return theta

    def _statistic(self, X, Y, noise):
        loss, constraint, theta0, T, eta, sens, sigma = self._plan(X, Y, noise)
        return pgd(loss, constraint, X, Y, theta0, eta, T), sens, constraint
