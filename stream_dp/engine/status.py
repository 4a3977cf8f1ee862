"""The operator's view of a running engine: ``status.json`` and, only on request, raw metrics.

``status.json`` holds what is safe to show an operator's dashboard: counters (records, learned,
releases, dead letters per reason, unknown feature names), the privacy budget, consumer lag,
since when the input has been idle and since when the broker has been unreachable. Nothing in
it is computed from record *values*, so it carries no un-noised learning statistic.

Statistics that are (the learner's running average penalty) go to a separate file only when the
operator names one (``status.operator_raw_metrics``); both files are mode 0600. Differentially
private versions of those statistics, released with their own charge on the learner's ledger,
belong in :func:`dp_operator_metrics`.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

from stream_dp.checkpoint import write_private

__all__ = ["StatusWriter", "dp_operator_metrics", "raw_operator_metrics"]


def dp_operator_metrics(learner: Any) -> dict[str, Any]:
    """Differentially private operator metrics for ``status.json`` (the hook where they go).

    None are released yet: this returns ``{}``. A metric added here must be a release with its
    own charge on ``learner.accountant`` (e.g. the running average penalty through a
    continual-release mechanism), never a raw statistic.
    """
    return {}


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
