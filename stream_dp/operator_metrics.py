"""Differentially private operator metrics: the running average penalty and utility counters.

What an operator watches on a running learner — how well the served models do on the records
that arrive, how many records were clipped, how many carried features outside the schema — is
computed from raw records (:mod:`stream_dp.regret`). These are its private versions: three
series, one value per learned step t,

* ``penalty``: ``p_t = L̂_t(w̃_{t−1})``, the served model's penalty on record t against its
  buffer — the first term of Huai et al.'s (2020, eq. 4) regret, which
  :class:`~stream_dp.regret.RegretTracker` sums (0 on the steps it does not score);
* ``clipped``: 1 if record t had ``‖x‖ > R`` and was clipped;
* ``unknown_features``: 1 if record t carried features outside the declared schema;

released as running sums with :class:`~stream_dp.privacy.continual.ContinualSums` (one
matrix-factorization Gaussian mechanism, BLT or binary tree), charged once on the learner's own
ledger under the mechanism name ``"gaussian-metrics"``, within its share of the budget
(:class:`~stream_dp.privacy.budget.BudgetSlice`). Every later value is post-processing: the
average penalty divides by the number of scored steps, the rates by t, both public.

**Sensitivities** (``docs/privacy.md``, *Operator metrics*). Neighbouring streams differ in the
record of one step i. The served models are releases of the learner's own mechanism, which never
reads these metrics, so the two mechanisms compose adaptively (Bun & Steinke 2016, Lemma 2.3)
and the metrics are analysed with the served models fixed.

* Counters: only step i's indicator changes, by at most 1: pattern ``[1]``.
* Penalty: a pair term of a served model ``‖w̃‖ ≤ D`` on clipped records lies in an interval of
  length :func:`penalty_term_range` — AUC ``φ(c·w̃ᵀ(x − x′))``, ``c ∈ {−2, 0, 2}``,
  ``|c·w̃ᵀ(x − x′)| ≤ 4RD``: ``φ(−4RD) − φ(4RD) = 4RD``; metric ``φ(c(1 − δᵀW̃δ))``,
  ``c = ±1``, ``δᵀW̃δ ∈ [0, 4R²D]``: the argument lies in ``[−M, M]``, ``M = max(1, 4R²D − 1)``,
  range ``M`` (``φ(−a) − φ(a) = a``). The regulariser ``(α/2)‖w̃ − w₀‖²`` is the same on both
  streams. At step i all of the ``|B_i|`` averaged terms change: at most the range. At a later
  step s the record is one of the ``|B_s|`` partners (FIFO and ``all`` hold it once, and their
  membership is a function of arrival steps only): at most ``range/|B_s|``. Bounding
  ``|B_{i+k}| ≥ min(k + 1, S)`` for ``i ≥ 2`` (the record of step 1 is never scored, and its
  pattern is the step-2 pattern one step later) gives :func:`penalty_pattern`,

      u = range · [1, 1/2, 1/3, …, 1/S, 1/S]        (FIFO of S: S + 1 entries)
      u = range · [1, 1/2, 1/3, …, 1/n]             (``all``, horizon n: n entries)

  which every placement respects; ``ContinualSums`` turns it into ``Δ = sup ‖C·D‖``.

A reservoir may hold one record in every slot for ever (``u[k] = range`` for all k) and
per-class buffers change other records' membership, so both are refused.
"""

from __future__ import annotations

import math
from collections.abc import Mapping

import numpy as np

from stream_dp.losses import phi
from stream_dp.privacy.budget import BudgetExhausted, PrivacyBudget
from stream_dp.privacy.continual import ContinualSums
from stream_dp.privacy.mf import make_factorization
from stream_dp.privacy.noise import KeyedNoise

__all__ = [
    "MECHANISM",
    "NOISES",
    "SERIES",
    "OperatorMetrics",
    "OperatorMetricsMixin",
    "check_shares",
    "penalty_pattern",
    "penalty_term_range",
]

