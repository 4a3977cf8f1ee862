"""The operator's view of a running engine: ``status.json`` and, only on request, raw metrics.

``status.json`` holds what is safe to show an operator's dashboard: counters (records, learned,
releases, dead letters per reason, unknown feature names), the privacy budget, consumer lag,
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
from pathlib import Path
from typing import Any

from stream_dp.checkpoint import write_private

__all__ = [
    "StatusWriter",
    "dp_metrics_summary",
    "dp_operator_metrics",
    "note_unknown_features",
    "raw_operator_metrics",
]


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


def note_unknown_features(learner: Any) -> None:
    """Count a learned record whose unknown features the engine dropped before ``learn_one``
    (the learner's private metrics count it; a learner without them ignores this)."""
    note = getattr(learner, "note_unknown_features", None)
    if note is not None:
        note()


def raw_operator_metrics(learner: Any) -> dict[str, Any]:
    """Statistics computed from raw records: NOT differentially private (operator file only)."""
    return {
        "average_penalty": learner.regret.average_penalty,
        "penalty_steps": learner.regret.steps,
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
