"""A diagonal metric from privately released class statistics (Fisher scores of the features).

Each record ``z = (x, y)`` (x clipped to ``‖x‖ ≤ R``, y binary) contributes the vector

    v(z) = (λ·e_y, e_y ⊗ x, e_y ⊗ (x∘x))            (size 2·(1 + 2d))

— a weighted count, the class sum and the class sum of squares, in the block of its class.
The prefix sums ``Σ_{s≤t} v(z_s)`` are released at every step by the matrix-factorization
Gaussian mechanism OnPairMF streams its gradients with (:class:`~stream_dp.privacy.mf.
MFMechanism`, BLT by default): each record enters one step only, so its influence pattern is
the single entry ``[Δ_v]`` (:func:`class_statistics_sensitivity`), and the whole stream is one
Gaussian mechanism charged once, before the first noisy sum exists. The metric
``W = diag(w)`` is post-processing of the latest released sums
(:func:`fisher_weights`); derivation in ``docs/privacy.md`` (*Class statistics for a
metric*).
"""

from __future__ import annotations

import math
import warnings
from collections.abc import Hashable
from statistics import NormalDist

import numpy as np
from river import compose

from stream_dp.online.composition import LEARNED_METRIC, PRIVATE_LEARNER, checked
from stream_dp.online.correlated import CorrelatedNoiseMechanism, check_budget_params
from stream_dp.online.inputs import RecordInput
from stream_dp.online.interfaces import MetricInterface
from stream_dp.online.params import river_check_params
from stream_dp.privacy.budget import PrivacyBudget, zcdp_budget
from stream_dp.privacy.mf import MFMechanism, make_factorization
from stream_dp.privacy.noise import KeyedNoise
from stream_dp.privacy.secrets import check_seed

__all__ = [
    "FAMILY_ERROR",
    "FLOOR_SHARE",
    "FisherMetric",
    "SCORE_POWER",
    "class_statistics_sensitivity",
    "count_weight",
    "fisher_weights",
    "noise_threshold",
    "released_class_moments",
    "shrunk_variance",
]

#: Records are clipped to ‖x‖ ≤ R = ½ by default (as OnPairMF's AUC task): the sensitivity
#: ``√(4R² + 2R⁴)`` falls faster than the class statistics of records scaled to ‖x‖ ≲ 1.
DEFAULT_DATA_RADIUS = 0.5
#: The family-wise error of the noise threshold: when no feature's class means differ, the
#: released metric gives any feature extra weight with probability at most this (Bonferroni
#: over the d features: :func:`noise_threshold`). The conventional 5 %, not a fitted value.
FAMILY_ERROR = 0.05
#: The Fisher score ``(squared mean difference / within-class variance)`` enters the weight to
#: this power (½: a square root, which spreads the weight over the features that pass). Part
#: of the non-private rule, as is :data:`FLOOR_SHARE`.
SCORE_POWER = 0.5
#: The within-class variance is floored at ``FLOOR_SHARE · R²/d`` (a tenth of the variance per
#: feature of a record spread evenly on the sphere ‖x‖ = R), so that a near-constant feature
#: cannot take all the weight.
FLOOR_SHARE = 0.1
#: The layout of :meth:`FisherMetric.state_dict`; checkpoints of another layout are refused.
STATE_FORMAT = 1
#: The factorizations the class statistics stream with (their prefix-noise variance is
#: ``factorization.max_error(t)``).
NOISES = ("blt", "independent")


def count_weight(data_radius: float) -> float:
    """λ, the weight of the count coordinate: ``λ = R``.

    The largest count weight that does not raise the sensitivity: for records of different
    classes ``‖v(z) − v(z′)‖² ≤ 2(λ² + R² + R⁴)``, for the same class ``≤ 4R² + 2R⁴``
    (:func:`class_statistics_sensitivity`); the two are equal at ``λ = R``, so the counts get
    the most weight — the least relative noise — for free.

    Examples
    --------
    >>> count_weight(0.5)
    0.5

    """
    return float(data_radius)