#: The series, in the order of the mechanism's columns.
SERIES = ("penalty", "clipped", "unknown_features")
#: The ledger name of their charge.
MECHANISM = "gaussian-metrics"
#: Factorizations the metrics stream with; the first is the default.
NOISES = ("blt", "tree")
#: Horizon a BLT is fitted for when the stream has none (Δ is then the limit of every horizon).
ANYTIME_FIT_HORIZON = 1_000_000


def penalty_term_range(task: str, data_radius: float, model_radius: float) -> float:
    """Length of the interval every pair term of the penalty lies in (see the module docstring).

    Examples
    --------
    >>> penalty_term_range("auc", 1.0, 1.0), penalty_term_range("metric", 1.0, 1.0)
    (4.0, 3.0)

    """
    R, D = float(data_radius), float(model_radius)
    if not (R > 0 and D > 0 and math.isfinite(R) and math.isfinite(D)):
        raise ValueError(f"radii must be positive and finite, got R={R!r}, D={D!r}")
    if task == "auc":
        a = 4.0 * R * D
    elif task == "metric":
        a = max(1.0, 4.0 * R * R * D - 1.0)
    else:
        raise ValueError(f"task must be 'auc' or 'metric', got {task!r}")
    # φ(−a) − φ(a) = a exactly; computed from φ so that the bound is the loss's own.
    return max(a, float(phi(np.array(-a)) - phi(np.array(a))))


def penalty_pattern(
    buffer_kind: str, size: int | None, horizon: int | None, term_range: float
) -> np.ndarray:
    """The influence pattern of the penalty series for a FIFO of ``size`` or the ``all`` buffer.

    ``u[0] = range`` (the record's own step), then ``u[k] = range/min(k + 1, S)`` for
    ``k = 1 … S`` (FIFO of S), or ``range/(k + 1)`` for ``k = 1 … n − 1`` (``all``, which needs
    the horizon n).

    Examples
    --------
    >>> penalty_pattern("fifo", 3, None, 1.0).round(4).tolist()
    [1.0, 0.5, 0.3333, 0.3333]
    >>> penalty_pattern("all", None, 4, 2.0).round(4).tolist()
    [2.0, 1.0, 0.6667, 0.5]

    """
    if buffer_kind == "fifo":
        S = int(size)
        if S < 1:
            raise ValueError(f"buffer size must be >= 1, got {size!r}")
        k = np.arange(1, S + 1, dtype=float)
        return float(term_range) * np.concatenate([[1.0], 1.0 / np.minimum(k + 1.0, S)])
    if buffer_kind == "all":
        if horizon is None:
            raise ValueError(
                "private metrics with the 'all' buffer need a horizon: a record stays a partner "
                "of every later step, so its influence on the penalty grows with the stream "
                "(use a FIFO buffer for an unbounded stream)"
            )
        k = np.arange(1, max(int(horizon), 2), dtype=float)
        return float(term_range) * np.concatenate([[1.0], 1.0 / (k + 1.0)])
    raise ValueError(
        f"private metrics support FIFO and 'all' buffers, not {buffer_kind!r}: a reservoir "
        "may keep one record in every slot for ever, and per-class buffers move other "
        "records' membership (docs/privacy.md, Operator metrics)"
    )


def check_shares(budget_share: float | None, metrics_share: float, metrics_noise: str) -> None:
    """Validate a learner's ``budget_share``, ``metrics_share`` and ``metrics_noise``.

    Examples
    --------
    >>> check_shares(None, 0.1, "blt")
    >>> check_shares(0.95, 0.1, "blt")
    Traceback (most recent call last):
    ...
    ValueError: budget_share 0.95 + metrics_share 0.1 exceeds the budget (their sum is at most 1)

    """
    share, metrics = budget_share, metrics_share
    if share is not None and (
        isinstance(share, bool) or not isinstance(share, int | float) or not 0 < share <= 1
    ):
        raise ValueError(f"budget_share must be None or in (0, 1], got {share!r}")
    if isinstance(metrics, bool) or not isinstance(metrics, int | float) or not 0 <= metrics < 1:
        raise ValueError(f"metrics_share must be in [0, 1), got {metrics!r}")
    if share is not None and share + metrics > 1 + 1e-12:
        raise ValueError(
            f"budget_share {share!r} + metrics_share {metrics!r} exceeds the budget (their sum "
            "is at most 1)"
        )
    if metrics_noise not in NOISES:
        raise ValueError(f"metrics_noise must be one of {NOISES}, got {metrics_noise!r}")


