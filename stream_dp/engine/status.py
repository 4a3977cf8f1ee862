"""The operator's view of a running engine: ``status.json`` and, only on request, raw metrics.

``status.json`` holds what is safe to show an operator's dashboard: counters (records, learned,
releases, dead letters per reason, unknown features), the privacy budget, consumer lag,
since when the input has been idle and since when the broker has been unreachable. Nothing in
it is computed from record *values*, so it carries no un-noised learning statistic.

Statistics that are (the learner's running average penalty) go to a separate file only when the
operator names one (``status.operator_raw_metrics``); both files are mode 0600. Their
differentially private versions, released with their own charge on the learner's ledger (the
config's ``[model] metrics_share``), are ``status.json``'s ``dp_metrics`` and the log's ``dp:``
fields (:func:`dp_operator_metrics`).
"""

from __future__ import annotations

import json
import logging
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from stream_dp.checkpoint import write_private
from stream_dp.engine.learning import Handled, Outcome
from stream_dp.engine.metrics_snapshot import EngineSnapshot, LearnerSnapshot

__all__ = [
    "EngineStats",
    "StatusReporter",
    "StatusWriter",
    "dp_metrics_summary",
    "dp_operator_metrics",
    "raw_operator_metrics",
]

log = logging.getLogger("stream_dp.engine")


def dp_operator_metrics(learner: Any) -> dict[str, Any]:
    """Differentially private operator metrics for ``status.json``: ``{}`` unless the model has
    a metrics share (the config's ``[model] metrics_share``).

    Each call releases the learner's metrics at its current step through its continual-release
    mechanism (:meth:`~stream_dp.operator_metrics.OperatorMetricsMixin.release_metrics`): the
    first call charges the whole mechanism to ``learner.accountant`` (``"gaussian-metrics"``)
    before any value exists; later ones are post-processing. Never a raw statistic.
    """
    release = getattr(learner, "release_metrics", None)
    values = release() if release is not None else None
    return {} if values is None else values


def dp_metrics_summary(metrics: dict[str, Any]) -> str:
    """The private metrics for the INFO log line (``""`` without them).

    Examples
    --------
    >>> dp_metrics_summary({"average_penalty": 0.71234, "average_penalty_std": 0.0412,
    ...                     "clip_rate": 0.0312, "clip_rate_std": 0.0101})
    ' dp: avg_penalty=0.712±0.041 clip_rate=0.031±0.01'
    >>> dp_metrics_summary({})
    ''

    """
    if not metrics:
        return ""
    penalty = metrics.get("average_penalty")
    text = " dp:"
    if penalty is not None:
        text += f" avg_penalty={penalty:.3g}±{metrics['average_penalty_std']:.2g}"
    return text + f" clip_rate={metrics['clip_rate']:.2g}±{metrics['clip_rate_std']:.2g}"


def raw_operator_metrics(learner: Any) -> dict[str, Any]:
    """Statistics computed from raw records: NOT differentially private (operator file only)."""
    return {
        "average_penalty": learner.regret.average_penalty,
        "penalty_steps": learner.regret.steps,
        "clipped_records": learner.n_clipped,  # ‖x‖ > R: many mean badly scaled features
        "learned_records": learner.step,
    }


class StatusWriter:
    """Writes ``status.json`` and the optional raw-metrics file, atomically, mode 0600.

    Parameters
    ----------
    path : str, optional
        ``status.json``; None writes nothing.
    raw_path : str, optional
        The operator's raw-metrics file; None (the default) never computes them.

    Examples
    --------
    >>> import tempfile, os, json
    >>> d = tempfile.mkdtemp()
    >>> w = StatusWriter(os.path.join(d, "status.json"))
    >>> w.write({"step": 3})
    >>> json.load(open(os.path.join(d, "status.json"))), oct(os.stat(w.path).st_mode & 0o777)
    ({'step': 3}, '0o600')
    """

    def __init__(self, path: str | None, raw_path: str | None = None) -> None:
        self.path = Path(path) if path else None
        self.raw_path = Path(raw_path) if raw_path else None

    def write(self, status: dict[str, Any], raw: dict[str, Any] | None = None) -> None:
        """Replace the files (not fsynced: a status lost in a power cut is rewritten soon)."""
        if self.path is not None:
            self.path.parent.mkdir(parents=True, exist_ok=True)
            write_private(self.path, json.dumps(status, default=str).encode(), durable=False)
        if self.raw_path is not None and raw is not None:
            self.raw_path.parent.mkdir(parents=True, exist_ok=True)
            blob = json.dumps({**raw, "private": False}, default=str).encode()
            write_private(self.raw_path, blob, durable=False)


