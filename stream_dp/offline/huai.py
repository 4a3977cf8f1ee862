"""OffPairStrC and OffPairC: offline output perturbation of a Pairwise GIGA pass.

Huai, Wang, Miao, Xu, Zhang. *Pairwise Learning with Differential Privacy Guarantees.*
AAAI 2020, Algorithms 3 and 4, Lemma 4, Theorem 5. The pass uses the schedules shared with the
online learners (:mod:`stream_dp.huai`); the sensitivity of its average is here
(``docs/algorithms.md``, *OffPairStrC*).
"""

from __future__ import annotations

import math
import warnings

import numpy as np

from stream_dp.constraints import ConstraintSet
from stream_dp.huai import huai_step_size, huai_warmup
from stream_dp.losses import PairwiseLoss
from stream_dp.offline.base import OfflinePairwiseBase, _positive, _positive_int, make_constraint
from stream_dp.privacy.noise import KeyedNoise
from stream_dp.sensitivity import CertifiedSensitivity

__all__ = ["OffPairStrC", "OffPairC", "giga_average_sensitivity", "offpair_sensitivity"]


def offpair_sensitivity(lipschitz: float, alpha: float, n: int) -> float:
    """ℓ2 sensitivity ``8G ln n/(αn)`` of the averaged GIGA pass (Huai et al. 2020, Alg. 3–4).

    The average ``w̃ = (w_1+…+w_n)/n`` of Pairwise GIGA iterates: by Lemma 4
    ``‖w_t − w'_t‖ ≤ 8G/(αt)`` for t > T1, and the warm-up iterates ``w_1..w_T1`` are the same
    random points on both datasets, so ``‖w̃ − w̃'‖ ≤ (1/n) Σ_{T1<t≤n} 8G/(αt) ≤ 8G ln n/(αn)``
    (T1 ≥ 7). With the classic Gaussian this is exactly Alg. 3 step 9's
    ``σ² = 128G² ln²n · ln(1.25/δ)/(α²n²ε²)`` (Theorem 5).

    Examples
    --------
    >>> round(offpair_sensitivity(4.0, 1.0, 100), 4)
    1.4737

    """
    return 8.0 * lipschitz * math.log(n) / (alpha * n)


def giga_average_sensitivity(
    lipschitz: float, alpha: float, smoothness: float, diameter: float, n: int, warmup: int
) -> float:
    """Certified ℓ2 sensitivity of ``w̃ = (w_1+…+w_n)/n`` for the full-buffer GIGA pass.

    Runs the data-independent recurrence of ``docs/privacy.md`` (*Certified sensitivity*;
    :class:`stream_dp.sensitivity.CertifiedSensitivity`, shared with the online learners) with
    Huai's step sizes: the random
    warm-up iterates ``w_1..w_T1`` are identical on neighbouring datasets (same keyed seed), and
    ``‖w̃ − w̃'‖ ≤ (1/n) Σ_t Δ_t``.

    Examples
    --------
    >>> giga_average_sensitivity(4.0, 1.0, 5.0, 2.0, n=50, warmup=50)  # all random: no data
    0.0

    """
    tracker = CertifiedSensitivity(lipschitz, alpha, smoothness, diameter, shared_members=True)
    total = 0.0
    for t in range(1, n + 1):
        if t <= warmup:
            tracker.skip()  # a random model: the record is only buffered
        else:
            tracker.step(huai_step_size(t, alpha), t - 1)
        tracker.admit(slots=[0], olds=[-1])
        total += tracker.current
    return total / n