def _factorization(noise: str, horizon: int | None):
    if noise not in NOISES:
        raise ValueError(f"metrics noise must be one of {NOISES}, got {noise!r}")
    if noise == "tree" and horizon is None:
        raise ValueError("tree noise needs a horizon (its column norms grow with it); use "
                         "metrics_noise='blt' for an unbounded stream")  # fmt: skip
    return make_factorization(noise, ANYTIME_FIT_HORIZON if horizon is None else int(horizon))


class OperatorMetrics:
    """The private operator metrics of one learner: plan, charge, running sums, latest values.

    Parameters
    ----------
    share
        The share of the learner's ρ they cost (charged once, under ``"gaussian-metrics"``).
    noise
        ``"blt"`` (default) or ``"tree"``.
    horizon
        The learner's horizon; ``None`` for an unbounded stream (BLT only).
    patterns
        The influence pattern of each of :data:`SERIES` (:meth:`for_learner` derives them).

    Examples
    --------
    >>> from stream_dp.privacy.budget import zcdp_budget
    >>> m = OperatorMetrics.for_learner(0.2, "blt", 500, "auc", 1.0, 1.0, "fifo", 16)
    >>> budget, keyed = zcdp_budget(4.0, 1e-5), KeyedNoise(secret=1, model_id="m")
    >>> out = m.release(100, {"penalty": 62.0, "clipped": 7, "unknown_features": 0},
    ...                 scored_steps=99, budget=budget, keyed=keyed)
    >>> sorted(out)[:4], out["step"]
    (['average_penalty', 'average_penalty_std', 'clip_rate', 'clip_rate_std'], 100)
    >>> [e.mechanism for e in budget.accountant.ledger]
    ['gaussian-metrics']

    """

    def __init__(
        self, share: float, noise: str, horizon: int | None, patterns: Mapping[str, np.ndarray]
    ) -> None:
        if isinstance(share, bool) or not 0.0 < share < 1.0:
            raise ValueError(f"the metrics' share of the budget is in (0, 1), got {share!r}")
        if set(patterns) != set(SERIES):
            raise ValueError(f"patterns must be given for {SERIES}")
        self.share = float(share)
        self.noise = noise
        self.horizon = None if horizon is None else int(horizon)
        self.patterns = {name: np.asarray(patterns[name], dtype=float) for name in SERIES}
        self.factorization = _factorization(noise, self.horizon)
        self._sums: ContinualSums | None = None
        self._sums_key: tuple | None = None
        self.charged_at: int | None = None
        self.refused: str | None = None
        self.latest: dict | None = None

    @classmethod
    def for_learner(
        cls,
        share: float,
        noise: str,
        horizon: int | None,
        task: str,
        data_radius: float,
        model_radius: float,
        buffer_kind: str,
        buffer_size: int | None,
    ) -> OperatorMetrics:
        """The metrics of a learner with these settings (patterns from the module docstring)."""
        term = penalty_term_range(task, data_radius, model_radius)
        patterns = {
            "penalty": penalty_pattern(buffer_kind, buffer_size, horizon, term),
            "clipped": np.ones(1),
            "unknown_features": np.ones(1),
        }
        return cls(share, noise, horizon, patterns)

    # -- the mechanism ------------------------------------------------------------------------
    def mechanism(self, budget: PrivacyBudget, keyed: KeyedNoise) -> ContinualSums:
        """The continual-release mechanism at ``share·ρ`` of ``budget``, keyed by ``keyed``."""
        key = (budget.limit, id(keyed))
        if self._sums is None or self._sums_key != key:
            # A fresh mechanism starts its noise prefix at step 0: N(t) is a pure function of
            # (secret, model id, t), so nothing is lost but the time to catch up.
            self._sums = ContinualSums(
                self.factorization,
                [self.patterns[name] for name in SERIES],
                self.horizon,
                self.share * budget.limit,
                keyed,
            )
            self._sums_key = key
        return self._sums

    def plan(self, budget: PrivacyBudget, at: int | None = None) -> dict:
        """Data-independent facts: ρ, σ, each series' Δ and, at step ``at`` (default: the
        horizon), the standard deviation of each running sum."""
        sums = ContinualSums(self.factorization, [self.patterns[n] for n in SERIES],
                             self.horizon, self.share * budget.limit, KeyedNoise(0))  # fmt: skip
        out = {
            "noise": self.noise,
            "rho": sums.charged_rho,
            "sigma": sums.sigma,
            "sensitivities": dict(zip(SERIES, sums.sensitivities.tolist(), strict=True)),
        }
        at = self.horizon if at is None else at
        if at is not None:
            out["at"] = int(at)
            out["sum_std"] = dict(zip(SERIES, sums.std(int(at)).tolist(), strict=True))
        return out

    # -- releasing ----------------------------------------------------------------------------
    def release(
        self,
        step: int,
        totals: Mapping[str, float],
        scored_steps: int,
        budget: PrivacyBudget,
        keyed: KeyedNoise,
        private: bool = True,
    ) -> dict | None:
        """The private metrics at ``step`` from the true running sums ``totals``.

        The first call charges the whole mechanism to ``budget`` (its slice ``share`` under
        ``"gaussian-metrics"``) before any value exists; None if that is refused (and for
        ever after), or at step 0.
        """
        step = int(step)
        if step < 1 or self.refused is not None:
            return None
        sums = self.mechanism(budget, keyed)
        if self.charged_at is None:
            try:
                budget.slice(self.share, MECHANISM).charge(sums.event(step, MECHANISM))
            except BudgetExhausted as exc:
                self.refused = str(exc)
                return None
            self.charged_at = step
        noisy = sums.release(step, [float(totals[name]) for name in SERIES])
        std = sums.std(step)
        scored = int(scored_steps)
        per_score = 1.0 / scored if scored else math.nan
        values = {
            "step": step,
            "private": bool(private),
            "average_penalty": _finite(noisy[0] * per_score),
            "average_penalty_std": _finite(std[0] * per_score),
            "scored_steps": scored,
            "clip_rate": float(noisy[1] / step),
            "clip_rate_std": float(std[1] / step),
            "unknown_feature_rate": float(noisy[2] / step),
            "unknown_feature_rate_std": float(std[2] / step),
            "noise": self.noise,
            "rho": sums.charged_rho,
        }
        self.latest = values
        return dict(values)

    # -- checkpoints --------------------------------------------------------------------------
    def state_dict(self) -> dict:
        return {
            "charged_at": self.charged_at,
            "refused": self.refused,
            "latest": self.latest,
            "sums": None if self._sums is None else self._sums.state_dict(),
        }

    def load_state_dict(self, state: dict | None, budget: PrivacyBudget, keyed: KeyedNoise) -> None:
        """Restore, with the learner's restored budget and keyed noise."""
        state = state or {}
        self.charged_at = state.get("charged_at")
        self.refused = state.get("refused")
        self.latest = state.get("latest")
        self._sums, self._sums_key = None, None
        if (
            self.charged_at is not None
            and budget.accountant.charged(self.charged_at, MECHANISM) is None
        ):
            raise ValueError("the checkpoint's metrics were charged at step "
                             f"{self.charged_at}, but its ledger holds no such charge")  # fmt: skip
        if state.get("sums") is not None:
            self.mechanism(budget, keyed).load_state_dict(state["sums"])


