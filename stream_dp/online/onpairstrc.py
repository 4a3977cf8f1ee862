"""OnPairStrC: online private pairwise learning for strongly convex losses (Huai et al. 2020)."""

from __future__ import annotations

import copy
import math
import warnings

import numpy as np

from stream_dp.buffers import Buffer, make_buffer
from stream_dp.huai import alpha_for_warmup, huai_warmup
from stream_dp.losses import get_loss
from stream_dp.online.base import PairwiseLearner
from stream_dp.online.budgeted import BudgetedLearner
from stream_dp.online.interfaces import AUCInterface, MetricInterface
from stream_dp.online.output_perturbation import OutputPerturbation
from stream_dp.online.params import river_check_params
from stream_dp.online.units import check_unit_params
from stream_dp.operator_metrics import check_shares
from stream_dp.privacy.budget import zcdp_budget
from stream_dp.privacy.events import gaussian_rho
from stream_dp.privacy.mechanisms import release_sigma
from stream_dp.privacy.schedules import AnytimeSchedule, HorizonSchedule, Schedule
from stream_dp.sensitivity import CertifiedSensitivity

__all__ = ["OnPairStrC", "OnPairStrCAUC", "OnPairStrCMetric"]


class OnPairStrC(BudgetedLearner, PairwiseLearner):
    """Online Pairwise Private GIGA, strongly convex (Huai et al., AAAI 2020, Algorithm 1).

    Each record ``z_t`` is paired with the buffer ``B_t``; one projected gradient step is taken
    on ``L̂_t(w) = (1/|B_t|) Σ_{z∈B_t} ℓ(w; z_t, z) + (α/2)‖w‖²`` with
    ``η_t = 2(t−1)/(αt(t−2))``; on a release step the model ``Π_C(w_t + N(0, σ_t² I))`` is
    published and charged to the zCDP ledger (:class:`~stream_dp.online.output_perturbation.
    OutputPerturbation`). Steps ``1..T1`` (``T1 = max(⌈16L/α²⌉, 7)``) release data-independent
    random models at no cost. σ_t is ``Δ_t/√(2ρ_k)``: ``ρ_k`` comes from the schedule
    (``horizon=n`` splits ρ evenly over the ``⌈(n − T1)/release_every⌉`` releases — the paper's
    ``σ_t² = 32G²(n−T1)/(α²t²ρ)`` with ``sensitivity="paper"``; ``horizon=None`` uses the
    anytime schedule ``ρ_k = ρ k^{−p}/ζ(p)``); ``Δ_t`` is the certified bound of
    ``docs/privacy.md`` (default) or Lemma 4's ``8G/(αt)`` (``sensitivity="paper"``, full buffer
    only). Predictions use only the latest release (or the smoothed release), never the
    internal iterate. ``OnPairStrC(task=...)`` returns :class:`OnPairStrCAUC` (a river
    classifier) or :class:`OnPairStrCMetric` (a supervised transformer).

    Parameters
    ----------
    task
        ``"auc"`` (logistic pairwise ranking loss, L2 ball; a river ``Classifier``) or
        ``"metric"`` (logistic metric loss, PSD ∩ Frobenius ball; a ``SupervisedTransformer``).
    epsilon, delta
        The (ε, δ) budget for everything this learner will ever release.
    horizon
        Stream length n for the paper's schedule; ``None`` for the anytime schedule.
    alpha
        Strength α of the ``(α/2)‖w‖²`` regulariser, which is the strong convexity. Small α
        means a long warm-up (T1 ∝ 1/α²) and large noise (σ ∝ 1/α): see ``describe()``.
        ``None`` (the default): α = 1, raised if needed so that the warm-up takes at most a
        tenth of a known horizon (``alpha_`` holds the value used). A given α whose warm-up
        exceeds a tenth of the horizon draws a warning.
    data_radius
        R: every x is clipped to ``‖x‖ ≤ R`` (part of the privacy proof).
    model_radius
        D: radius of the constraint set C.
    buffer
        ``"all"`` (the paper; O(t·d) memory), an int (FIFO of that size), ``"fifo:N"``,
        ``"reservoir:N"`` (Kar et al. RS-x) or a :class:`stream_dp.buffers.Buffer`.
    conversion
        ρ → (ε, δ): ``"exact"`` (default: every charge is Gaussian, so the ledger's Σρ = μ²/2
        is μ-GDP and its exact (ε, δ) curve is reported and calibrated on,
        :mod:`stream_dp.privacy.gdp`), ``"tight"`` (CKS 2020) or ``"paper"``.
    seed
        Secret of the keyed noise. ``None`` (the default) draws 128 bits from the OS. An int is
        guessable, so it is refused unless ``reproducible=True``. Stored in checkpoints — keep
        those secret.
    reproducible
        Declare the run non-private so that an int ``seed`` is accepted (tests, debugging):
        every release message, ``describe()`` and the ledger then say it is not private.
    release_every
        Release every k-th step; the budget is split over fewer releases, so each is less noisy.
        Default 20: the smoothed model's noise depends only on the budget inside its window, not
        on how many releases share it, so releasing at every step would only cost a noise draw
        and a projection per record (``docs/algorithms.md``, *Choosing the parameters*).
        ``release_every=1, smoothing_window=1, predict_with="release"`` is Algorithm 1 as written.
    smoothing_window
        Number of releases averaged by ``smoothed_weights`` (post-processing: free). Default 50:
        with ``release_every=20``, the models of the last 1,000 records.
    predict_with
        ``"release"`` or ``"smoothed"`` (default): which private model predictions use.
    warmup
        Override T1 (then ``sensitivity`` must be ``"certified"``).
    sensitivity
        ``"certified"`` (the recurrence of ``docs/privacy.md``, any buffer) or ``"paper"``
        (Lemma 4).
    anytime_p
        Exponent p > 1 of the anytime schedule.
    features
        The declared schema (required): feature names, or their number d for array input
        (names ``x0 … x{d−1}``). Features outside it are ignored and counted
        (``unknown_features``); missing ones are 0.
    model_id
        Identifies the model in releases; also keys the noise.
    track_regret
        Track the penalty of each served model on the next record (operator-only numbers).
    keep_history
        Keep records so :meth:`best_fixed_comparator` can be solved (finite runs only).
    max_buffer_warning
        The ``"all"`` buffer warns above this many records.
    noise_source
        The keyed noise source: ``None`` for :class:`stream_dp.privacy.KeyedNoise`. Anything
        else (the audit's deliberately weakened variants) marks every release non-private.
    budget_share
        The fraction of the budget's ρ the releases may spend (default: what ``metrics_share``
        leaves, all of it without metrics). The rest is left to other components charging the
        same :attr:`budget` under their own names — a private scaler in front of the learner,
        the private operator metrics — so that the ledger's ``spent()`` is the guarantee of
        everything together (``docs/privacy.md``, *Accounting*). ``budget_share +
        metrics_share`` may not exceed 1.
    metrics_share
        The fraction of ρ spent on differentially private operator metrics (default 0: none):
        the running average penalty of the served models and the clip and unknown-feature
        rates, released by :meth:`release_metrics` at any step for one charge
        (:mod:`stream_dp.operator_metrics`; needs ``track_regret``).
    metrics_noise
        Their continual-release noise: ``"blt"`` (default; also for ``horizon=None``) or
        ``"tree"``.
    unit_key
        The field of ``x`` naming the privacy unit (read, never learned from); ``None``
        (default): event-level. With it the guarantee is per unit (``docs/units.md``): at most
        ``max_events_per_unit`` events of a unit are learned, ``min_separation`` steps apart,
        the others dropped (:attr:`units_dropped`); each release is calibrated to
        ``min(diam C, k·Δ_t)``
        (:func:`~stream_dp.privacy.unit_sensitivity.replaced_events_bound`), on the reference
        path (the compiled path calibrates to one record).
    max_events_per_unit
        k: events learned per unit, ever (default 1).
    min_separation
        b: steps between two learned events of one unit; ``None``: the buffer's capacity + 1
        (1 for ``"all"``). The bound holds for any b.

    Examples
    --------
    >>> from stream_dp.online import OnPairStrC
    >>> model = OnPairStrC(task="auc", epsilon=1.0, delta=1e-5, horizon=1000, alpha=1.0,
    ...                    features=["a", "b"])
    >>> model.T1
    80
    >>> for i in range(100):
    ...     model.learn_one({"a": (i % 7) / 7, "b": (i % 3) / 3}, i % 2 == 0)
    >>> model.private_weights.shape
    (2,)
    >>> eps, delta = model.accountant.spent()
    >>> 0 < eps < 1.0
    True

    """

    _variants: dict[str, type] = {}

    def __init__(
        self,
        task: str = "auc",
        epsilon: float = 1.0,
        delta: float = 1e-5,
        horizon: int | None = None,
        alpha: float | None = None,
        data_radius: float = 1.0,
        model_radius: float = 1.0,
        buffer: str | int | Buffer = "all",
        conversion: str = "exact",
        seed: int | None = None,
        reproducible: bool = False,
        release_every: int = 20,
        smoothing_window: int = 50,
        predict_with: str = "smoothed",
        warmup: int | None = None,
        sensitivity: str = "certified",
        anytime_p: float = 1.1,
        features: tuple | int | None = None,
        model_id: str = "stream-dp",
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
    ) -> None:
        self.task = task
        self.epsilon = epsilon
        self.delta = delta
        self.horizon = horizon
        self.alpha = alpha
        self.data_radius = data_radius
        self.model_radius = model_radius
        self.buffer = buffer
        self.conversion = conversion
        self.seed = seed
        self.reproducible = reproducible
        self.release_every = release_every
        self.smoothing_window = smoothing_window
        self.predict_with = predict_with
        self.warmup = warmup
        self.sensitivity = sensitivity
        self.anytime_p = anytime_p
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
        _check_release_params(self)
        self._setup(
            self._alpha_rule(),
            window=int(smoothing_window),
            smoothed=predict_with == "smoothed",
        )
        self._metrics = self._operator_metrics()

    def _alpha_rule(self) -> float:
        """α as given, or the default rule: a preferred α (:meth:`_preferred_alpha`), raised
        if needed so that the warm-up takes at most a tenth of a known horizon."""
        if self.alpha is not None:
            self.alpha_ = self.alpha
            return self.alpha
        alpha = self._preferred_alpha()
        if self.horizon is not None and self.warmup is None:
            base_L = get_loss(self.task).constants(float(self.data_radius), 1.0).smoothness
            alpha = max(alpha, alpha_for_warmup(base_L, max(7.0, self.horizon / 10)))
        self.alpha_ = alpha
        return alpha

    def _preferred_alpha(self) -> float:
        return 1.0

    # -- the privacy mechanism: Huai et al. Alg. 1's release side ------------------------------
    def _mechanism(self, buffer: Buffer) -> OutputPerturbation:
        c = self.constants
        if not math.isfinite(c.smoothness):
            raise ValueError("the online algorithms need a smooth loss (the contraction needs L)")
        T1 = huai_warmup(c.smoothness, c.strong_convexity) if self.warmup is None else self.warmup
        T1 = int(T1)
        if self.sensitivity == "paper" and (buffer.kind != "all" or self.warmup is not None):
            raise ValueError(
                "sensitivity='paper' (Huai Lemma 4, 8G/(αt)) holds only for the full buffer and "
                "the paper's T1; use sensitivity='certified'"
            )
        if self.horizon is not None and int(self.horizon) <= T1:
            raise ValueError(
                f"horizon {self.horizon} leaves no learning step after the warm-up T1 = {T1} "
                f"(T1 = max(⌈16L/α²⌉, 7) with L = {c.smoothness:.4g}, α = "
                f"{c.strong_convexity:.4g}); raise alpha or the horizon"
            )
        if self.warmup is None and self.horizon is not None and T1 > int(self.horizon) / 10:
            warnings.warn(
                f"{type(self).__name__}: the warm-up T1 = {T1} is more than a tenth of the "
                f"horizon {self.horizon}; its releases are random models. Raise alpha (or "
                "leave alpha=None to have it chosen)",
                UserWarning,
                stacklevel=4,
            )
        schedule: Schedule
        if self.horizon is not None:
            schedule = HorizonSchedule(math.ceil((int(self.horizon) - T1) / self.release_every))
        else:
            schedule = AnytimeSchedule(self.anytime_p)
        budget = zcdp_budget(self.epsilon, self.delta, self.conversion)
        budget.accountant.private = self.seed is None and self.noise_source is None
        share = self._release_share()
        releases = budget if share == 1.0 else budget.slice(share, "gaussian")
        tracker = CertifiedSensitivity(
            c.lipschitz, c.strong_convexity, c.smoothness, self._constraint.diameter,
            shared_members=buffer.kind == "all", distinct=buffer.distinct,
        )  # fmt: skip
        paper = (c.lipschitz, c.strong_convexity) if self.sensitivity == "paper" else None
        k = 1 if self._unit is None else self._unit.max_events
        return OutputPerturbation(releases, schedule, tracker, T1, int(self.release_every),
                                  self.horizon, paper, k)  # fmt: skip

    @property
    def T1(self) -> int:
        """The warm-up: steps that release data-independent models."""
        return self._state.mechanism.warmup

    @property
    def n_releases(self) -> int:
        """Number of charged (noisy, learned) releases so far."""
        return self._state.mechanism.n_charged

    @property
    def last_sigma(self) -> float | None:
        return self._state.mechanism.last_sigma

    @property
    def last_sensitivity(self) -> float | None:
        return self._state.mechanism.last_sensitivity

    # -- what it says about itself -----------------------------------------------------------------
    def noise_plan(self, steps: list[int] | None = None) -> list[dict]:
        """σ_t, ρ_t and the sensitivity of the releases at ``steps`` (default: the first
        ones), computed without any data.

        Runs the mechanism's bookkeeping on an empty stream — the certified bound never depends
        on record values — with the learner's own keyed coins, so a reservoir is simulated
        exactly. Operators see the noise before the first record.
        """
        buf = make_buffer(copy.deepcopy(self.buffer), warn_above=2**62)
        mech = self._mechanism(buf)
        buf.bind(1)
        last = max(steps) if steps else (
            int(self.horizon) if self.horizon is not None else mech.warmup + 10 * mech.release_every
        )  # fmt: skip
        wanted = set(steps) if steps else None
        out: list[dict] = []
        zero = np.zeros(1)
        for t in range(1, last + 1):
            ids_before = buf.member_ids().copy()
            n = len(buf)
            written = buf.add(zero, 0.0, t, self._noise)
            eta = 0.0 if t <= mech.warmup else self._state.step_size(t)
            mech.observe(t, eta, n, [s for s, _ in written], [o for _, o in written],
                         ids_before, buf.member_ids())  # fmt: skip
            if t > mech.warmup and mech.releases_at(t):
                mech.n_charged += 1
                rho = mech.rho(mech.n_charged)
                if rho <= 0:
                    break
                sens = mech.sensitivity(t)
                if wanted is None or t in wanted:
                    sigma = release_sigma(sens, rho)
                    event = mech.event_sensitivity(t)
                    out.append({"step": t, "sensitivity": sens, "sigma": sigma,
                                "rho": gaussian_rho(sens, sigma),
                                **self._plan_unit(event, gaussian_rho(event, sigma))})  # fmt: skip
        return out

    def _planned_event_rho(self, plan: list[dict]) -> float:
        """The budget's ρ at one event's Δ: the first release's ratio of the two costs (the
        same for all while ``k·Δ_t`` stays below the diameter, larger after)."""
        if self._unit is None or not plan or not plan[0]["rho"] > 0:
            return 0.0
        return self.budget.limit * plan[0]["event_rho"] / plan[0]["rho"]

    def _own_rhos(self) -> tuple[float, float]:
        mech = self._state.mechanism
        return mech.rho_unit_spent, mech.rho_event_spent

    def describe(self) -> str:
        """T1, the budget and the noise of the first learned release — before any data."""
        c = self.constants
        mech = self._state.mechanism
        first = self.T1 + int(self.release_every)
        if self.horizon is not None:
            first = min(first, int(self.horizon))
        plan = self.noise_plan([first])
        sig = f"{plan[0]['sigma']:.4g}" if plan else "n/a"
        sched = (
            f"horizon n={self.horizon} ({mech.schedule.n_releases} charged releases)"
            if self.horizon is not None
            else f"anytime p={self.anytime_p}"
        )
        flag = "" if self.private else "NOT PRIVATE (reproducible seed): "
        return (
            f"{flag}T1={self.T1} warm-up steps; G={c.lipschitz:.4g}, L={c.smoothness:.4g}, "
            f"α={c.strong_convexity:.4g}; ρ budget={self.budget.limit:.4g} "
            f"(ε={self.epsilon}, δ={self.delta}, {self.conversion}); {sched}; "
            f"σ per coordinate at step {first} ≈ {sig} ({self.sensitivity} sensitivity); "
            + self._describe_guarantee(self._planned_event_rho(plan))
            + self._describe_metrics()
        )

    def __repr__(self) -> str:
        return f"{super().__repr__()}\n# {self.describe()}"

    @classmethod
    def _unit_test_params(cls):
        yield river_check_params(cls._task or "auc")


