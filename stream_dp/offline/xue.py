"""DPGDSC, DPGDC, DPGDC2, DPEGD: projected gradient descent on the full pairwise risk.

Xue, Yang, Huai, Wang. *Differentially Private Pairwise Learning Revisited.* IJCAI 2021,
Algorithms 1–4. All four minimise the empirical risk of eq. (1),
``L(w; D) = 1/(n(n−1)) Σ_{i≠j} ℓ(w; z_i, z_j)``, with the vectorised
:meth:`stream_dp.losses.PairwiseLoss.all_pairs_gradient` and the shared optimiser of
:mod:`stream_dp.offline.pgd`. The paper's sensitivities (Lemmas 1 and 7, the proof of
Theorem 3) and Algorithm 2's σ are here, next to the algorithms that use them
(``docs/algorithms.md``, *DPGDSC* to *DPEGD*). The four algorithms share the paper's lemmas,
so they stay in one module (about 540 lines).
"""

from __future__ import annotations

import math
import warnings

import numpy as np

from stream_dp.offline.base import _positive
from stream_dp.offline.pgd import PGDBase, calibrate_iterations, pairwise_gradient_sensitivity, pgd
from stream_dp.privacy.budget import PrivacyBudget, zcdp_budget
from stream_dp.privacy.events import GaussianEvent
from stream_dp.privacy.noise import KeyedNoise

__all__ = [
    "DPEGD",
    "DPGDC",
    "DPGDC2",
    "DPGDSC",
    "dpegd_sensitivity",
    "dpgdc2_sigma",
    "dpgdc_sensitivity",
    "dpgdsc_sensitivity",
]


# -- the paper's sensitivities and calibration -------------------------------------------------
def dpgdsc_sensitivity(lipschitz: float, alpha: float, n: int) -> float:
    """DPGDSC (Xue et al. 2021, Alg. 1, Lemma 1, eq. 3): ``‖w_T − w'_T‖ ≤ 8G/(αn)``.

    Holds for every T as long as ``η ≤ 2/(L+α)`` (the gradient map is then a contraction).

    Examples
    --------
    >>> dpgdsc_sensitivity(4.0, 0.5, 64)
    1.0

    """
    return 8.0 * lipschitz / (alpha * n)


def dpgdc_sensitivity(lipschitz: float, eta: float, n_iter: int, n: int) -> float:
    """DPGDC (Xue et al. 2021, Alg. 4, Lemma 7, eq. 7): average of PGD iterates, ``4GηT/n``.

    Holds for ``η ≤ 2/L`` (the gradient map of a convex L-smooth loss is then non-expansive).

    Examples
    --------
    >>> dpgdc_sensitivity(4.0, 0.5, 10, 80)
    1.0

    """
    return 4.0 * lipschitz * eta * n_iter / n


def dpegd_sensitivity(lipschitz: float, eta_i: float) -> float:
    """DPEGD epoch i (Xue et al. 2021, Alg. 3, proof of Thm. 3): ``4Gη_i T_i/n_i = 4Gη_i``.

    Lemma 7 with ``T_i = n_i`` steps on the ``n_i`` records of part i.

    Examples
    --------
    >>> dpegd_sensitivity(4.0, 0.125)
    2.0

    """
    return 4.0 * lipschitz * eta_i


def dpgdc2_sigma(lipschitz: float, n_iter: int, n: int, epsilon: float, delta: float) -> float:
    """DPGDC2 (Xue et al. 2021, Alg. 2 step 2): ``σ = 4G√(1.25·T·ln(1/δ))/(nε)`` per iteration.

    Examples
    --------
    >>> round(dpgdc2_sigma(4.0, 100, 256, 1.0, 1 / 256), 4)
    1.6455

    """
    return 4.0 * lipschitz * math.sqrt(1.25 * n_iter * math.log(1.0 / delta)) / (n * epsilon)


