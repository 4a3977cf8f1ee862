"""What a record must be before it touches an online learner: schema, label, norm clip.

A record is validated without changing any state (a rejected record leaves no trace), then
*accepted*: only then is a new metric class registered and the operator-only counters moved.
Two warnings, each once, point at a pipeline that does not fit the learner: most records
clipped (features not scaled), and declared features that never arrive while features outside
the schema do (a schema declared before a one-hot encoder, say).
Features outside the declared schema are ignored and counted, missing ones are 0; every ``x`` is
clipped to ``‖x‖₂ ≤ R``, which the privacy proof needs (``docs/privacy.md``, *Privacy unit and
neighbouring streams*). Batches are validated row by row in bulk, with the same result as one
record at a time.
"""

from __future__ import annotations

import warnings

import numpy as np

from stream_dp.records import (
    FeatureSchema,
    LabelCodes,
    RecordError,
    auc_label,
    clip_rows,
)

__all__ = ["CLIP_WARN_AFTER", "CLIP_WARN_FRACTION", "FEATURES_WARN_AFTER", "RecordInput"]

#: The clip-rate warning looks at the clip counter from this many accepted records on ...
CLIP_WARN_AFTER = 100
#: ... and warns (once) when more than this fraction of them were clipped.
CLIP_WARN_FRACTION = 0.5
#: From this many accepted records on, declared features that none of them carried, while some
#: carried features outside the schema, are warned about (once).
FEATURES_WARN_AFTER = 100


def _is_frame(X) -> bool:
    return hasattr(X, "columns") and hasattr(X, "to_numpy") and hasattr(X, "iloc")


def _auc_codes(y, k: int) -> np.ndarray | None:
    """:func:`auc_label` of the first k labels of a bool or numeric array, vectorised, stopping
    before the first invalid one; None for other inputs (then each label is coded alone)."""
    v = getattr(y, "values", y)  # pandas Series → its array
    if not isinstance(v, np.ndarray) or v.ndim != 1:
        return None
    v = v[:k]
    if v.dtype == bool:
        return np.where(v, 1.0, -1.0)
    if v.dtype.kind not in "iuf":
        return None
    bad = np.flatnonzero(~((v == 1) | (v == 0) | (v == -1)))
    if len(bad):
        v = v[: bad[0]]
    return np.where(v == 1, 1.0, -1.0)