def class_statistics_sensitivity(data_radius: float) -> float:
    """``Δ_v = √(4R² + 2R⁴)``: the replace-one ℓ2 sensitivity of one record's ``v(z)``.

    Replace ``z = (x, y)`` by ``z′ = (x′, y′)``, both clipped to radius R.

    * **Different classes** touch disjoint blocks, so the squared difference is the sum of the
      squared norms: ``‖v(z)‖² = λ² + ‖x‖² + ‖x∘x‖² ≤ λ² + R² + R⁴``, because
      ``‖x∘x‖² = Σ x_k⁴ ≤ (Σ x_k²)² = ‖x‖⁴``. With ``λ = R`` (:func:`count_weight`) the
      difference is at most ``4R² + 2R⁴``, attained by ``x = R·e₁``, ``x′ = R·e₂``.
    * **The same class**: the counts cancel; ``‖x − x′‖² ≤ 4R²`` and, with ``a = x∘x``,
      ``b = x′∘x′`` non-negative, ``‖a − b‖² = ‖a‖² + ‖b‖² − 2aᵀb ≤ 2R⁴``. So at most
      ``4R² + 2R⁴`` again (a bound, not attained: ``x′ = −x`` gives ``4R²``, orthogonal axes
      ``2R² + 2R⁴``).

    One record enters one step, so this is the whole influence pattern ``[Δ_v]``.

    Examples
    --------
    >>> round(class_statistics_sensitivity(0.5) ** 2, 12)
    1.125

    """
    R = float(data_radius)
    return math.sqrt(4.0 * R * R + 2.0 * R**4)


def statistics_vector(X: np.ndarray, positive: np.ndarray, data_radius: float) -> np.ndarray:
    """``v(z)`` of each row of X (already clipped to R): shape ``(m, 2(1 + 2d))``, the negative
    class's block first."""
    m, d = X.shape
    V = np.zeros((m, 2 * (1 + 2 * d)))
    off = np.where(positive, 1 + 2 * d, 0)
    rows = np.arange(m)
    V[rows, off] = count_weight(data_radius)
    cols = off[:, None] + 1 + np.arange(d)[None, :]
    V[rows[:, None], cols] = X
    V[rows[:, None], cols + d] = X * X
    return V


def released_class_moments(
    sums: np.ndarray, dim: int, data_radius: float, noise_std: float
) -> tuple[np.ndarray, np.ndarray, float, float]:
    """From released sums: the mean difference ``D = μ̂₊ − μ̂₋``, the pooled within-class
    variance (bias-corrected for the noise in ``μ̂_c²``), and the noise variances ``τ²`` of each
    ``D_k`` and ``ν²`` of each pooled variance — post-processing of the sums and the public σ_N.

    A class's noisy count ``n̂_c = max(Y_c⁰/λ, 1)``; its mean ``μ̂_c = Y_c¹/n̂_c`` carries noise
    of variance ``σ_N²/n̂_c²`` per coordinate, independent across coordinates and classes, so

        τ² = σ_N²·(1/n̂₊² + 1/n̂₋²),      ν² = 2σ_N²/(n̂₊ + n̂₋)²

    (ν²: the noise of ``(Y₊² + Y₋²)/(n̂₊ + n̂₋)``, the leading term of the pooled variance;
    ``E[μ̂_c²] = μ_c² + σ_N²/n̂_c²`` is added back so the pooled variance is unbiased).

    Examples
    --------
    >>> s = statistics_vector(np.array([[0.4, 0.0], [-0.4, 0.1]]), np.array([True, False]), 0.5)
    >>> D, pooled, tau2, nu2 = released_class_moments(s.sum(0), 2, 0.5, 0.0)
    >>> D.tolist(), pooled.tolist(), tau2, nu2  # one record per class: no within-class spread
    ([0.8, -0.1], [0.0, 0.0], 0.0, 0.0)

    """
    d, lam = int(dim), count_weight(data_radius)
    mus, sq, cnt = [], [], []
    for c in (0, 1):
        off = c * (1 + 2 * d)
        n = max(float(sums[off]) / lam, 1.0)
        mus.append(sums[off + 1 : off + 1 + d] / n)
        sq.append(sums[off + 1 + d : off + 1 + 2 * d])
        cnt.append(n)
    n = cnt[0] + cnt[1]
    s2 = noise_std**2
    pooled = (sq[0] + sq[1] - cnt[0] * mus[0] ** 2 - cnt[1] * mus[1] ** 2) / n
    pooled = pooled + s2 * (1.0 / cnt[0] + 1.0 / cnt[1]) / n
    tau2 = s2 * (1.0 / cnt[0] ** 2 + 1.0 / cnt[1] ** 2)
    nu2 = 2.0 * s2 / n**2
    return mus[1] - mus[0], pooled, tau2, nu2