class DPGDSC(PGDBase):
    """DP gradient descent, strongly convex (Xue et al., IJCAI 2021, Algorithm 1).

    Full-gradient PGD ``w_t = Π_C(w_{t−1} − η∇L(w_{t−1}; D))`` from ``w_0 = 0`` on the
    strongly convex ``ℓ + (α/2)‖w‖²``, ``η ≤ 2/(L+α)``, then output perturbation of ``w_T``:

    * δ > 0: ``w_T + N(0, σ²I)``, ``σ = 8√(2 ln(1.25/δ)) G/(αnε)`` (Alg. 1 step 4);
    * δ = 0: Laplace ``λ = 8G√p/(αnε)`` per coordinate (step 5; p = number of coordinates,
      ``d²`` for a metric).

    The ℓ2 sensitivity ``8G/(αn)`` is Lemma 1 (eq. 3), which holds for every t as long as
    ``η ≤ 2/(L+α)``; so T only trades time for accuracy. The release is projected onto C
    (post-processing).

    **Guarantee.** (ε, δ)-DP (one ``ApproxDPEvent``) or ε-DP (one ``LaplaceEvent``), Theorem 1.
    **Cost.** O(T·n²) pair evaluations (O(T·n²·d) flops for AUC, plus O(T·n·d²) for metric),
    O(n²) memory in row blocks.

    Parameters
    ----------
    task, epsilon, delta, data_radius, model_radius, seed, reproducible, model_id
        As :class:`stream_dp.offline.OffPairStrC`.
    alpha
        λ of ``(λ/2)‖w‖²`` = the strong convexity (the paper: 1e-3 AUC, 1e-2 metric).
    n_iter
        T. Default ``⌈(L/α) ln n⌉`` (Theorem 1's ``Õ((L/α) log n)``), which is large for small
        α (22 000 at λ = 1e-3, n = 256): pass a smaller T when PGD has converged earlier.
    eta
        Step size; default and maximum ``2/(L+α)`` (Lemma 1's condition).

    Examples
    --------
    >>> import numpy as np
    >>> from stream_dp.offline import DPGDSC
    >>> rng = np.random.default_rng(0)
    >>> X, y = rng.normal(size=(50, 3)), rng.integers(0, 2, 50)
    >>> model = DPGDSC(task="auc", epsilon=1.0, delta=1e-3, alpha=1.0, n_iter=20)
    >>> model.fit(X, y).private_weights.shape
    (3,)
    >>> float(model.sensitivity_) == 8 * model.constants_.lipschitz / (1.0 * 50)
    True

    """

    def __init__(
        self,
        task: str = "auc",
        epsilon: float = 1.0,
        delta: float = 1e-5,
        alpha: float = 0.01,
        n_iter: int | None = None,
        eta: float | None = None,
        data_radius: float = 1.0,
        model_radius: float = 1.0,
        seed: int | None = None,
        reproducible: bool = False,
        model_id: str = "dpgdsc",
    ) -> None:
        self.task = task
        self.epsilon = epsilon
        self.delta = delta
        self.alpha = alpha
        self.n_iter = n_iter
        self.eta = eta
        self.data_radius = data_radius
        self.model_radius = model_radius
        self.seed = seed
        self.reproducible = reproducible
        self.model_id = model_id

    def _check_params(self) -> None:
        super()._check_params()
        _positive("alpha", self.alpha)

    def _statistic(self, X, Y, noise):
        loss, constraint, c, w0 = self._setup(X)
        n = len(Y)
        L, a = c.smoothness, c.strong_convexity
        eta_max = 2.0 / (L + a)
        eta = eta_max if self.eta is None else float(self.eta)
        if eta > eta_max * (1 + 1e-12):
            raise ValueError(f"Lemma 1 needs eta <= 2/(L+α) = {eta_max:.6g}, got {eta}")
        T = int(self.n_iter) if self.n_iter is not None else math.ceil(L / a * math.log(n))
        self.eta_, self.n_iter_ = eta, T
        w = pgd(loss, constraint, X, Y, w0, eta, T)
        return w, dpgdsc_sensitivity(c.lipschitz, a, n), constraint

    def _fit_private(self, X, Y):
        noise = self._make_noise()
        stat, sens, constraint = self._statistic(X, Y, noise)
        self.sensitivity_ = sens
        return self._perturb_output(stat, sens, constraint, noise, step=0)