class _GIGAOutputPerturbation(OfflinePairwiseBase):
    """Algorithm 3 (shared by OffPairStrC and OffPairC through the loss)."""

    def _check_params(self) -> None:
        _positive_int("warmup", self.warmup)
        if self.sensitivity not in ("paper", "certified"):
            raise ValueError(
                f"sensitivity must be 'paper' or 'certified', got {self.sensitivity!r}"
            )
        if self.sensitivity == "paper" and self.warmup is not None:
            raise ValueError(
                "sensitivity='paper' (Lemma 4, 8G ln n/(αn)) needs the paper's T1; with a custom "
                "warmup use sensitivity='certified'"
            )

    def _loss_for(self, n: int, constraint: ConstraintSet, noise: KeyedNoise) -> PairwiseLoss:
        raise NotImplementedError  # pragma: no cover

    def _statistic(self, X: np.ndarray, Y: np.ndarray, noise: KeyedNoise):
        n = len(Y)
        constraint = make_constraint(self.task, float(self.model_radius))
        loss = self._loss_for(n, constraint, noise)
        c = self._constants(loss)
        alpha = c.strong_convexity
        T1 = huai_warmup(c.smoothness, alpha) if self.warmup is None else int(self.warmup)
        shape = loss.param_shape(X.shape[1])
        # Alg. 3 step 3: w_1..w_T1 drawn in C (keyed, data-independent). Only n of them enter w̃.
        w = np.zeros(shape)
        total = np.zeros(shape)
        for t in range(1, min(T1, n) + 1):
            w = constraint.sample(noise.generator(t, "warmup"), shape)
            total += w
        # Steps 4–7: Pairwise GIGA against all earlier records, Huai's step size.
        for t in range(T1 + 1, n + 1):
            eta = huai_step_size(t, alpha)
            g = loss.gradient(w, X[t - 1], Y[t - 1], X[: t - 1], Y[: t - 1])
            w = constraint.project(w - eta * g)
            total += w
        w_avg = total / n  # step 8
        certified = giga_average_sensitivity(
            c.lipschitz, alpha, c.smoothness, constraint.diameter, n, T1
        )
        if self.sensitivity == "paper":
            # Lemma 4 averaged (the σ of step 9), never below what the recurrence certifies.
            sens = max(offpair_sensitivity(c.lipschitz, alpha, n), certified)
        else:
            sens = certified
        self.T1_ = T1
        self.constants_ = c
        return w_avg, sens, constraint

    def _fit_private(self, X: np.ndarray, Y: np.ndarray) -> np.ndarray:
        noise = self._make_noise()
        stat, sens, constraint = self._statistic(X, Y, noise)
        n = len(Y)
        if self.T1_ >= n:
            warnings.warn(
                f"{type(self).__name__}: the warm-up T1 = {self.T1_} (max(⌈16L/α²⌉, 7), "
                f"L = {self.constants_.smoothness:.4g}, α = {self.constants_.strong_convexity:.4g})"
                f" is ≥ n = {n}: every averaged iterate is a random point of C and nothing is "
                "learned from the data (docs/algorithms.md, OffPairStrC, caveat)",
                RuntimeWarning,
                stacklevel=3,
            )
        self.sensitivity_ = sens
        return self._perturb_output(stat, sens, constraint, noise, step=0)


class OffPairStrC(_GIGAOutputPerturbation):
    """Offline Pairwise Private GIGA, strongly convex (Huai et al., AAAI 2020, Algorithm 3).

    One pass of Pairwise GIGA over the records in the given order: ``w_1..w_T1`` are random
    points of C (``T1 = max(⌈16L/α²⌉, 7)``, :func:`stream_dp.huai.huai_warmup`), then
    ``w_t = Π_C(w_{t−1} − η_t ∇L̂_t(w_{t−1}, D_t))`` with ``η_t = 2(t−1)/(αt(t−2))``
    (:func:`stream_dp.huai.huai_step_size`) on the strongly convex loss ``ℓ + (α/2)‖w‖²``.
    The average ``w̃ = (w_1+…+w_n)/n`` is released as ``Π_C(w̃ + N(0, σ²I))`` with
    ``σ² = 128 G² ln²n · ln(1.25/δ)/(α² n² ε²)`` (Alg. 3 step 9), i.e. the classic Gaussian for
    the ℓ2 sensitivity ``8G ln n/(αn)`` (Lemma 4 averaged over t, :func:`offpair_sensitivity`;
    Theorem 5).

    **Guarantee.** (ε, δ)-DP for replace-one neighbours (Theorem 5); one ``ApproxDPEvent`` in an
    ``ApproxDPAccountant``. ``delta=0`` gives a pure ε-DP variant with Laplace noise
    ``b = √p · 8G ln n/(αnε)`` per coordinate (p = number of model coordinates) — not in Huai
    et al.; it is the δ = 0 baseline of Xue et al. (IJCAI 2021) Tables 2–4. The classic σ is
    raised only where it is not (ε, δ)-DP (large ε; see
    :func:`stream_dp.privacy.mechanisms.gaussian_sigma_classic_safe`).

    **Cost.** O(n²·d) time (O(n²d²) for metric), O(n·d) memory.

    **Caveat** (``docs/algorithms.md``, *Where the project departs from the papers*, 1). T1
    grows like 16L/α²: with the papers' λ = 1e-3 and R = 1, T1 ≈ 6.4·10⁷, so on any realistic
    n every averaged iterate is random (a warning says so) and σ ∝ 1/α is huge. ``warmup``
    overrides T1; the sensitivity is then the certified bound (``docs/privacy.md``, *Certified
    sensitivity*) averaged over the pass (``sensitivity="certified"``), which only needs
    contraction.

    Parameters
    ----------
    task
        ``"auc"`` (logistic ranking loss, L2 ball) or ``"metric"`` (logistic metric loss,
        PSD ∩ Frobenius ball).
    epsilon, delta
        Privacy budget; ``delta=0`` selects the pure ε-DP Laplace variant.
    alpha
        α of the regulariser ``(α/2)‖w‖²`` (the strong convexity); the papers use 1e-3 (AUC)
        and 1e-2 (metric).
    data_radius
        R: rows are clipped to ``‖x‖₂ ≤ R``.
    model_radius
        D: radius of C.
    warmup
        Override T1 (needs ``sensitivity="certified"``).
    sensitivity
        ``"paper"`` (Lemma 4: ``8G ln n/(αn)``, never below the certified bound) or
        ``"certified"`` (the certified recurrence averaged over the pass).
    seed
        Secret of the keyed noise. ``None`` (the default) draws 128 bits from the OS at every
        fit, so refits and clones publish independent noise. An integer is guessable and is
        refused unless ``reproducible=True``.
    reproducible
        Declare a reproducible, **non-private** run (tests, debugging): allows an integer
        ``seed``; the ledger then says ``private = False``.
    model_id
        Keys the noise together with the seed.

    Examples
    --------
    >>> import numpy as np
    >>> from stream_dp.offline import OffPairStrC
    >>> rng = np.random.default_rng(0)
    >>> X, y = rng.normal(size=(60, 3)) / 3, rng.integers(0, 2, 60)
    >>> model = OffPairStrC(task="auc", epsilon=1.0, delta=1e-3, alpha=5.0, data_radius=0.2)
    >>> model = model.fit(X, y)
    >>> model.T1_, model.private_weights.shape
    (7, (3,))
    >>> model.accountant.spent()
    (1.0, 0.001)

    """

    def __init__(
        self,
        task: str = "auc",
        epsilon: float = 1.0,
        delta: float = 1e-5,
        alpha: float = 0.1,
        data_radius: float = 1.0,
        model_radius: float = 1.0,
        warmup: int | None = None,
        sensitivity: str = "paper",
        seed: int | None = None,
        reproducible: bool = False,
        model_id: str = "offpairstrc",
    ) -> None:
        self.task = task
        self.epsilon = epsilon
        self.delta = delta
        self.alpha = alpha
        self.data_radius = data_radius
        self.model_radius = model_radius
        self.warmup = warmup
        self.sensitivity = sensitivity
        self.seed = seed
        self.reproducible = reproducible
        self.model_id = model_id

    def _check_params(self) -> None:
        _positive("alpha", self.alpha)
        super()._check_params()

    def _loss_for(self, n: int, constraint: ConstraintSet, noise: KeyedNoise) -> PairwiseLoss:
        return self._regularized(float(self.alpha))