def _finite(v: float) -> float | None:
    return float(v) if math.isfinite(v) else None


class OperatorMetricsMixin:
    """Private operator metrics for an online learner with ``metrics_share`` and
    ``metrics_noise`` parameters (:class:`~stream_dp.online.OnPairStrC` and its subclasses).

    The learner calls :meth:`_operator_metrics` once its state exists; the mixin adds
    :meth:`release_metrics`, :attr:`metrics`, :meth:`note_unknown_features` and keeps the
    metrics in the learner's checkpoints.
    """

    metrics_share: float
    metrics_noise: str
    _metrics: OperatorMetrics | None = None

    def _release_share(self) -> float:
        """The share of ρ the learner's own mechanism may spend: ``budget_share``, or by
        default what the metrics leave."""
        if self.budget_share is None:
            return 1.0 - float(self.metrics_share)
        return float(self.budget_share)

    def _operator_metrics(self) -> OperatorMetrics | None:
        if not self.metrics_share:
            return None
        if self.budget is None:
            raise ValueError("metrics_share needs a privacy budget (epsilon=None runs without "
                             "one)")  # fmt: skip
        if not self.track_regret:
            raise ValueError("metrics_share needs track_regret=True: the private average penalty "
                             "is released from the tracked penalties")  # fmt: skip
        buf = self._state.buffer
        return OperatorMetrics.for_learner(
            self.metrics_share, self.metrics_noise, self.horizon, self.task,
            self.data_radius_, self.model_radius_, buf.kind, buf.capacity,
        )  # fmt: skip

    def release_metrics(self) -> dict | None:
        """Release the differentially private operator metrics at the current step.

        The average penalty of the served models (Huai et al. 2020, eq. 4's first term), the
        clip rate and the rate of records with unknown features, each with the standard
        deviation of its noise. The first call charges the whole continual-release mechanism
        (``metrics_share`` of ρ, mechanism ``"gaussian-metrics"``) to the ledger, before any
        value exists; later calls, at any steps, are free. None without ``metrics_share``, at
        step 0, or if the budget refused the charge (``docs/privacy.md``, *Operator metrics*).

        Examples
        --------
        >>> from stream_dp.online import OnPairStrC
        >>> model = OnPairStrC(epsilon=4.0, horizon=400, features=["a", "b"], buffer=32,
        ...                    metrics_share=0.1)
        >>> for i in range(200):
        ...     model.learn_one({"a": (i % 7) / 7, "b": 3.0 * (i % 2)}, i % 2 == 0)
        >>> m = model.release_metrics()
        >>> # Penalties are scored once a model is served: from the first release (step 20).
        >>> m["step"], m["scored_steps"], sorted(k for k in m if k.endswith("_std"))
        (200, 180, ['average_penalty_std', 'clip_rate_std', 'unknown_feature_rate_std'])
        >>> [e.mechanism for e in model.accountant.ledger][-1]
        'gaussian-metrics'

        """
        m = self._metrics
        if m is None:
            return None
        totals = {
            "penalty": self.regret.cumulative,
            "clipped": self.n_clipped,
            "unknown_features": self.unknown_features,
        }
        return m.release(self.step, totals, self.regret.steps, self.budget, self._noise,
                         self.private)  # fmt: skip

    @property
    def metrics(self) -> dict | None:
        """The latest :meth:`release_metrics` (None before one): private, safe to publish."""
        latest = None if self._metrics is None else self._metrics.latest
        return None if latest is None else dict(latest)

    def note_unknown_features(self) -> None:
        """The record just learned carried features outside the schema that its caller dropped
        before ``learn_one`` (the engine conforms records to the schema first): count it as
        ``learn_one`` counts those it ignores itself."""
        self._input.schema.unknown_records += 1

    def state_dict(self) -> dict:
        state = super().state_dict()
        if self._metrics is not None:
            state["metrics"] = self._metrics.state_dict()
        return state

    def load_state_dict(self, state: dict) -> None:
        super().load_state_dict(state)
        if self._metrics is not None:
            self._metrics.load_state_dict(state.get("metrics"), self.budget, self._noise)

    def _describe_metrics(self) -> str:
        m = self._metrics
        if m is None:
            return ""
        plan = m.plan(self.budget)
        text = f"; DP operator metrics: {m.share:g} of ρ ({m.noise} noise, one charge)"
        if "sum_std" in plan and plan["at"] > 1:
            std = plan["sum_std"]
            text += (
                f", noise std at step {plan['at']}: average penalty ±"
                f"{std['penalty'] / (plan['at'] - 1):.2g}, clip rate ±"
                f"{std['clipped'] / plan['at']:.2g}"
            )
        return text