class DPGDC(PGDBase):
    """DP gradient descent, general convex (Xue et al., IJCAI 2021, Appendix C.3, Algorithm 4).

    Full-gradient PGD with ``η ≤ 2/L`` from ``w_0 = 0`` for T steps; the average
    ``(w_1+…+w_T)/T`` is released with output perturbation:

    * δ > 0: ``σ = 4√(2 ln(1.25/δ)) GTη/(nε)`` (Alg. 4 step 5);
    * δ = 0: Laplace ``λ = 4GηT√p/(nε)`` per coordinate. **The paper's step 6 returns the
      average without adding ζ** (a typo: it would not be private); we add it
      (``docs/algorithms.md``, *Where the project departs from the papers*, 3).

    The sensitivity ``4GηT/n`` is Lemma 7 (eq. 7). **Guarantee:** (ε, δ)- or ε-DP
    (Theorem 4), one ledger event. **Cost:** O(T·n²) pair evaluations.

    Parameters
    ----------
    alpha
        Optional regulariser ``(α/2)‖w‖²`` (0 = the general convex case).
    n_iter
        T; default ``⌈√n⌉``.
    eta
        Step size; default ``min(2/L, diam(C)/(G√T))``; must be ``≤ 2/L`` (Lemma 7).

    Other parameters are those of :class:`DPGDSC`.

    Examples
    --------
    >>> import numpy as np
    >>> from stream_dp.offline import DPGDC
    >>> rng = np.random.default_rng(0)
    >>> X, y = rng.normal(size=(64, 3)), rng.integers(0, 2, 64)
    >>> model = DPGDC(task="auc", epsilon=1.0, delta=0.0).fit(X, y)
    >>> model.n_iter_, model.accountant.spent()
    (8, (1.0, 0.0))

    """

    def __init__(
        self,
        task: str = "auc",
        epsilon: float = 1.0,
        delta: float = 1e-5,
        alpha: float = 0.0,
        n_iter: int | None = None,
        eta: float | None = None,
        data_radius: float = 1.0,
        model_radius: float = 1.0,
        seed: int | None = None,
        reproducible: bool = False,
        model_id: str = "dpgdc",
    ) -> None:
        self.task = task
        self.epsilon = epsilon
        self.delta = delta
        self.alpha = alpha
        self.n_iter = n_iter
        self.eta = eta
        self.data_radius = data_radius
        self.model_radius = model_radius
        self.seed = seed
        self.reproducible = reproducible
        self.model_id = model_id

    def _statistic(self, X, Y, noise):
        loss, constraint, c, w0 = self._setup(X)
        n = len(Y)
        T = int(self.n_iter) if self.n_iter is not None else math.ceil(math.sqrt(n))
        eta_max = 2.0 / c.smoothness
        if self.eta is None:
            eta = min(eta_max, constraint.diameter / (c.lipschitz * math.sqrt(T)))
        else:
            eta = float(self.eta)
        if eta > eta_max * (1 + 1e-12):
            raise ValueError(f"Lemma 7 needs eta <= 2/L = {eta_max:.6g}, got {eta}")
        self.eta_, self.n_iter_ = eta, T
        w = pgd(loss, constraint, X, Y, w0, eta, T, average="last_T")
        return w, dpgdc_sensitivity(c.lipschitz, eta, T, n), constraint

    def _fit_private(self, X, Y):
        noise = self._make_noise()
        stat, sens, constraint = self._statistic(X, Y, noise)
        self.sensitivity_ = sens
        return self._perturb_output(stat, sens, constraint, noise, step=0)