class OffPairC(_GIGAOutputPerturbation):
    """Offline Pairwise Private GIGA, general convex (Huai et al., AAAI 2020, Algorithm 4).

    Draws ``w₀`` in C (keyed, data-independent: Alg. 4 allows "any point in C") and runs
    :class:`OffPairStrC` (Algorithm 3) on ``ℓ̃ = ℓ + (α/2)‖w − w₀‖²``, whose constants are
    ``G̃ = G + α·diam(C)``, ``L̃ = L + α`` and strong convexity α (Alg. 4 step 4). The release
    is ``Π_C(w̃ + N(0, σ²I))`` with ``σ² = 128 G̃² ln²n · ln(1.25/δ)/(α² n² ε²)``.

    **Guarantee.** (ε, δ)-DP (Theorem 5) with one ``ApproxDPEvent``; ``delta=0``: pure ε-DP
    Laplace variant (Xue et al.'s δ = 0 baseline), ``b = √p · 8G̃ ln n/(αnε)``.

    **Cost.** As OffPairStrC. Default ``α = n^{−1/2}`` (Theorem 5's order ``O(1/√n)``), set at
    fit time; then ``T1 = 16L̃·n`` exceeds n for every n (R = 1), so the output is random
    unless ``warmup`` is set (see OffPairStrC's caveat).

    Parameters
    ----------
    alpha
        Strength of the perturbation regulariser; ``None`` means ``n^{−1/2}``.

    Other parameters are those of :class:`OffPairStrC`.

    Examples
    --------
    >>> import numpy as np
    >>> from stream_dp.offline import OffPairC
    >>> rng = np.random.default_rng(0)
    >>> X, y = rng.normal(size=(40, 3)), rng.integers(0, 3, 40)
    >>> model = OffPairC(task="metric", epsilon=2.0, delta=0.0, warmup=5,
    ...                  sensitivity="certified").fit(X, y)
    >>> model.private_weights.shape, model.accountant.spent()
    ((3, 3), (2.0, 0.0))

    """

    def __init__(
        self,
        task: str = "auc",
        epsilon: float = 1.0,
        delta: float = 1e-5,
        alpha: float | None = None,
        data_radius: float = 1.0,
        model_radius: float = 1.0,
        warmup: int | None = None,
        sensitivity: str = "paper",
        seed: int | None = None,
        reproducible: bool = False,
        model_id: str = "offpairc",
    ) -> None:
        self.task = task
        self.epsilon = epsilon
        self.delta = delta
        self.alpha = alpha
        self.data_radius = data_radius
        self.model_radius = model_radius
        self.warmup = warmup
        self.sensitivity = sensitivity
        self.seed = seed
        self.reproducible = reproducible
        self.model_id = model_id

    def _check_params(self) -> None:
        _positive("alpha", self.alpha, allow_none=True)
        super()._check_params()

    def _loss_for(self, n: int, constraint: ConstraintSet, noise: KeyedNoise) -> PairwiseLoss:
        alpha = float(self.alpha) if self.alpha is not None else 1.0 / math.sqrt(n)
        self.alpha_ = alpha
        shape = self._base_loss().param_shape(self.n_features_in_)
        self.w0_ = constraint.sample(noise.generator(0, "center"), shape)
        return self._regularized(alpha, center=self.w0_, center_radius=constraint.diameter)
