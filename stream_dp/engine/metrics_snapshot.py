"""What the engine's metrics endpoint may show: a frozen snapshot of public and released values.

The engine's status reporter computes its status at every status interval; the metrics
endpoint (:mod:`stream_dp.engine.prometheus`) serves the latest :class:`EngineSnapshot` taken
from it. A snapshot holds only what ``docs/privacy.md``'s threat model treats as public --
counts of records, releases and rejections (with their reasons), the step, positions and lag,
commit cycles, partitions, times -- the ledger's ε and ρ, which are data-independent, and the
operator metrics the learner has *released* under differential privacy
(:class:`DPOperatorMetrics`). It has no field for a statistic computed from record values (the
raw average penalty, the counts of clipped records or of records with unknown features): those
stay in the operator's raw-metrics file. :meth:`LearnerSnapshot.from_status` copies the fields
it names from a status and nothing else, so a status that carries more never leaks it here.

Every instance of a model (the single engine, or one instance of a per-partition scale-out)
has one snapshot, with one :class:`LearnerSnapshot` per partition learner it runs.
"""

from __future__ import annotations

import time
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any, Literal

__all__ = ["DPOperatorMetrics", "EngineSnapshot", "LearnerSnapshot"]


@dataclass(frozen=True)
class DPOperatorMetrics:
    """The operator metrics a learner has released under DP, each with its noise's std.

    Parameters are :meth:`stream_dp.operator_metrics.OperatorMetricsMixin.release_metrics`'s
    values of the same names; ``average_penalty`` is None before a step was scored.

    Examples
    --------
    >>> m = DPOperatorMetrics.from_release({"average_penalty": 0.7, "average_penalty_std": 0.04,
    ...     "clip_rate": 0.03, "clip_rate_std": 0.01, "unknown_feature_rate": 0.0,
    ...     "unknown_feature_rate_std": 0.01, "step": 200, "private": True})
    >>> m.average_penalty, m.clip_rate
    (0.7, 0.03)
    >>> DPOperatorMetrics.from_release({}) is None
    True

    """

    average_penalty: float | None
    average_penalty_std: float | None
    clip_rate: float
    clip_rate_std: float
    unknown_feature_rate: float
    unknown_feature_rate_std: float

    @classmethod
    def from_release(cls, released: Mapping[str, Any] | None) -> DPOperatorMetrics | None:
        """From a release of the learner's private metrics (None or ``{}``: none released)."""
        if not released:
            return None

        def opt(key: str) -> float | None:
            value = released.get(key)
            return None if value is None else float(value)

        return cls(
            average_penalty=opt("average_penalty"),
            average_penalty_std=opt("average_penalty_std"),
            clip_rate=float(released["clip_rate"]),
            clip_rate_std=float(released["clip_rate_std"]),
            unknown_feature_rate=float(released["unknown_feature_rate"]),
            unknown_feature_rate_std=float(released["unknown_feature_rate_std"]),
        )