class DPGDC2(PGDBase):
    """Noisy projected gradient descent, general convex (Xue et al., IJCAI 2021, Algorithm 2).

    ``w_t = Π_C(w_{t−1} − η(∇L(w_{t−1}; D) + ζ_t))``, ``ζ_t ~ N(0, σ²I)`` with
    ``σ = 4G√(1.25·T·ln(1/δ))/(nε)`` (Alg. 2 step 2), ``T = min(n, n²ε²/(p ln(1/δ)))`` and
    ``η = diam(C)/(G√T)`` (Theorem 2; p = number of coordinates), from ``w_0 = 0``; returns
    ``(w_0+…+w_T)/(T+1)`` (step 4).

    **Composition and ledger.** Each iteration releases one Gaussian gradient with ℓ2
    sensitivity ``4G/n`` (the full pairwise gradient,
    :func:`stream_dp.offline.pgd.pairwise_gradient_sensitivity`), drawn under the ``"gradient"``
    noise purpose. The paper's σ already includes the composition over T (by advanced
    composition, proof omitted). Here every iteration is charged to a ``ZCDPAccountant`` as one
    ``GaussianEvent(step=t, 4G/n, σ)``; zCDP composes exactly and is converted to (ε, δ)
    rigorously (``conversion``). The paper's σ gives ``ρ = ε²/(2.5 ln(1/δ))`` in total, which
    fits the (ε, δ) budget for moderate ε (e.g. ε ≤ 1.5 at δ = 1/n, n ≤ 512) — then the ledger
    shows exactly the paper's σ. Where it does not fit (e.g. ε = 2, δ = 1/256 under the tight
    conversion), σ is raised to the smallest value that does, with a warning, and
    ``sigma_raised_`` is True: the paper's claim is not backed by our accountant there and we
    never overspend.

    **Guarantee.** (ε, δ)-DP, ``accountant.spent() ≤ (ε, δ)``; δ > 0 only.
    **Cost.** O(T·n²) pair evaluations, T ≤ n.

    Parameters
    ----------
    alpha
        Optional regulariser (0 = general convex, as the paper).
    n_iter
        T; default ``max(1, min(n, ⌊n²ε²/(p ln(1/δ))⌋))``.
    eta
        Step size; default ``diam(C)/(G√T)``. Privacy does not depend on η.
    conversion
        zCDP → (ε, δ) of the ledger: ``"tight"`` (default) or ``"paper"``.

    Other parameters are those of :class:`DPGDSC`.

    Examples
    --------
    >>> import numpy as np
    >>> from stream_dp.offline import DPGDC2
    >>> rng = np.random.default_rng(0)
    >>> X, y = rng.normal(size=(40, 3)), rng.integers(0, 2, 40)
    >>> model = DPGDC2(task="auc", epsilon=1.0, delta=1e-3).fit(X, y)
    >>> len(model.accountant.ledger) == model.n_iter_, model.sigma_raised_
    (True, False)
    >>> model.accountant.spent()[0] <= 1.0
    True

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
        model_id: str = "dpgdc2",
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

    def _plan(self, X, Y):
        loss, constraint, c, w0 = self._setup(X)
        n, p = len(Y), int(w0.size)
        if self.n_iter is not None:
            T = int(self.n_iter)
        else:
            T = max(1, min(n, math.floor(n**2 * self.epsilon**2 / (p * math.log(1 / self.delta)))))
        eta = constraint.diameter / (c.lipschitz * math.sqrt(T)) if self.eta is None else self.eta
        sens = pairwise_gradient_sensitivity(c.lipschitz, n)
        sigma = dpgdc2_sigma(c.lipschitz, T, n, self.epsilon, self.delta)
        self.eta_, self.n_iter_, self.sensitivity_ = float(eta), T, sens
        return loss, constraint, w0, T, float(eta), sens, sigma

    def _query(self, w: np.ndarray, X: np.ndarray, Y: np.ndarray) -> np.ndarray:
        """The quantity each iteration privatises: the full pairwise gradient at w."""
        return self._loss().all_pairs_gradient(w, X, Y)

    def _fit_private(self, X, Y):
        noise = self._make_noise()
        loss, constraint, w0, T, eta, sens, sigma = self._plan(X, Y)
        sigma, raised = calibrate_iterations(self.budget_, sens, sigma, T)
        self.sigma_raised_ = raised
        if raised:
            warnings.warn(
                f"DPGDC2: the paper's σ does not fit the (ε={self.epsilon}, δ={self.delta}) "
                f"budget under the {self.conversion!r} zCDP conversion for T = {T}; σ is raised "
                f"to {sigma:.4g}",
                RuntimeWarning,
                stacklevel=3,
            )
        self.noise_scale_ = sigma
        trace = [] if getattr(self, "_keep_trace", False) else None

        def gradient_noise(t, w):
            if trace is not None:
                trace.append(w.copy())  # the iterate whose gradient is released (audits)
            self._charge(GaussianEvent(step=t, sensitivity=sens, sigma=sigma))
            return noise.gaussian(t, w.shape, sigma, purpose="gradient")

        out = pgd(loss, constraint, X, Y, w0, eta, T, "with_start", gradient_noise)
        self.trace_ = trace
        return constraint.project(out)

    def _statistic(self, X, Y, noise):
        loss, constraint, w0, T, eta, sens, sigma = self._plan(X, Y)
        return pgd(loss, constraint, X, Y, w0, eta, T, "with_start"), sens, constraint


class DPEGD(PGDBase):
    """DP epoch gradient descent, general convex (Xue et al., IJCAI 2021, Algorithm 3).

    The records (in a keyed random order) are split into ``k = ⌊log₂ n⌋`` disjoint parts,
    ``n_i = ⌊n/2^i⌋`` for i < k and the rest in part k. Epoch i runs n_i PGD steps with
    ``η_i = 4^{−i}η`` on ``L(·; D_i)`` from ``w_{i−1}``, averages ``(w_0+…+w_{n_i})/(n_i+1)``
    (Lemma 9) and adds noise:

    * δ > 0: ``σ_i = 4√(2 ln(1.25/δ)) G η_i/ε`` (Alg. 3 step 5);
    * δ = 0: Laplace ``λ_i = 4Gη_i√p/ε`` (step 6), p = number of coordinates;

    with ``η = (diam(C)/G)·min(4/√n, ε/√(p ln(1/δ)))`` (δ = 0: ``min(4/√n, ε/p)``), Theorem 3,
    capped at ``2/L`` (needed by Lemma 7). Returns ``w_k``. Each epoch's noisy output is
    projected onto C before the next epoch starts (post-processing).

    **Guarantee.** Epoch i's average has ℓ2 sensitivity ``4Gη_i`` (Lemma 7 with T = n_i) and
    only sees part i; a record lives in one part, so by parallel composition the whole run is
    (ε, δ)- / ε-DP (proof of Theorem 3). The ledger holds **one** event for the run (step k,
    with the last epoch's sensitivity and σ — every epoch has the same ε); the per-epoch
    calibration is in ``epochs_``.

    **Cost.** ``Σ_i n_i·n_i²`` pair evaluations ≈ n³/8·(1/(1 − 1/8)), dominated by epoch 1.

    Parameters
    ----------
    alpha
        Optional regulariser (0 = general convex).
    eta
        Base step size η; default as above.

    Other parameters are those of :class:`DPGDSC` (there is no ``n_iter``: epoch i runs n_i
    steps).

    Examples
    --------
    >>> import numpy as np
    >>> from stream_dp.offline import DPEGD
    >>> rng = np.random.default_rng(0)
    >>> X, y = rng.normal(size=(64, 3)), rng.integers(0, 2, 64)
    >>> model = DPEGD(task="auc", epsilon=1.0, delta=1e-3).fit(X, y)
    >>> [e["n"] for e in model.epochs_]
    [32, 16, 8, 4, 2, 2]
    >>> model.accountant.spent()
    (1.0, 0.001)

    """

    n_iter = None

    def __init__(
        self,
        task: str = "auc",
        epsilon: float = 1.0,
        delta: float = 1e-5,
        alpha: float = 0.0,
        eta: float | None = None,
        data_radius: float = 1.0,
        model_radius: float = 1.0,
        seed: int | None = None,
        reproducible: bool = False,
        model_id: str = "dpegd",
    ) -> None:
        self.task = task
        self.epsilon = epsilon
        self.delta = delta
        self.alpha = alpha
        self.eta = eta
        self.data_radius = data_radius
        self.model_radius = model_radius
        self.seed = seed
        self.reproducible = reproducible
        self.model_id = model_id

    def _partition(self, n: int, noise: KeyedNoise) -> list[np.ndarray]:
        """Disjoint parts D_1..D_k of a keyed (data-independent) permutation of 0..n−1."""
        k = max(1, int(math.floor(math.log2(n))))
        order = noise.generator(0, "sampling").permutation(n)
        parts, start = [], 0
        for i in range(1, k):
            size = n // 2**i
            parts.append(order[start : start + size])
            start += size
        parts.append(order[start:])
        return parts

    def _base_eta(self, c, constraint, n: int, p: int) -> float:
        if self.eta is not None:
            eta = float(self.eta)
        elif self.pure:
            eta = constraint.diameter / c.lipschitz * min(4 / math.sqrt(n), self.epsilon / p)
        else:
            eta = (
                constraint.diameter
                / c.lipschitz
                * min(4 / math.sqrt(n), self.epsilon / math.sqrt(p * math.log(1 / self.delta)))
            )
        return min(eta, 2.0 / c.smoothness)

    def _epoch_average(self, loss, constraint, X, Y, w_start, eta_i):
        """Epoch i of Alg. 3 step 4: n_i PGD steps from w_{i−1}, averaged with the start."""
        return pgd(loss, constraint, X, Y, w_start, eta_i, len(Y), average="with_start")

    def _run(self, X, Y, noise, add_noise: bool):
        loss, constraint, c, w = self._setup(X)
        n = len(Y)
        parts = self._partition(n, noise)
        eta = self._base_eta(c, constraint, n, int(w.size))
        self.eta_ = eta
        epochs = []
        for i, part in enumerate(parts, start=1):
            eta_i = 4.0**-i * eta
            avg = self._epoch_average(loss, constraint, X[part], Y[part], w, eta_i)
            sens = dpegd_sensitivity(c.lipschitz, eta_i)
            epochs.append({"epoch": i, "n": len(part), "eta": eta_i, "sensitivity": sens,
                           "start": w.copy(), "average": avg.copy()})  # fmt: skip
            if add_noise:
                noisy, event = self._output_noise(avg, sens, noise, step=i)
                epochs[-1]["scale"] = self.noise_scale_
                epochs[-1]["event"] = event
                w = constraint.project(noisy)
            else:
                w = avg
        if add_noise and epochs[-1]["event"] is not None:
            # Parallel composition: every epoch has the same (ε, δ) on a disjoint part, so the
            # run costs one epoch's guarantee; the ledger records it once (the last epoch).
            self._charge(epochs[-1]["event"])
        return w, epochs, constraint

    def _fit_private(self, X, Y):
        noise = self._make_noise()
        w, epochs, constraint = self._run(X, Y, noise, add_noise=True)
        self.epochs_ = [{k: v for k, v in e.items() if k not in ("start", "average", "event")}
                        for e in epochs]  # fmt: skip
        self._epoch_trace = epochs
        self.sensitivity_ = epochs[-1]["sensitivity"]
        return w

    def _statistic(self, X, Y, noise):
        w, epochs, constraint = self._run(X, Y, noise, add_noise=False)
        return w, epochs[-1]["sensitivity"], constraint