class RecordInput:
    """Schema, label codes and the clip radius of one learner, with operator-only counters.

    Parameters
    ----------
    task
        ``"auc"`` (labels True/False, 1/0 or ±1) or ``"metric"`` (any hashable class label).
    features
        The declared schema (names, or their number d for array input); None lets the first
        learned record fix it (non-private learners only).
    radius
        R: every record is clipped to ``‖x‖₂ ≤ R``.
    warn_clipping
        Warn once when most records are clipped (default). False when the learner clips by
        design (OnPairMF's default ``R = ½`` under features scaled to ``‖x‖ ≲ 1``).

    Examples
    --------
    >>> inp = RecordInput("auc", ("a", "b"), radius=1.0)
    >>> xv, yv = inp.validate({"a": 3.0, "b": 4.0, "zz": 1.0}, True)
    >>> inp.accept(True)
    >>> xv.round(12).tolist(), yv, inp.n_clipped, inp.n_unknown
    ([0.6, 0.8], 1.0, 1, 1)

    """

    def __init__(self, task: str, features, radius: float, warn_clipping: bool = True) -> None:
        self.task = task
        self.radius = float(radius)
        self.schema = FeatureSchema(features)
        self.labels = LabelCodes()
        self._declared = features
        #: Accepted records whose norm exceeded R (they were clipped). Operator-only.
        self.n_clipped = 0
        #: Accepted records. Operator-only.
        self.n_accepted = 0
        self.clip_warned = not warn_clipping
        #: Positions of the declared features no accepted record has carried yet (None: not
        #: watched, because the schema was not declared or every feature has arrived).
        self.never_seen: set[int] | None = None
        self.features_warned = False
        if self.schema.names is not None:
            self._watch(set(range(len(self.schema.names))))

    def _watch(self, never_seen: set[int] | None) -> None:
        self.never_seen = never_seen or None
        self.schema.track_presence = self.never_seen is not None

    @property
    def n_unknown(self) -> int:
        """Accepted records that carried features outside the schema (ignored). Operator-only."""
        return self.schema.unknown_records

    @property
    def names(self) -> tuple | None:
        return self.schema.names

    # -- one record -------------------------------------------------------------------------
    def validate(self, x, y) -> tuple[np.ndarray, float]:
        """The clipped vector and label code of a record, or :class:`RecordError`."""
        schema = self.schema
        fresh = schema.names is None
        try:
            xv = schema.to_clipped(x, self.radius, learning=True)
            if self.task != "auc":
                yv = self.labels.encode(y, register=False)
            elif y is True or y is False:  # auc_label's first cases, without the call
                yv = 1.0 if y else -1.0
            elif type(y) is int and -1 <= y <= 1:  # 1 → +1; 0 and -1 → -1 (JSON's labels)
                yv = 1.0 if y == 1 else -1.0
            else:
                yv = auc_label(y)
        except RecordError:
            if fresh:
                schema.__init__(self._declared)  # undo a schema taken from a rejected record
            raise
        return xv, yv

    def accept(self, y) -> None:
        """The record just validated is learned: register its class, count what was dropped."""
        schema = self.schema
        if schema.last_unknown:
            schema.unknown_records += 1
        self.n_accepted += 1
        if schema.last_clipped:
            self.n_clipped += 1
            if not self.clip_warned:
                self._check_clip_rate()
        if schema.track_presence:
            self._note_features(schema.last_present)
        if self.task == "metric":
            self.labels.encode(y)

    def _note_features(self, present: list[int] | None) -> None:
        """Accepted records carried the declared features ``present`` (None: all of them).

        Warns once when some declared features never arrived in the first
        :data:`FEATURES_WARN_AFTER` records while features outside the schema did: the model
        then learns on part of its schema only, usually because the schema names a column a
        preprocessing step renames (a one-hot encoder's ``color`` becomes ``color_red``, ...).
        The warning names the declared features (the public schema), never the unknown ones,
        which come from the data.
        """
        never = self.never_seen
        if present is None:
            never.clear()
        else:
            never.difference_update(present)
        if not never:
            self._watch(None)
            return
        if self.n_accepted < FEATURES_WARN_AFTER or not self.schema.unknown_records:
            return
        names = self.schema.names
        missing = [names[i] for i in sorted(never)]
        shown = ", ".join(repr(n) for n in missing[:10]) + (" ..." if len(missing) > 10 else "")
        self.features_warned = True
        self._watch(None)
        warnings.warn(
            f"{len(missing)} declared feature(s) never arrived in the first {self.n_accepted} "
            f"records ({shown}) while {self.schema.unknown_records} of them carried features "
            "outside the schema, which are ignored: the model learns on the rest of its schema "
            "only. Declare the features as the learner receives them (after any encoder, e.g. "
            "a one-hot encoder's columns); the count is the learner's unknown_features",
            UserWarning,
            stacklevel=4,
        )

    def _check_clip_rate(self) -> None:
        """Warn once when most records are clipped: the model then sees little more than their
        directions, usually because the features are not scaled (operator-only numbers, shown
        only to whoever runs the learner)."""
        if self.n_accepted < CLIP_WARN_AFTER or self.n_clipped <= CLIP_WARN_FRACTION * (
            self.n_accepted
        ):
            return
        self.clip_warned = True
        warnings.warn(
            f"{self.n_clipped} of the first {self.n_accepted} records had ‖x‖ > R = "
            f"{self.radius:g} and were clipped to norm R: the model learns little more than "
            "their directions. Scale the features to ‖x‖ ≲ R with public statistics "
            "(stream_dp.preprocessing.PublicScaler) or private ones (ScaledLearner("
            "PrivateScaler(...), learner)); the count is the learner's n_clipped",
            UserWarning,
            stacklevel=4,
        )

    # -- batches ----------------------------------------------------------------------------
    def validate_batch(self, X, y) -> tuple[np.ndarray, np.ndarray, np.ndarray] | None:
        """Clipped rows, label codes and which rows were clipped, for the valid prefix of a
        batch (its first k rows).

        Rows after k (the first invalid one onwards) are left to one-record validation, which
        raises as ``learn_one`` would. None when the batch cannot be judged in bulk (no schema
        yet, object columns, unknown DataFrame columns, …): then every row goes alone.
        """
        self.schema.last_present = None
        A = self._rows(X)
        if A is None:
            return None
        m = len(A)
        finite = np.isfinite(A).all(axis=1)
        k = m if finite.all() else int(np.argmin(finite))
        codes = _auc_codes(y, k) if self.task == "auc" else None
        if codes is None:
            labels = list(y)[:k]
            codes = np.empty(k)
            if self.task == "auc":
                code = auc_label
            else:  # provisional codes; registered for real only as records are accepted
                scratch = LabelCodes()
                scratch.codes = dict(self.labels.codes)
                code = scratch.encode
            for i in range(k):
                try:
                    codes[i] = code(labels[i])
                except RecordError:
                    k = i
                    break
        k = min(k, len(codes))
        rows = clip_rows(A[:k], self.radius)
        clipped = np.any(rows != A[:k], axis=1)
        return rows, codes[:k], clipped

    def accept_batch(self, clipped: np.ndarray, labels) -> None:
        """Rows of :meth:`validate_batch` are learned (``clipped``: which of them were)."""
        n = int(np.count_nonzero(clipped))
        self.n_accepted += len(clipped)
        self.n_clipped += n
        if n and not self.clip_warned:
            self._check_clip_rate()
        if self.schema.track_presence and len(clipped):
            self._note_features(self.schema.last_present)
        if self.task == "metric":
            for label in labels:
                self.labels.encode(label)

    def _rows(self, X) -> np.ndarray | None:
        names = self.schema.names
        if names is None:
            return None
        if _is_frame(X):
            index = {n: i for i, n in enumerate(names)}
            if any(c not in index for c in X.columns):
                return None
            if not all(np.issubdtype(t, np.number) or np.issubdtype(t, np.bool_) for t in X.dtypes):
                return None
            A = np.zeros((len(X), len(names)))
            for col in X.columns:
                A[:, index[col]] = X[col].to_numpy(dtype=float)
            if self.schema.track_presence and len(X.columns) < len(names):
                self.schema.last_present = [index[col] for col in X.columns]
            return A
        try:
            A = np.asarray(X)
        except (ValueError, TypeError, OverflowError):  # ragged rows, undecodable bytes, ...
            return None
        if A.ndim != 2 or A.shape[1] != len(names) or A.dtype.kind not in "biuf":
            return None
        with np.errstate(over="ignore", invalid="ignore"):  # too large for a double: inf, rejected
            return A.astype(float)

    @staticmethod
    def row(X, i: int):
        """Row i of a batch as ``learn_one`` takes it."""
        return X.iloc[i].to_dict() if _is_frame(X) else X[i]

    @staticmethod
    def rest(X, i: int):
        """The batch from row i on."""
        return X.iloc[i:] if _is_frame(X) else X[i:]

    # -- prediction -------------------------------------------------------------------------
    def model_input(self, x) -> np.ndarray | None:
        """A record as the model sees it at prediction time (schema order, clipped)."""
        if self.schema.names is None:
            return None
        return self.schema.to_clipped(x, self.radius, learning=False)

    def model_inputs(self, X) -> np.ndarray | None:
        """Rows of a 2-D array or a DataFrame as the model sees them (schema order, clipped):
        unknown columns are ignored, missing ones are 0, non-finite values raise."""
        names = self.schema.names
        if names is None:
            return None
        if _is_frame(X):
            A = np.zeros((len(X), len(names)))
            index = {n: i for i, n in enumerate(names)}
            for col in X.columns:
                if col in index:
                    A[:, index[col]] = X[col].to_numpy(dtype=float)
        else:
            A = np.asarray(X, dtype=float)
            if A.ndim != 2 or A.shape[1] != len(names):
                raise RecordError("wrong_dimension", f"expected rows of {len(names)} features")
        if not np.isfinite(A).all():
            raise RecordError("non_finite", "features must be finite (no NaN or inf)")
        return clip_rows(A, self.radius)

    # -- checkpoints ------------------------------------------------------------------------
    def state_dict(self) -> dict:
        return {
            "schema": self.schema.names,
            "labels": dict(self.labels.codes),
            "n_clipped": self.n_clipped,
            "n_accepted": self.n_accepted,
            "clip_warned": self.clip_warned,
            "n_unknown": self.schema.unknown_records,
            "features_warned": self.features_warned,
            "never_seen": None if self.never_seen is None else sorted(self.never_seen),
        }

    def load_state_dict(self, state: dict) -> None:
        if state["schema"] is not None:
            self.schema = FeatureSchema(tuple(state["schema"]))
        self.schema.unknown_records = int(state.get("n_unknown", 0))
        self.labels.codes = dict(state["labels"])
        self.n_clipped = int(state.get("n_clipped", 0))
        self.n_accepted = int(state.get("n_accepted", 0))
        self.clip_warned = bool(state.get("clip_warned", False))
        self.features_warned = bool(state.get("features_warned", False))
        never = state.get("never_seen")
        self._watch(None if never is None else {int(i) for i in never})