@dataclass(frozen=True)
class LearnerSnapshot:
    """One learner's counters, budget and released metrics at one status report.

    Parameters
    ----------
    learner_id
        The learner's model id (``<model_id>/p<k>`` for partition k's learner).
    partition
        The input partition it learns (per-partition scale-out); None for the single engine.
    run_id
        The run it learns (None before start-up).
    private
        False for a declared non-private (reproducible) run.
    step
        The learner's step t.
    records, learned, releases, skipped_records
        Input messages handled, records learned, releases made, records skipped because their
        offsets left the log.
    dead_letters
        Records rejected, by reason (``budget_exhausted`` included), as sorted pairs.
    consumer_lag
        Records on the broker not yet learned (None: not measured).
    consumer_lags
        The same per input partition: its end offset minus the learner's position, as sorted
        ``(partition, lag)`` pairs (empty: not measured).
    epsilon_spent, epsilon_budget, delta, rho_spent, rho_budget
        The ledger's guarantee so far and the budget.
    exhausted
        The budget is spent: the model serves its last release.
    commit_cycle
        The run's current commit cycle (its number; None: not reported).
    last_published_at
        ``time.time()`` of this process's last publication (None: none yet).
    pending_messages
        Messages waiting to be published (the outbox and the cycle in flight).
    idle
        The input is idle.
    dp_metrics
        The learner's released operator metrics (None without a ``metrics_share``).
    """

    learner_id: str
    partition: int | None
    run_id: str | None
    private: bool
    step: int
    records: int
    learned: int
    releases: int
    skipped_records: int
    dead_letters: tuple[tuple[str, int], ...]
    consumer_lag: int | None
    epsilon_spent: float
    epsilon_budget: float | None
    delta: float
    rho_spent: float
    rho_budget: float | None
    exhausted: bool
    commit_cycle: int | None
    last_published_at: float | None
    pending_messages: int
    idle: bool
    dp_metrics: DPOperatorMetrics | None = None
    consumer_lags: tuple[tuple[int, int], ...] = ()

    @classmethod
    def from_status(
        cls, status: Mapping[str, Any], *, partition: int | None = None
    ) -> LearnerSnapshot:
        """The snapshot of an engine's status (:meth:`Engine.status`): the named fields only.

        A field the status lacks raises ``KeyError`` (the status and the snapshot must not
        drift apart silently), except ``commit_cycle`` and ``consumer_lag_by_partition``,
        which are optional.

        Examples
        --------
        >>> status = {"model_id": "bank/p3", "run_id": "9f2c", "private": True, "step": 120,
        ...     "records": 125, "learned": 120, "releases": 12, "skipped_records": 0,
        ...     "dead_letter_reasons": {"invalid_json": 5}, "consumer_lag": 40,
        ...     "epsilon_spent": 0.31, "epsilon_budget": 1.0, "delta": 1e-05, "rho_spent": 0.002,
        ...     "rho_budget": 0.01, "exhausted": False, "commit_cycle": 3,
        ...     "last_published_at": None, "pending_messages": 17, "idle_since": None,
        ...     "dp_metrics": {}, "average_penalty": 0.6931,
        ...     "consumer_lag_by_partition": {"3": 40}}
        >>> s = LearnerSnapshot.from_status(status, partition=3)
        >>> s.learner_id, s.partition, s.dead_letters, s.consumer_lag, s.dp_metrics
        ('bank/p3', 3, (('invalid_json', 5),), 40, None)
        >>> s.consumer_lags
        ((3, 40),)
        >>> hasattr(s, "average_penalty")  # a raw statistic in the status is not copied
        False

        """

        def opt(value: Any, kind: type) -> Any:
            return None if value is None else kind(value)

        reasons = status["dead_letter_reasons"]
        lags = status.get("consumer_lag_by_partition") or {}
        return cls(
            learner_id=str(status["model_id"]),
            partition=None if partition is None else int(partition),
            run_id=opt(status["run_id"], str),
            private=bool(status["private"]),
            step=int(status["step"]),
            records=int(status["records"]),
            learned=int(status["learned"]),
            releases=int(status["releases"]),
            skipped_records=int(status["skipped_records"]),
            dead_letters=tuple(sorted((str(r), int(n)) for r, n in reasons.items())),
            consumer_lag=opt(status["consumer_lag"], int),
            epsilon_spent=float(status["epsilon_spent"]),
            epsilon_budget=opt(status["epsilon_budget"], float),
            delta=float(status["delta"]),
            rho_spent=float(status["rho_spent"]),
            rho_budget=opt(status["rho_budget"], float),
            exhausted=bool(status["exhausted"]),
            commit_cycle=opt(status.get("commit_cycle"), int),
            last_published_at=opt(status["last_published_at"], float),
            pending_messages=int(status["pending_messages"]),
            idle=status["idle_since"] is not None,
            dp_metrics=DPOperatorMetrics.from_release(status["dp_metrics"]),
            consumer_lags=tuple(sorted((int(k), int(n)) for k, n in lags.items())),
        )


@dataclass(frozen=True)
class EngineSnapshot:
    """One instance of a model: whether it learns, its partitions and its learners.

    Parameters
    ----------
    model_id
        The configured model id (partition learners' ids extend it).
    up
        The instance learns: start-up is done and it is not stopping.
    mode
        The config's ``scale.mode``.
    learners
        The learners this instance runs (one for the single engine).
    partitions_held
        Input partitions this instance learns (None: not known, e.g. a file source).
    broker_unreachable
        Kafka is unreachable (the engine rides the outage out); None: not known.
    time
        ``time.time()`` when the snapshot was taken.

    Examples
    --------
    >>> s = EngineSnapshot.starting("bank")
    >>> s.up, s.learners
    (False, ())

    """

    model_id: str
    up: bool
    mode: Literal["single", "per-partition"] = "single"
    learners: tuple[LearnerSnapshot, ...] = ()
    partitions_held: int | None = None
    broker_unreachable: bool | None = None
    time: float = field(default_factory=time.time)

    @classmethod
    def starting(cls, model_id: str, mode: Literal["single", "per-partition"] = "single"):
        """The snapshot of an instance that has not finished its start-up."""
        return cls(model_id=model_id, up=False, mode=mode)
