"""OnPairMF: online private pairwise learning with correlated gradient noise."""

from __future__ import annotations

import math

import numpy as np

from stream_dp.buffers import Buffer, FIFOBuffer
from stream_dp.losses import METRICS, get_loss
from stream_dp.online.base import PairwiseLearner
from stream_dp.online.budgeted import BudgetedLearner
from stream_dp.online.correlated import CorrelatedNoiseMechanism, check_budget_params
from stream_dp.online.interfaces import AUCInterface, MetricInterface
from stream_dp.online.params import river_check_params
from stream_dp.online.units import check_unit_params
from stream_dp.operator_metrics import check_shares
from stream_dp.privacy.budget import zcdp_budget
from stream_dp.privacy.influence import pair_term_bounds, window_pattern
from stream_dp.privacy.mf import MECHANISM_NAME, MFMechanism, make_factorization

__all__ = [
    "OnPairMF",
    "OnPairMFAUC",
    "OnPairMFMetric",
    "AUC_DATA_RADIUS",
    "AUC_SLOPE_CAP",
    "NOMINAL_HORIZON",
    "capacity",
    "diagonal_start",
    "radius_rule",
    "step_size_rule",
    "window_rule",
]

#: The streaming factorizations OnPairMF offers (``noise=``); BLT is the default.
NOISES = ("blt", "tree", "independent")
#: The horizon the rules assume for an unbounded stream (``horizon=None``, BLT only).
NOMINAL_HORIZON = 1 << 20
#: R of the AUC task by default: records clipped to ‖x‖ ≤ ½ (``docs/algorithms.md``, *OnPairMF's
#: rules*: the pair terms' bound halves, the typical pair gradient shrinks by less).
AUC_DATA_RADIUS = 0.5
#: κ of the capped logistic AUC loss by default: the pair-term bound ``4R·κ`` no longer grows
#: with the model radius, so D can follow the noise (:func:`radius_rule`).
AUC_SLOPE_CAP = 0.5
#: R·D of the radius rule: at least this (the linear regime) ...
_RULE_FLOOR = 0.125
#: ... growing like z²/this with the capacity z ...
_RULE_SCALE = 200.0
#: ... and at most this, where the logistic loss has long saturated (no noise: z = ∞).
_RULE_CEILING = 5000.0
#: D of the AUC task on an unbounded stream (no horizon: no capacity to read a radius from).
UNBOUNDED_MODEL_RADIUS = 1.0


#: The diagonal metric's accumulated noise at the horizon, as a fraction of D (the AUC rule's ½
#: would move an Euclidean start by half its norm: :func:`diagonal_start`).
DIAGONAL_NOISE_SHARE = 0.25


def diagonal_start(dim: int, model_radius: float) -> np.ndarray:
    """The diagonal metric's first iterate: ``w₀ = (D/√d)·1``, Euclidean distance scaled onto
    the sphere of C (the identity itself at the default ``D = √d``) — so a stream whose noise
    wins serves a small perturbation of Euclidean distance, not a random metric.
    Data-independent.

    Examples
    --------
    >>> diagonal_start(4, 1.0).tolist()
    [0.5, 0.5, 0.5, 0.5]

    """
    return np.full(int(dim), float(model_radius) / math.sqrt(dim))


def capacity(horizon: int, coordinates: int, term_bound: float, prefix_noise_std: float) -> float:
    """``z = n·(T/2) / (σ√E_n·√p)``: what the stream can learn against its noise.

    The norm of a noise-free gradient sum whose every one of the n steps carried half the
    largest pair term T, in units of the norm of the final prefix noise (per-coordinate std
    ``σ√E_n`` over p coordinates). A function of (n, d, ε, δ, the window, the factorization, R
    and κ) only — never of data — and scale-free (σ ∝ T ∝ R). ``inf`` without noise.

    Examples
    --------
    >>> round(capacity(1000, 4, 1.0, 50.0), 3)
    5.0

    """
    if prefix_noise_std <= 0.0:
        return math.inf
    return horizon * (term_bound / 2.0) / (prefix_noise_std * math.sqrt(coordinates))