@dataclass
class EngineStats:
    """Counters of the model's run (restored from the checkpoint on restart), counted from each
    record's :class:`~stream_dp.engine.learning.Outcome`."""

    records: int = 0
    learned: int = 0
    releases: int = 0
    dead_letters: int = 0
    exhausted_skipped: int = 0
    #: Valid records a unit-level model's contribution bound dropped (committed, unpublished).
    dropped: int = 0
    unknown_features: int = 0
    records_with_unknown_features: int = 0
    started: float = field(default_factory=time.time)
    #: Dead letters by reason (``budget_exhausted`` included).
    reasons: dict[str, int] = field(default_factory=dict)

    def count(self, done: Handled) -> None:
        """Count one input message by what became of it."""
        self.records += 1
        if done.unknown:
            self.unknown_features += done.unknown
            self.records_with_unknown_features += 1
        outcome = done.outcome
        if outcome is Outcome.RELEASED:
            self.learned += 1
            self.releases += 1
        elif outcome is Outcome.LEARNED:
            self.learned += 1
        elif outcome is Outcome.DROPPED:
            self.dropped += 1
        else:  # a dead letter, keyed by its reason
            if outcome is Outcome.REJECTED:
                self.dead_letters += 1
            else:
                self.exhausted_skipped += 1
            self.reasons[done.key] = self.reasons.get(done.key, 0) + 1

    def to_dict(self) -> dict:
        return {
            "records": self.records,
            "learned": self.learned,
            "releases": self.releases,
            "dead_letters": self.dead_letters,
            "exhausted_skipped": self.exhausted_skipped,
            "dropped": self.dropped,
            "unknown_features": self.unknown_features,
            "records_with_unknown_features": self.records_with_unknown_features,
        }

    def to_meta(self) -> dict:
        """What a checkpoint keeps of the counters."""
        return {"stats": self.to_dict(), "dead_counts": dict(self.reasons)}

    def restore(self, meta: dict) -> None:
        """The counters a checkpoint's meta holds (:meth:`to_meta`)."""
        for k, v in meta.get("stats", {}).items():
            setattr(self, k, v)
        self.reasons = dict(meta.get("dead_counts", {}))