def shrunk_variance(pooled: np.ndarray, nu2: float) -> np.ndarray:
    """Each feature's pooled variance shrunk toward their mean by its noise (James–Stein for
    normal means with a known noise variance ν²; Efron & Morris, JASA 1973): with
    ``m = mean_k p̂_k`` and the between-feature spread ``A = max(0, var_k p̂_k − ν²)``,

        s̃²_k = max(0, m + A/(A + ν²)·(p̂_k − m))

    Without noise (ν² = 0) this is ``p̂_k`` itself; when the noise dominates the spread, every
    feature gets the common variance m.

    Examples
    --------
    >>> p = np.array([0.0, 0.01, 0.02])
    >>> shrunk_variance(p, 0.0).tolist(), shrunk_variance(p, 1.0).round(6).tolist()
    ([0.0, 0.01, 0.02], [0.01, 0.01, 0.01])

    """
    if nu2 <= 0.0:
        return np.maximum(pooled, 0.0)
    m = float(pooled.mean())
    spread = max(0.0, float(pooled.var()) - nu2)
    return np.maximum(m + spread / (spread + nu2) * (pooled - m), 0.0)


def noise_threshold(dim: int, family_error: float = FAMILY_ERROR) -> float:
    """``c_d²``: the squared z-level that none of d independent N(0, 1) exceeds in absolute
    value with probability at least ``1 − family_error`` (Bonferroni: ``c_d = Φ⁻¹(1 − α/(2d))``).

    Examples
    --------
    >>> round(noise_threshold(1), 3), round(noise_threshold(30), 2), round(noise_threshold(50), 2)
    (3.841, 9.88, 10.83)

    """
    d = max(int(dim), 1)
    return NormalDist().inv_cdf(1.0 - family_error / (2.0 * d)) ** 2


def fisher_weights(sums: np.ndarray, dim: int, data_radius: float, noise_std: float) -> np.ndarray:
    """The metric's weights from released class statistics: post-processing only.

    From the (noisy) sums (:func:`released_class_moments`): the class-mean differences
    ``D_k``, whose privacy noise is N(0, τ²) with τ² known from the public σ_N and the released
    counts, the same for every feature and independent across features, and the within-class
    variances shrunk by their own noise (:func:`shrunk_variance`). Then

        e_k = max(0, D_k² − c_d²·τ²)                       (c_d: :func:`noise_threshold`)
        f_k = (e_k / (s̃²_k + 0.1·R²/d))^{1/2}
        w_k = 1 + d·f_k / Σ_j f_j                          (w = 1 when every f_k = 0)

    * ``c_d·τ`` is the level that the noise of none of the d differences exceeds with
      probability ``1 − α`` (α = :data:`FAMILY_ERROR`): if no feature separates the classes,
      the released metric is Euclidean distance with probability ≥ 95 % whatever d, ε or n.
      A feature that passes keeps its squared difference less the threshold (continuous in the
      release: a feature just above it gets almost no weight).
    * Without noise (``noise_std = 0``): τ = 0 and ``s̃² = s²``, the non-private rule
      ``w_k = 1 + d·f_k/Σf`` — half Euclidean, half the Fisher scores' square roots (Fisher,
      1936), with the variance floored at a tenth of the per-feature variance of records spread
      evenly on ``‖x‖ = R`` so that a near-constant feature cannot take all the weight.

    Examples
    --------
    >>> s = statistics_vector(np.array([[0.4, 0.0], [-0.4, 0.1]]), np.array([True, False]), 0.5)
    >>> fisher_weights(s.sum(0), 2, 0.5, 0.0).round(3).tolist()  # only feature 0 separates
    [2.778, 1.222]
    >>> fisher_weights(np.zeros(10), 2, 0.5, 1.0).tolist()  # nothing learned: Euclidean
    [1.0, 1.0]

    """
    d = int(dim)
    diff, pooled, tau2, nu2 = released_class_moments(sums, d, data_radius, noise_std)
    excess = np.maximum(diff * diff - noise_threshold(d) * tau2, 0.0)
    floor = FLOOR_SHARE * float(data_radius) ** 2 / d
    f = (excess / (shrunk_variance(pooled, nu2) + floor)) ** SCORE_POWER
    total = float(f.sum())
    return np.ones(d) if total <= 0.0 else 1.0 + d * f / total