def radius_rule(z: float, data_radius: float) -> float:
    """The model radius D for capacity z: ``R·D = max(1/8, z²/200)`` (at most 5000).

    Small R·D keeps every pair's gradient near the cap (a noisy averaged pairwise perceptron:
    the direction of the signal, as little as the noise allows); large R·D lets the logistic
    loss refine the direction once the stream's capacity allows it. The constants were fitted
    on the capacity of bank streams cut to 800, 3,000, 10,000 records and whole, and Pima
    (``docs/algorithms.md``, *OnPairMF's rules*), never on a test split.

    Examples
    --------
    >>> radius_rule(2.0, 0.5), radius_rule(100.0, 0.5), radius_rule(math.inf, 0.5)
    (0.25, 100.0, 10000.0)

    """
    return min(max(_RULE_FLOOR, z * z / _RULE_SCALE), _RULE_CEILING) / data_radius


def window_rule(horizon: int | None) -> int:
    """Buffer window (and divisor B) for a horizon: ``min(128, max(16, n // 8))``.

    A record pairs with the ``window`` records before it and after it. The first ``window`` steps
    have fewer partners than the divisor counts, so a window longer than a small fraction of the
    stream wastes signal; beyond ~128 the signal per unit of sensitivity no longer changes (both
    grow like the window), only the cost per step. An unbounded stream gets 128.

    Examples
    --------
    >>> window_rule(537), window_rule(35_169), window_rule(50), window_rule(None)
    (67, 128, 16, 128)

    """
    if horizon is None:
        return 128
    return int(min(128, max(16, int(horizon) // 8)))


def step_size_rule(
    model_radius: float,
    sigma: float,
    prefix_variance: float,
    coordinates: int,
    lipschitz: float,
    horizon: int,
) -> float:
    """``η = D/(2σ·√(p·E_n))``: the final iterate's accumulated noise ≈ D/2 in norm.

    Without projections, ``w_n`` carries ``−η·σ·(A·M·Z)_n``, whose squared norm has expectation
    ``η²σ²·p·E_n`` (``E_n``: the factorization's prefix-sum variance at the horizon, p: the
    coordinates the noise moves). Setting it to ``(D/2)²`` keeps the noise inside the ball and
    leaves room for the signal. Without noise (σ = 0) the textbook ``D/(G√n)``. Depends on
    n, ε, δ, G, D and d only — never on data (``docs/privacy.md``, *Choosing the parameters*).

    Examples
    --------
    >>> round(step_size_rule(1.0, 2.0, 4.0, 16, 4.0, 100), 6)
    0.03125

    """
    if sigma > 0:
        return model_radius / (2.0 * sigma * math.sqrt(coordinates * prefix_variance))
    return model_radius / (lipschitz * math.sqrt(horizon))


class OnPairMF(BudgetedLearner, PairwiseLearner):
    """Online private pairwise SGD with correlated gradient noise: a release at every step.

    For each record ``z_t``: the gradient of the pairwise loss against the last ``buffer``
    records, summed and divided by the *fixed* divisor ``B = buffer`` (so one record's influence
    on the gradient stream is data-independent:
    :func:`~stream_dp.privacy.influence.window_pattern`), plus the step's correlated noise
    ``σ·(C⁻¹Z)_t``; the projected step ``w_t = Π_C(w_{t−1} − η·ĝ_t)``; and the release of the
    polynomial-decay average of the iterates (Shamir and Zhang, ICML 2013). The noisy gradient
    stream is one Gaussian mechanism — the matrix mechanism of Denisov et al. (NeurIPS 2022,
    Thm. 2.1), its factorization a BLT (Dvijotham et al., 2024; McMahan et al., 2024) by
    default — with ``Δ = sup ‖C(G − G′)‖_F`` over neighbouring streams, charged once before the
    first step; every release after it is post-processing and free
    (:class:`~stream_dp.online.correlated.CorrelatedNoiseMechanism`; derivation in
    ``docs/privacy.md``, *Correlated noise*). Huai et al. (AAAI 2020) is the setting: their
    pairwise loss, buffer and projection, with output perturbation replaced by correlated
    gradient noise. ``OnPairMF(task=...)`` returns :class:`OnPairMFAUC` (a river classifier) or
    :class:`OnPairMFMetric` (a supervised transformer).

    Parameters
    ----------
    task
        ``"auc"`` (logistic pairwise ranking loss, L2 ball) or ``"metric"`` (logistic metric
        loss, PSD ∩ Frobenius ball; see ``metric``).
    epsilon, delta
        The (ε, δ) budget of the whole stream. ``epsilon=None`` runs the same learner without
        noise (not private; a baseline).
    horizon
        Stream length n: the mechanism covers n steps, after which the learner stops and keeps
        serving its last release. ``None`` (BLT only) covers an unbounded stream for the same
        one charge, with the BLT of :func:`~stream_dp.privacy.unbounded_blt.unbounded_blt`; the
        rules then assume :data:`NOMINAL_HORIZON` steps.
    noise
        The factorization: ``"blt"`` (default: O(k·p) state, near-optimal), ``"tree"`` (the
        binary tree of DP-FTRL) or ``"independent"`` (fresh noise per gradient: DP-SGD without
        amplification). The last two are baselines behind the same interface.
    buffer
        The window: partners are the last ``buffer`` records (and the divisor B). ``None``:
        :func:`window_rule` of the horizon.
    data_radius
        R: every x is clipped to ``‖x‖ ≤ R`` (part of the privacy proof). ``None``:
        :data:`AUC_DATA_RADIUS` (½) for AUC, 1 for the metric.
    model_radius
        D: radius of the constraint set C. ``None``: for AUC, :func:`radius_rule` of the
        stream's :func:`capacity` (from n, d, ε, δ and the mechanism — public facts, printed by
        :meth:`describe`; :data:`UNBOUNDED_MODEL_RADIUS` without a horizon); 1 for the full
        metric, √d for the diagonal one (its start, the identity, has norm √d).
    slope_cap
        κ of the capped logistic AUC loss (:class:`~stream_dp.losses.LogisticAUCLoss`):
        :data:`AUC_SLOPE_CAP` (½) by default, ``None`` for the plain logistic loss (then
        ``model_radius`` must be given). The metric task's loss is not capped (``None``).
    step_size
        η; ``None`` for :func:`step_size_rule` (from n, ε, δ, G, D and d — never from data).
    averaging
        κ of the released average ``w̄_t = w̄_{t−1} + (κ+1)/(t+κ)·(w_t − w̄_{t−1})``; ``None``
        releases the last iterate. Post-processing: free whatever it is.
    conversion
        ρ → (ε, δ): ``"exact"`` (default: every charge is Gaussian, so the ledger's Σρ = μ²/2
        is μ-GDP and its exact (ε, δ) curve is reported and calibrated on,
        :mod:`stream_dp.privacy.gdp`), ``"tight"`` (CKS 2020) or ``"paper"``.
    seed, reproducible
        ``seed=None`` (the default) draws the noise secret's 128 bits from the OS. An int seed is
        guessable, so it is refused unless ``reproducible=True``, which declares the run
        non-private. Stored in checkpoints — keep those secret.
    features
        The declared schema (required): feature names, or their number d for array input.
    model_id
        Identifies the model in releases; also keys the noise.
    track_regret, keep_history
        The operator-only regret (as :class:`~stream_dp.online.OnPairStrC`).
    max_buffer_warning
        Unused by the window (kept for the common interface).
    noise_source
        The keyed noise source: ``None`` for :class:`stream_dp.privacy.KeyedNoise`. Anything
        else marks every release non-private.
    budget_share
        The fraction of the budget's ρ the stream's charge may spend (default: what
        ``metrics_share`` leaves, all of it without metrics).
    metrics_share, metrics_noise
        The share of ρ and the noise of the differentially private operator metrics (as
        :class:`~stream_dp.online.OnPairStrC`; default 0: none).
    unit_key
        The field of ``x`` naming the privacy unit (a person, account, device), read and never
        learned from; ``None`` (default): event-level, neighbouring streams differ in one event.
        With it, the guarantee is per unit (:mod:`stream_dp.online.units`, ``docs/units.md``):
        at most ``max_events_per_unit`` events of a unit are learned, at least
        ``min_separation`` steps apart; the others are dropped (:attr:`units_dropped`) and Δ is
        the certified sensitivity of k events of one unit
        (:func:`~stream_dp.privacy.unit_sensitivity.unit_sensitivity`).
    max_events_per_unit
        k: events learned per unit, ever (default 1).
    min_separation
        b: steps between two learned events of one unit; ``None``: ``buffer + 1``, which keeps
        a unit's events out of each other's window (and makes Δ exact).
    metric
        The metric task's parameterisation: ``"full"`` (default: ``W ⪰ 0``, ``‖W‖_F ≤ D``,
        d(d+1)/2 noisy coordinates) or ``"diagonal"`` (``W = diag(w)``, ``w ≥ 0``, ``‖w‖ ≤ D``:
        :class:`~stream_dp.losses.DiagonalMetricLoss` on
        :class:`~stream_dp.constraints.NonnegativeBall`, d noisy coordinates). The diagonal
        starts at the identity (:func:`diagonal_start`, ``D = √d``) and its step size puts the
        final iterate's accumulated noise at :data:`DIAGONAL_NOISE_SHARE`·D; its pair terms have
        the full metric's bounds (:func:`~stream_dp.privacy.influence.pair_term_bounds`), so Δ
        and σ are the same formula over fewer coordinates. The release is the vector w.

    Examples
    --------
    >>> import numpy as np
    >>> from stream_dp.online import OnPairMF
    >>> rng = np.random.default_rng(0)
    >>> X = rng.normal(size=(400, 3)) / 2
    >>> y = X[:, 0] + 0.3 * rng.normal(size=400) > 0
    >>> model = OnPairMF(task="auc", epsilon=4.0, horizon=400, features=3)
    >>> model.learn_many(X, y)
    >>> model.n_releases, model.accountant.rho_spent() <= model.budget.limit
    (400, True)
    >>> bool(model.private_weights[0] > 0)  # the released model points along the signal
    True

    A diagonal metric: a distance that weighs each feature, starting from Euclidean distance.

    >>> labels = X[:, 0] > 0
    >>> metric = OnPairMF(task="metric", metric="diagonal", epsilon=4.0, horizon=400, features=3)
    >>> metric.learn_many(X, labels)
    >>> metric.private_weights.shape, bool((metric.private_weights >= 0).all())
    ((3,), True)

    """

    _variants: dict[str, type] = {}
    _regularized = False

    def __init__(
        self,
        task: str = "auc",
        epsilon: float | None = 1.0,
        delta: float = 1e-5,
        horizon: int | None = None,
        noise: str = "blt",
        buffer: int | None = None,
        data_radius: float | None = None,
        model_radius: float | None = None,
        slope_cap: float | None = AUC_SLOPE_CAP,
        step_size: float | None = None,
        averaging: float | None = 1.0,
        conversion: str = "exact",
        seed: int | None = None,
        reproducible: bool = False,
        features: tuple | int | None = None,
        model_id: str = "onpairmf",
        track_regret: bool = True,
        keep_history: bool = False,
        max_buffer_warning: int = 100_000,
        noise_source: type | None = None,
        budget_share: float | None = None,
        metrics_share: float = 0.0,
        metrics_noise: str = "blt",
        unit_key: str | None = None,
        max_events_per_unit: int = 1,
        min_separation: int | None = None,
        metric: str = "full",
    ) -> None:
        self.task = task
        self.epsilon = epsilon
        self.delta = delta
        self.horizon = horizon
        self.noise = noise
        self.buffer = buffer
        self.data_radius = data_radius
        self.model_radius = model_radius
        self.slope_cap = slope_cap
        self.step_size = step_size
        self.averaging = averaging
        self.conversion = conversion
        self.seed = seed
        self.reproducible = reproducible
        self.features = features
        self.model_id = model_id
        self.track_regret = track_regret
        self.keep_history = keep_history
        self.max_buffer_warning = max_buffer_warning
        self.noise_source = noise_source
        self.budget_share = budget_share
        self.metrics_share = metrics_share
        self.metrics_noise = metrics_noise
        self.unit_key = unit_key
        self.max_events_per_unit = max_events_per_unit
        self.min_separation = min_separation
        self.metric = metric
        _check_params(self)
        self._setup(0.0)
        self._metrics = self._operator_metrics()

    # -- the rules: data-independent --------------------------------------------------------------
    @property
    def window(self) -> int:
        """The buffer's window, which is also the divisor B."""
        return window_rule(self.horizon) if self.buffer is None else int(self.buffer)

    def _copy_buffer(self) -> Buffer:
        return FIFOBuffer(self.window)

    def _coordinates(self) -> int:
        d = self._input.schema.dim
        return d if self.task == "auc" or self.metric == "diagonal" else d * (d + 1) // 2

    @property
    def _cap(self) -> float | None:
        return self.slope_cap if self.task == "auc" else None

    def _base_loss(self):
        cap = {"slope_cap": self._cap} if self._cap else {}
        return get_loss(self.task, "logistic", metric=self.metric, **cap)

    def _start(self, dim: int) -> np.ndarray | None:
        return diagonal_start(dim, self.model_radius_) if self.metric == "diagonal" else None

    def _data_radius(self) -> float:
        if self.data_radius is None:
            return AUC_DATA_RADIUS if self.task == "auc" else 1.0
        return super()._data_radius()

    def _warns_clipping(self) -> bool:
        # R = ½ clips most records scaled to ‖x‖ ≲ 1 on purpose (docs/algorithms.md).
        return not (self.data_radius is None and self.task == "auc")

    def _model_radius(self) -> float:
        if self.model_radius is not None:
            return super()._model_radius()
        if self.task != "auc":
            # The diagonal's D = √d puts the identity itself on the sphere (diagonal_start);
            # its pair-term bound does not grow with D (s_max < 1), so neither does σ.
            return math.sqrt(self._input.schema.dim) if self.metric == "diagonal" else 1.0
        if self._cap is None or self._cap > 0.5:
            raise ValueError(
                "model_radius=None (the radius rule) needs slope_cap <= 0.5, under which the "
                "sensitivity does not depend on the radius; pass model_radius with this cap"
            )
        if self.horizon is None:
            return UNBOUNDED_MODEL_RADIUS
        # The mechanism at any D: with κ ≤ ½ its Δ and σ are those of every radius.
        mf, _ = self._plan(1.0)
        d = self._input.schema.dim
        z = capacity(int(self.horizon), d, float(mf.pattern[0]), mf.prefix_noise_std(self.horizon))
        #: The stream's capacity z (:func:`capacity`), from which the radius rule took D.
        self.capacity_ = z
        return radius_rule(z, self.data_radius_)

    def _plan(self, model_radius: float) -> tuple[MFMechanism, object]:
        """The stream's Gaussian mechanism and the budget it charges, at radius D."""
        bounds = pair_term_bounds(
            self.task, self.data_radius_, model_radius, self._cap, metric=self.metric
        )
        pattern = window_pattern(self.window, self.window, bounds)
        horizon = None if self.horizon is None else int(self.horizon)
        factorization = make_factorization(self.noise, horizon)
        size = int(np.prod(self._base_loss().param_shape(self._input.schema.dim)))
        budget = None
        rho = None
        if self.epsilon is not None:
            budget = zcdp_budget(self.epsilon, self.delta, self.conversion)
            budget.accountant.private = self.seed is None and self.noise_source is None
            share = self._release_share()
            if share != 1.0:
                budget = budget.slice(share, MECHANISM_NAME)
            rho = budget.limit
        # The radius rule plans before the unit bound exists: it reads the event-level mechanism.
        unit = getattr(self, "_unit", None)
        k, b = (1, 1) if unit is None else (unit.max_events, unit.min_separation)
        return MFMechanism(factorization, pattern, horizon, rho, size, k, b), budget

    def _mechanism(self, buffer: Buffer) -> CorrelatedNoiseMechanism:
        mf, budget = self._plan(self.model_radius_)
        horizon = None if self.horizon is None else int(self.horizon)
        return CorrelatedNoiseMechanism(mf, budget, self.averaging, horizon)

    def _fixed_step(self, mechanism: CorrelatedNoiseMechanism) -> tuple[float, int]:
        mf = mechanism.mf
        n = NOMINAL_HORIZON if self.horizon is None else int(self.horizon)
        if self.step_size is not None:
            eta = float(self.step_size)
        else:
            G = self.constants.lipschitz
            E = mf.factorization.max_error(n)
            D = self.model_radius_
            if self.metric == "diagonal" and mf.sigma > 0:  # the noise's share of D (rule: ½)
                D = 2.0 * DIAGONAL_NOISE_SHARE * D
            eta = step_size_rule(D, mf.sigma, E, self._coordinates(), G, n)
        self.step_size_ = eta
        return eta, self.window

    # -- what it is and what it costs -------------------------------------------------------------
    @property
    def mf(self) -> MFMechanism:
        """Δ, σ and the factorization of the stream's one Gaussian mechanism."""
        return self._state.mechanism.mf

    @property
    def n_releases(self) -> int:
        """Releases so far: one per step learned (all covered by the one charge)."""
        return self._state.t

    @property
    def last_sigma(self) -> float | None:
        return self.mf.sigma if self.mf.private else None

    @property
    def last_sensitivity(self) -> float | None:
        return self.mf.sensitivity

    def noise_plan(self, steps: list[int] | None = None) -> list[dict]:
        """The one charge, and the noise the released iterates carry at ``steps`` (default: a
        few up to the horizon) — computed without any data.

        The first entry is the stream's one Gaussian mechanism (``step`` 1, Δ, σ, ρ, which
        factorization); the others give, for step t, ``prefix_std``: the per-coordinate std of
        the accumulated noise ``σ·√(E_t)`` of an unprojected iterate, in gradient units (times η
        for the model).
        """
        mf = self.mf
        out = [{
            "step": 1, "mechanism": MECHANISM_NAME, "factorization": mf.factorization.name,
            "sensitivity": mf.sensitivity, "sigma": mf.sigma,
            "rho": mf.charged_rho if mf.private else 0.0, "covers": self.horizon,
            **self._plan_unit(mf.event_sensitivity, mf.event_rho),
        }]  # fmt: skip
        n = NOMINAL_HORIZON if self.horizon is None else int(self.horizon)
        for t in steps or sorted({1, max(1, n // 4), max(1, n // 2), n}):
            out.append({"step": int(t), "prefix_std": mf.prefix_noise_std(int(t))})
        return out

    def _own_rhos(self) -> tuple[float, float]:
        mech = self._state.mechanism
        if not (self.mf.private and mech.charged):
            return 0.0, 0.0
        return self.mf.charged_rho, self.mf.event_rho

    def describe(self) -> str:
        """The mechanism, its cost and the rules' values — before any data."""
        mf = self.mf
        flag = "" if self.private else "NOT PRIVATE: "
        cover = f"horizon n={self.horizon}" if self.horizon is not None else "unbounded stream"
        budget = (
            f"ρ budget={self.budget.limit:.4g} (ε={self.epsilon}, δ={self.delta}, "
            f"{self.conversion} accounting); "
            if self.budget is not None
            else "no budget (epsilon=None); "
        )
        avg = "last iterate" if self.averaging is None else f"average κ={self.averaging:g}"
        z = getattr(self, "capacity_", None)
        rule = "" if z is None else f" (radius rule, capacity z={z:.3g})"
        cap = "" if self._cap is None else f"; slope cap κ={self._cap:g}"
        if self.metric == "diagonal":
            cap += "; diagonal metric W = diag(w), w ≥ 0, from Euclidean w₀ = (D/√d)·1"
        return (
            f"{flag}{self._state.mechanism.describe()}; {budget}{cover}; window = divisor "
            f"B={self.window}; η={self.step_size_:.4g}; R={self.data_radius_:g}; "
            f"D={self.model_radius_:.4g}{rule}{cap}; releases: "
            f"every step ({avg}), free; influence ‖u‖₁={float(mf.pattern.sum()):.4g}; "
            + self._describe_guarantee(mf.event_rho)
        )

    def __repr__(self) -> str:
        return f"{super().__repr__()}\n# {self.describe()}"

    @classmethod
    def _unit_test_params(cls):
        params = river_check_params(cls._task or "auc")
        params = {k: v for k, v in params.items() if k not in ("alpha", "warmup")}
        yield {**params, "epsilon": 4.0, "horizon": 10_000}


def _check_params(m: OnPairMF) -> None:
    check_budget_params(m.epsilon, m.delta)
    if m.horizon is not None and (
        isinstance(m.horizon, bool) or int(m.horizon) != m.horizon or m.horizon < 1
    ):
        raise ValueError(f"horizon must be an int >= 1 or None, got {m.horizon!r}")
    if m.noise not in NOISES:
        raise ValueError(f"noise must be one of {NOISES}, got {m.noise!r}")
    if m.horizon is None and m.noise != "blt":
        raise ValueError(
            f"an unbounded stream (horizon=None) needs noise='blt', whose sensitivity converges; "
            f"{m.noise!r} needs the horizon"
        )
    if m.buffer is not None and (isinstance(m.buffer, bool) or not isinstance(m.buffer, int)
                                 or m.buffer < 1):  # fmt: skip
        raise ValueError(f"buffer must be None (the window rule) or an int >= 1, got {m.buffer!r}")
    for name in ("step_size",):
        v = getattr(m, name)
        if v is not None and not (isinstance(v, int | float) and v > 0 and math.isfinite(v)):
            raise ValueError(f"{name} must be None or a positive number, got {v!r}")
    if m.slope_cap is not None and not (
        isinstance(m.slope_cap, int | float) and 0 < m.slope_cap <= 1
    ):
        raise ValueError(f"slope_cap must be None or in (0, 1], got {m.slope_cap!r}")
    if m.averaging is not None and not (isinstance(m.averaging, int | float)
                                        and m.averaging >= 0):  # fmt: skip
        raise ValueError(f"averaging must be None or a number >= 0, got {m.averaging!r}")
    if m.metric not in METRICS or (m.metric != "full" and m.task != "metric"):
        raise ValueError(
            f"metric must be one of {METRICS} (a parameterisation of task='metric'), got "
            f"{m.metric!r} for task={m.task!r}"
        )
    check_shares(m.budget_share, m.metrics_share, m.metrics_noise)
    check_unit_params(m.unit_key, m.max_events_per_unit, m.min_separation, m.features,
                      m.metrics_share)  # fmt: skip


class OnPairMFAUC(OnPairMF, AUCInterface):
    """OnPairMF for bipartite ranking (``task="auc"``): a river binary classifier."""

    _task = "auc"


class OnPairMFMetric(OnPairMF, MetricInterface):
    """OnPairMF for Mahalanobis metric learning (``task="metric"``): a river transformer."""

    _task = "metric"


OnPairMF._variants = {"auc": OnPairMFAUC, "metric": OnPairMFMetric}