def _check_release_params(m: OnPairStrC) -> None:
    if not (isinstance(m.epsilon, int | float) and m.epsilon > 0 and math.isfinite(m.epsilon)):
        raise ValueError(f"epsilon must be a positive finite number, got {m.epsilon!r}")
    if not (isinstance(m.delta, float | int) and 0 < m.delta < 1):
        raise ValueError(f"delta must be in (0, 1), got {m.delta!r}")
    if m.horizon is not None and (isinstance(m.horizon, bool) or int(m.horizon) != m.horizon):
        raise ValueError(f"horizon must be an int or None, got {m.horizon!r}")
    for name in ("release_every", "smoothing_window"):
        v = getattr(m, name)
        if isinstance(v, bool) or int(v) < 1:
            raise ValueError(f"{name} must be an int >= 1, got {v!r}")
    if m.predict_with not in ("release", "smoothed"):
        raise ValueError(f"predict_with must be 'release' or 'smoothed', got {m.predict_with!r}")
    if m.sensitivity not in ("certified", "paper"):
        raise ValueError(f"sensitivity must be 'certified' or 'paper', got {m.sensitivity!r}")
    if m.warmup is not None and (isinstance(m.warmup, bool) or int(m.warmup) < 1):
        raise ValueError(f"warmup must be None (the paper's T1) or an int >= 1, got {m.warmup!r}")
    check_shares(m.budget_share, m.metrics_share, m.metrics_noise)
    check_unit_params(m.unit_key, m.max_events_per_unit, m.min_separation, m.features,
                      m.metrics_share)  # fmt: skip


class OnPairStrCAUC(OnPairStrC, AUCInterface):
    """OnPairStrC for bipartite ranking (``task="auc"``): a river binary classifier."""

    _task = "auc"


class OnPairStrCMetric(OnPairStrC, MetricInterface):
    """OnPairStrC for Mahalanobis metric learning (``task="metric"``): a river transformer."""

    _task = "metric"


OnPairStrC._variants = {"auc": OnPairStrCAUC, "metric": OnPairStrCMetric}