class FisherMetric(MetricInterface):
    """A private diagonal metric weighting each feature by its class separation (binary labels).

    Per record, the class count, class sum and class sum of squares ``v(z) = (λ·e_y, e_y ⊗ x,
    e_y ⊗ (x∘x))`` (x clipped to ``‖x‖ ≤ R``, ``λ = R``: :func:`count_weight`). Their prefix
    sums are released at every step with correlated Gaussian noise — the matrix mechanism of
    Denisov et al. (NeurIPS 2022, Thm. 2.1) with a BLT factorization (Dvijotham et al., 2024),
    the mechanism of :class:`~stream_dp.online.OnPairMF` — one Gaussian mechanism for the whole
    stream, with ``Δ = ‖C·e_i‖·Δ_v`` (each record enters one step, so its influence pattern is
    ``[Δ_v]``; ``Δ_v = √(4R² + 2R⁴)``: :func:`class_statistics_sensitivity`), charged to the
    ledger once, before the first noisy sum exists. The metric ``W = diag(w)`` is
    post-processing of the latest released sums: the per-feature Fisher score (squared
    difference of the class means over the pooled within-class variance; Fisher, 1936), counted
    only above the noise's 95 % family-wise level and with the variances shrunk by their own
    noise, to the power ½, as a share of the weights added to Euclidean distance
    (:func:`fisher_weights`). Nothing un-noised is ever kept:
    the learner holds the released sums only. Derivation: ``docs/privacy.md``, *Class
    statistics for a metric*.

    The noise side of the rule has no fitted constant: the threshold is the Bonferroni level
    of the released noise (:func:`noise_threshold`, α = :data:`FAMILY_ERROR`), the variance
    shrinkage is James–Stein's; the power ½ and the floor 0.1·R²/d belong to the non-private
    rule (``epsilon=None``: σ = 0, nothing is subtracted or shrunk). Measured on breast cancer
    and Pima with 20 irrelevant features (``benchmarks/metric_irrelevant.py``,
    ``docs/performance.md``).

    Parameters
    ----------
    epsilon, delta
        The (ε, δ) budget of the whole stream; ``epsilon=None`` runs without noise (not
        private; a reference).
    horizon
        Stream length n: the mechanism covers n steps, after which the learner stops and keeps
        its last release. ``None`` (BLT only) covers an unbounded stream for the same charge.
    features
        The declared schema (required): feature names, or their number d for array input.
    data_radius
        R: every x is clipped to ``‖x‖ ≤ R`` (part of the privacy proof).
    pos_val
        The positive class: a record is positive when ``y == pos_val``, negative otherwise
        (river's convention for binary metrics). Labels must be hashable and not None/NaN.
    noise
        ``"blt"`` (default) or ``"independent"`` (fresh noise per step: a baseline).
    conversion
        ρ → (ε, δ): ``"exact"`` (default: the one charge is Gaussian, so the exact μ-GDP curve
        is reported and calibrated on), ``"tight"`` or ``"paper"``.
    seed, reproducible
        ``seed=None`` (default) draws the noise secret from the OS; an int seed is refused
        unless ``reproducible=True``, which declares the run non-private.
    model_id
        Identifies the model; also keys the noise.

    Examples
    --------
    >>> import numpy as np
    >>> from stream_dp.online import FisherMetric
    >>> rng = np.random.default_rng(0)
    >>> y = rng.random(2000) < 0.5
    >>> X = np.column_stack([np.where(y, 0.2, -0.2), rng.normal(size=(2000, 3)) * 0.2])
    >>> X += rng.normal(size=X.shape) * 0.05
    >>> metric = FisherMetric(epsilon=4.0, horizon=2000, features=("s", "n1", "n2", "n3"))
    >>> metric.learn_many(X, y)
    >>> w = metric.private_weights
    >>> bool(w[0] > w[1:].max()), metric.accountant.spent()[0] <= 4.0
    (True, True)
    >>> z = metric.transform_one({"s": 0.1, "n1": 0.1})  # x scaled by √w
    >>> round(z["s"] / z["n1"], 6) == round(float(np.sqrt(w[0] / w[1])), 6)
    True

    """

    def __init__(
        self,
        epsilon: float | None = 1.0,
        delta: float = 1e-5,
        horizon: int | None = None,
        features: tuple | int | None = None,
        data_radius: float = DEFAULT_DATA_RADIUS,
        pos_val: Hashable = True,
        noise: str = "blt",
        conversion: str = "exact",
        seed: int | None = None,
        reproducible: bool = False,
        model_id: str = "fisher-metric",
    ) -> None:
        self.epsilon = epsilon
        self.delta = delta
        self.horizon = horizon
        self.features = features
        self.data_radius = data_radius
        self.pos_val = pos_val
        self.noise = noise
        self.conversion = conversion
        self.seed = seed
        self.reproducible = reproducible
        self.model_id = model_id
        _check_params(self)
        check_seed(seed, reproducible, type(self).__name__)
        if features is None:
            raise ValueError(
                "FisherMetric needs a declared schema: pass features=[...] (the feature names, "
                "or their number d for array input); its size must not depend on the data"
            )
        R = float(data_radius)
        self._input = RecordInput("metric", features, R, warn_clipping=False)
        d = self._input.schema.dim
        size = 2 * (1 + 2 * d)
        n = None if horizon is None else int(horizon)
        budget = None
        rho = None
        if epsilon is not None:
            budget = zcdp_budget(epsilon, delta, conversion)
            budget.accountant.private = seed is None
            rho = budget.limit
        mf = MFMechanism(
            make_factorization(noise, n), [class_statistics_sensitivity(R)], n, rho, size
        )
        self._mechanism = CorrelatedNoiseMechanism(mf, budget, averaging=None, horizon=n)
        self._noise = KeyedNoise(seed, model_id)
        self._bound = False
        #: The released prefix sums of v(z) at step :attr:`step` (noisy: all that is kept).
        self._sums = np.zeros(size)
        self._t = 0
        self._exhausted = False
        self._weights: tuple[int, np.ndarray] | None = None
        self.n_rejected = 0

    # -- river ------------------------------------------------------------------------------------
    def _more_tags(self) -> set[str]:
        return {LEARNED_METRIC, PRIVATE_LEARNER}

    def __or__(self, other) -> compose.Pipeline:
        """River's ``metric | other``, checked (a kNN after it is refused: use
        :class:`~stream_dp.online.PrivateMetricKNN`)."""
        return checked(super().__or__(other))

    @classmethod
    def _unit_test_params(cls):
        features = river_check_params("metric")["features"]  # river feeds it TrumpApproval
        yield {"epsilon": 4.0, "horizon": 10_000, "features": features, "seed": 42,
               "reproducible": True}  # fmt: skip

    # -- what it is and what it costs -------------------------------------------------------------
    @property
    def mf(self) -> MFMechanism:
        """Δ, σ and the factorization of the stream's one Gaussian mechanism."""
        return self._mechanism.mf

    @property
    def budget(self) -> PrivacyBudget | None:
        """The zCDP budget the one charge goes to (None without noise)."""
        return self._mechanism.budget

    @property
    def accountant(self):
        """The ledger of the charge and the (ε, δ) spent: ``accountant.spent()``."""
        budget = self.budget
        return None if budget is None else budget.accountant

    @property
    def private(self) -> bool:
        """False without noise or with a guessable (integer) seed."""
        return self.mf.private and self.seed is None

    @property
    def step(self) -> int:
        """Records learned so far (the step of the latest release)."""
        return self._t

    @property
    def exhausted(self) -> bool:
        """True once the horizon is reached or the budget refused the charge."""
        return self._exhausted

    @property
    def release_vector(self) -> np.ndarray:
        """The latest released sums of ``v(z)`` (noisy; public)."""
        return self._sums.copy()

    @property
    def noise_std(self) -> float:
        """The public per-coordinate std of the released sums' noise at the current step."""
        return self.mf.prefix_noise_std(self._t) if self.mf.private and self._t else 0.0

    @property
    def private_weights(self) -> np.ndarray:
        """The released metric's weights ``w`` (a copy): ones before the first record."""
        return self._served_weights().copy()

    def describe(self) -> str:
        """The mechanism, its cost and the constants — before any data."""
        mf = self.mf
        flag = "" if self.private else "NOT PRIVATE: "
        cover = f"horizon n={self.horizon}" if self.horizon is not None else "unbounded stream"
        noise = (
            f"correlated Gaussian noise on the class statistics ({mf.factorization.name}): "
            f"Δ={mf.sensitivity:.4g}, σ={mf.sigma:.4g}, one charge ρ={mf.charged_rho:.4g} for "
            "the whole stream"
            if mf.private
            else "no noise"
        )
        return (
            f"{flag}{noise}; {cover}; class statistics of x clipped to "
            f"R={float(self.data_radius):g}, Δ_v={mf.pattern[0]:.4g}, "
            f"λ={count_weight(self.data_radius):g}; "
            f"weights: Fisher scores of the differences above the noise's "
            f"{100 * (1 - FAMILY_ERROR):g} % family-wise level, power {SCORE_POWER:g}, floor "
            f"{FLOOR_SHARE:g}·R²/d; releases: every step, free"
        )

    # -- learning -------------------------------------------------------------------------------
    def learn_one(self, x, y, **kwargs) -> None:
        """Add one record to the released sums.

        Raises :class:`stream_dp.records.InvalidRecord` (a ``ValueError``) for a record that must
        not be learned from; nothing is then learned or charged.
        """
        xv, _ = self._input.validate(x, y)
        if not self._may_learn():
            self.n_rejected += 1
            return
        self._add(xv[None, :], np.array([y == self.pos_val], dtype=bool))
        self._input.accept(y)

    def learn_many(self, X, y) -> None:
        """:meth:`learn_one` on each row of a 2-D array or DataFrame, in order, with the same
        released sums; an invalid row raises after the rows before it were learned."""
        labels = list(y)
        m = len(labels)
        if len(X) != m:
            raise ValueError(f"X has {len(X)} rows but y has {m} labels")
        inp = self._input
        batch = inp.validate_batch(X, labels) if m else None
        if batch is None:
            for i in range(m):
                self.learn_one(inp.row(X, i), labels[i])
            return
        rows, _, clipped = batch
        k = len(rows)
        positive = np.array([labels[i] == self.pos_val for i in range(k)], dtype=bool)
        i = 0
        while i < k and self._may_learn():
            j = k
            if self.horizon is not None:
                j = min(j, i + int(self.horizon) - self._t)
            if self.mf.private:
                j = min(j, i + self._mechanism.ensure_block(self._t + 1))
            self._add(rows[i:j], positive[i:j])
            inp.accept_batch(clipped[i:j], labels[i:j])
            i = j
        self.n_rejected += k - i
        if k < m:
            self.learn_one(inp.row(X, k), labels[k])  # raises as learn_one does
            self.learn_many(inp.rest(X, k + 1), labels[k + 1 :])

    def _may_learn(self) -> bool:
        mech = self._mechanism
        if self._exhausted:
            return False
        if not self._bound:
            mech.bind(self._noise, self._sums.shape)
            self._bound = True
        if not mech.can_step(self._t + 1):  # charges the ledger before the first noisy sum
            self._exhausted = True
            warnings.warn(
                f"FisherMetric is exhausted at step {self._t + 1} ({mech.exhausted_why}); it "
                f"keeps serving its release of step {self._t} and learns nothing more",
                RuntimeWarning,
                stacklevel=3,
            )
            return False
        return True

    def _add(self, X: np.ndarray, positive: np.ndarray) -> None:
        """Steps t+1 … t+m: the rows' ``v(z)`` plus the steps' noise rows ``σ·(M·Z)_t``, summed in
        step order (the same bits one record or many at a time)."""
        V = statistics_vector(X, positive, self.data_radius)
        mech, t0, m = self._mechanism, self._t, len(X)
        if mech.private:
            if mech.ensure_block(t0 + 1) < m:  # the caller keeps runs inside one noise block
                raise RuntimeError(f"{m} steps from step {t0 + 1} cross a block of noise rows")
            first = t0 + 1 - mech.block_first
            V += mech.block[first : first + m]
        self._sums = np.add.accumulate(np.vstack([self._sums[None, :], V]), axis=0)[-1]
        self._t = t0 + m
        mech.ran(self._t)

    # -- serving: released sums only ---------------------------------------------------------------
    def _served_weights(self) -> np.ndarray:
        cached = self._weights
        if cached is None or cached[0] != self._t:
            d = self._input.schema.dim
            w = fisher_weights(self._sums, d, float(self.data_radius), self.noise_std)
            w.flags.writeable = False
            cached = self._weights = (self._t, w)
        return cached[1]

    def _served_version(self) -> tuple:
        return (self._t,)

    def _model_input(self, x) -> np.ndarray | None:
        return self._input.model_input(x)

    @property
    def _schema(self):
        return self._input.schema

    # -- checkpoints ------------------------------------------------------------------------------
    def state_dict(self) -> dict:
        """Everything needed to resume exactly: the released sums, the step, the noise secret
        and recurrence state, the ledger. It holds the secret: store it like the data."""
        mechanism = self._mechanism.state_dict() if self._bound else None
        return {
            "format": STATE_FORMAT,
            "class": type(self).__name__,
            "params": self._get_params(),
            "t": self._t,
            "sums": self._sums.tolist(),
            "input": self._input.state_dict(),
            "secret": self._noise.secret,
            "mechanism": mechanism,
            "exhausted": self._exhausted,
            "n_rejected": self.n_rejected,
        }

    def load_state_dict(self, state: dict) -> None:
        """Resume from :meth:`state_dict` (of a learner with the same parameters): the next
        record is learned with the noise row and the ledger it would have had."""
        if state.get("format") != STATE_FORMAT or state.get("class") != type(self).__name__:
            raise ValueError(f"not a {type(self).__name__} state of this layout")
        if state["params"] != self._get_params():
            raise ValueError("the checkpoint's parameters are not this learner's")
        self._input.load_state_dict(state["input"])
        self._noise = KeyedNoise(int(state["secret"]), self.model_id)
        self._bound = False
        if state["mechanism"] is not None:
            self._mechanism.bind(self._noise, self._sums.shape)
            self._bound = True
            self._mechanism.load_state_dict(state["mechanism"])
        self._sums = np.asarray(state["sums"], dtype=float)
        self._t = int(state["t"])
        self._exhausted = bool(state["exhausted"])
        self.n_rejected = int(state["n_rejected"])
        self._weights = None


def _check_params(m: FisherMetric) -> None:
    check_budget_params(m.epsilon, m.delta)
    h = m.horizon
    if h is not None and (isinstance(h, bool) or not isinstance(h, int | np.integer) or h < 1):
        raise ValueError(f"horizon must be an int >= 1 or None, got {h!r}")
    if m.noise not in NOISES:
        raise ValueError(f"noise must be one of {NOISES}, got {m.noise!r}")
    if h is None and m.noise != "blt":
        raise ValueError("an unbounded stream (horizon=None) needs noise='blt'")
    R = m.data_radius
    if isinstance(R, bool) or not isinstance(R, int | float) or not 0 < R < math.inf:
        raise ValueError(f"data_radius must be a positive finite number, got {R!r}")
    if m.pos_val is None or not isinstance(m.pos_val, Hashable):
        raise ValueError(f"pos_val must be a hashable label, got {m.pos_val!r}")