class StatusReporter:
    """The engine's status: ``status.json`` and the log's status line, every
    ``status.interval_seconds``.

    Parameters
    ----------
    config : EngineConfig
    learner
        The engine's learner (its step, budget and private metrics).
    stats : EngineStats
    clock : callable, default time.monotonic
    metrics : MetricsServer, optional
        The Prometheus endpoint (:mod:`stream_dp.engine.prometheus`): every report hands it
        the :meth:`snapshot` of the status it reports.
    """

    def __init__(
        self,
        config: Any,
        learner: Any,
        stats: EngineStats,
        clock: Callable[[], float] = time.monotonic,
        metrics: Any = None,
    ) -> None:
        self.config, self.learner, self.stats, self.clock = config, learner, stats, clock
        self.metrics = metrics
        self.writer = StatusWriter(config.status.file, config.status.operator_raw_metrics)
        self.interval = config.status.interval_seconds
        self._at = clock()
        self._records_at = 0

    def due(self, now: float) -> bool:
        """Whether a status is due at ``now`` (of :attr:`clock`)."""
        return now - self._at >= self.interval

    def status(
        self,
        now: float | None = None,
        *,
        probe: bool = True,
        source: Any = None,
        cycle: Any = None,
        idle_since: float | None = None,
        unreachable_since: float | None = None,
        dp: bool = True,
    ) -> dict:
        """Operator status: counters, budget, lag, idleness, outages (no raw statistics).

        ``source`` (its lag, asked only with ``probe``) and ``cycle`` (the commit cycle) are
        the engine's once it has started. Without ``dp`` the learner's private metrics are
        not released (``dp_metrics`` is ``{}``): the first release charges their mechanism.
        """
        now = self.clock() if now is None else now
        elapsed = max(now - self._at, 1e-9)
        stats, learner = self.stats, self.learner
        rate = (stats.records - self._records_at) / elapsed
        acc = learner.accountant
        eps, delta = acc.spent()
        lag, lags = self._lag(source) if probe else (None, None)
        published, published_at = (0, None) if cycle is None else cycle.last_published
        pending = 0 if cycle is None else len(cycle.outbox) + cycle.in_flight
        return {
            "time": time.time(),
            "model_id": self.config.model.model_id,
            "run_id": None if cycle is None else cycle.run_id,
            "private": not self.config.model.reproducible,
            "records_per_s": round(rate, 1),
            "step": learner.step,
            "epsilon_spent": eps,
            "epsilon_budget": learner.epsilon,
            "delta": delta,
            "rho_spent": acc.rho_spent(),
            "rho_budget": learner.budget.limit,
            "exhausted": learner.exhausted,
            "dead_letter_reasons": dict(stats.reasons),
            "consumer_lag": lag,
            "consumer_lag_by_partition": lags,
            "partitions_held": getattr(source, "partitions_held", None),
            "skipped_records": getattr(source, "skipped_records", 0),
            "idle_since": idle_since,
            "broker_unreachable_since": unreachable_since,
            "commit_cycle": None if cycle is None else cycle.seq,
            "last_published_cycle": published,
            "last_published_at": published_at,
            "pending_messages": pending,
            **stats.to_dict(),
            "dp_metrics": dp_operator_metrics(learner) if dp else {},
            "privacy": learner.guarantee(),
        }

    @staticmethod
    def _lag(source: Any) -> tuple[int | None, dict[str, int] | None]:
        """The source's lag, in total and per input partition (None: not measured)."""
        lags_fn, lag_fn = getattr(source, "lags", None), getattr(source, "lag", None)
        try:
            if lags_fn is not None:
                lags = lags_fn(timeout_s=2.0)
                if lags is None:
                    return None, None
                return sum(lags.values()), {str(k): int(v) for k, v in sorted(lags.items())}
            if lag_fn is not None:
                try:
                    return lag_fn(timeout_s=2.0), None
                except TypeError:
                    return lag_fn(), None
        except Exception:  # noqa: BLE001 - status must never stop the engine
            pass
        return None, None

    def snapshot(self, status: dict, *, up: bool = True) -> EngineSnapshot:
        """What the metrics endpoint serves of ``status`` (from :meth:`status`): the fields
        :meth:`LearnerSnapshot.from_status` names, and nothing else."""
        return EngineSnapshot(
            model_id=status["model_id"],
            up=up,
            learners=(LearnerSnapshot.from_status(status),),
            partitions_held=status["partitions_held"],
            broker_unreachable=status["broker_unreachable_since"] is not None,
            time=status["time"],
        )

    def publish(self, status: dict, *, up: bool = True) -> None:
        """Hand the metrics endpoint (if any) the snapshot of ``status``."""
        if self.metrics is not None:
            self.metrics.update(self.snapshot(status, up=up))

    def report(self, status: dict, now: float, *, up: bool = True) -> None:
        """Log ``status`` (from :meth:`status` at ``now``) in one line, write the files and
        serve it on the metrics endpoint (``up``: the engine is learning, not stopping)."""
        s = status
        log.info(
            "step=%d rec/s=%.0f ε=%.4g/%.4g dead=%d lag=%s releases=%d pending=%d%s%s",
            s["step"],
            s["records_per_s"],
            s["epsilon_spent"],
            s["epsilon_budget"],
            s["dead_letters"],
            s["consumer_lag"],
            s["releases"],
            s["pending_messages"],
            " (idle)" if s["idle_since"] else "",
            dp_metrics_summary(s["dp_metrics"]),
        )
        raw = raw_operator_metrics(self.learner) if self.writer.raw_path else None
        try:
            self.writer.write(s, raw)
        except OSError as err:
            log.warning("cannot write status: %s", err)
        self.publish(s, up=up)
        self._at = now
        self._records_at = self.stats.records
