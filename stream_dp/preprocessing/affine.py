"""The record-wise map both scalers apply: clip declared features to their bounds, centre, divide.

A scaler of :mod:`stream_dp.preprocessing` maps one record at a time, with statistics it holds
(public ones, or privately released ones), never with the record's neighbours in the stream:

- a *scaled* feature ``j`` becomes ``(clip(x_j, a_j, b_j) − centre_j) / (spread_j · norm)``;
- every other feature of the schema is divided by ``norm`` (one factor for the whole vector, so
  that ``‖x‖ ≤ R`` clips few records);
- a scaled feature missing from a dict record becomes 0 (its centre, as in river); features
  outside a declared schema are copied unchanged (the learners ignore and count them).

Non-numeric and non-finite values raise :class:`~stream_dp.records.InvalidRecord`, as the
learners do, before anything is learned. The same arithmetic serves dicts, 1-D arrays,
2-D arrays and DataFrames, bit for bit (``tests/test_preprocessing.py``).
"""

from __future__ import annotations

import math
from collections.abc import Hashable, Mapping, Sequence

import numpy as np
from river import base

from stream_dp.records import FeatureSchema, InvalidRecord

__all__ = ["AffineScaler", "check_bounds", "schema_names"]


def schema_names(features: Sequence[Hashable] | int | None) -> tuple | None:
    """A declared schema as a tuple of names (``x0 … x{d−1}`` for an int d, as the learners
    name array columns), or None."""
    if features is None:
        return None
    if isinstance(features, str | bytes):
        raise ValueError("features must be a sequence of names, not one string")
    try:
        return FeatureSchema(features).names
    except InvalidRecord:
        raise ValueError(f"features must be a positive int or names, got {features!r}") from None


def check_bounds(bounds: Mapping) -> tuple[tuple, np.ndarray, np.ndarray]:
    """The names and the (lower, upper) arrays of ``{name: (lower, upper)}``; ValueError unless
    every pair is finite with ``lower < upper``."""
    if not isinstance(bounds, Mapping) or not bounds:
        raise ValueError("bounds must be a non-empty dict {feature: (lower, upper)}")
    names, lower, upper = [], [], []
    for name, pair in bounds.items():
        try:
            a, b = (float(v) for v in pair)
        except (TypeError, ValueError):
            raise ValueError(f"bounds[{name!r}] must be a pair (lower, upper)") from None
        if not (math.isfinite(a) and math.isfinite(b) and a < b):
            raise ValueError(f"bounds[{name!r}] = {pair!r}: need finite lower < upper")
        names.append(name)
        lower.append(a)
        upper.append(b)
    return tuple(names), np.array(lower), np.array(upper)


def _number(name, v) -> float:
    if isinstance(v, bool | np.bool_):
        return float(v)
    if not isinstance(v, int | float | np.integer | np.floating):
        raise InvalidRecord(
            "wrong_type", f"feature {name!r} must be a real number, got {type(v).__name__}"
        )
    try:
        f = float(v)
    except OverflowError:
        f = math.inf
    if not math.isfinite(f):
        raise InvalidRecord("non_finite", f"feature {name!r} is not finite or too large")
    return f


def _is_frame(X) -> bool:
    return hasattr(X, "columns") and hasattr(X, "to_numpy") and hasattr(X, "iloc")


class AffineScaler(base.Transformer):
    """Base class: the map of the module docstring with the statistics a subclass holds.

    A subclass sets ``_scaled`` (names of the scaled features), ``_lower``/``_upper`` (their
    clip bounds), ``_schema`` (all feature names, or None), and keeps ``_center``, ``_spread``
    and ``_norm`` current.
    """

    _scaled: tuple = ()
    _schema: tuple | None = None

    def _init_map(self, scaled: tuple, lower: np.ndarray, upper: np.ndarray, schema) -> None:
        self.__dict__.pop("_others_frozen", None)
        self._scaled = scaled
        self._lower, self._upper = lower, upper
        self._schema = schema
        if schema is not None:
            missing = [n for n in scaled if n not in schema]
            if missing:
                raise ValueError(f"scaled features {missing} are not in the declared features")
            index = {n: i for i, n in enumerate(schema)}
            self._cols = np.array([index[n] for n in scaled], dtype=np.intp)
            scaled_set = set(scaled)
            self._others = tuple(n for n in schema if n not in scaled_set)
        else:
            self._cols = None
            self._others = None

    def adopt_features(self, features: Sequence[Hashable] | int) -> None:
        """Take a declared schema (a learner's) when none was given; a different one is an
        error (the scaler and the learner must agree on the order of array columns)."""
        names = schema_names(features)
        if self._schema is None:
            self._init_map(self._scaled, self._lower, self._upper, names)
        elif tuple(self._schema) != tuple(names):
            raise ValueError(
                f"the scaler's features {list(self._schema)} are not the learner's {list(names)}"
            )

    # -- the statistics in use ------------------------------------------------------------------
    @property
    def center(self) -> dict:
        """The centre subtracted from each scaled feature."""
        return dict(zip(self._scaled, self._center.tolist(), strict=True))

    @property
    def spread(self) -> dict:
        """The spread each scaled feature is divided by (before the common ``norm_scale``)."""
        return dict(zip(self._scaled, self._spread.tolist(), strict=True))

    @property
    def norm_scale(self) -> float:
        """The factor the whole vector is divided by."""
        return float(self._norm)

    # -- one record ---------------------------------------------------------------------------
    def transform_one(self, x):
        """The scaled record: a dict for a dict, an array (schema order) for a 1-D array."""
        if isinstance(x, Mapping):
            return self._transform_dict(x)
        return self._apply(self._array(x)[None, :])[0]

    def _transform_dict(self, x: Mapping) -> dict:
        out = dict(x)
        scaled = dict.fromkeys(self._scaled)
        norm = self._norm
        for k, v in x.items():
            if k not in scaled and (self._others is None or k in self._others_set):
                out[k] = _number(k, v) / norm
            elif k not in scaled:
                _number(k, v)  # outside the schema: copied, but bad values are still refused
        lo, hi, c, s = self._lower, self._upper, self._center, self._spread
        for j, name in enumerate(self._scaled):
            v = x.get(name)
            if v is None:
                out[name] = 0.0
                continue
            v = min(max(_number(name, v), lo[j]), hi[j])
            out[name] = float((v - c[j]) / s[j] / norm)
        return out

    @property
    def _others_set(self) -> frozenset:
        cached = self.__dict__.get("_others_frozen")
        if cached is None:
            cached = frozenset(self._others or ())
            self.__dict__["_others_frozen"] = cached
        return cached

    def _array(self, x) -> np.ndarray:
        """A 1-D record in schema order, validated."""
        if self._schema is None:
            raise InvalidRecord("no_schema", "array records need declared features=[...]")
        try:
            arr = np.asarray(x)
        except (ValueError, TypeError, OverflowError):
            raise InvalidRecord(
                "wrong_type", "an array record must be a 1-D numeric vector"
            ) from None
        if arr.ndim != 1 or arr.dtype.kind not in "biuf":
            raise InvalidRecord("wrong_type", "an array record must be a 1-D numeric vector")
        if len(arr) != len(self._schema):
            raise InvalidRecord(
                "wrong_dimension", f"expected {len(self._schema)} features, got {len(arr)}"
            )
        with np.errstate(over="ignore", invalid="ignore"):
            arr = arr.astype(float)
        if not np.isfinite(arr).all():
            raise InvalidRecord("non_finite", "features must be finite (no NaN or inf)")
        return arr

    # -- batches ------------------------------------------------------------------------------
    def rows(self, X) -> tuple[np.ndarray | None, int]:
        """The rows of a 2-D array or DataFrame in schema order, and how many leading rows are
        valid (finite numbers); the rows from there on are left to one-record handling (which
        raises the right :class:`~stream_dp.records.InvalidRecord`). ``(None, 0)`` when the
        batch cannot be read as numbers at all."""
        if self._schema is None:
            raise InvalidRecord("no_schema", "batches need declared features=[...]")
        if _is_frame(X):
            index = {n: i for i, n in enumerate(self._schema)}
            A = np.zeros((len(X), len(self._schema)))
            for col in X.columns:
                if col in index:
                    try:
                        A[:, index[col]] = X[col].to_numpy(dtype=float)
                    except (TypeError, ValueError, OverflowError):
                        return None, 0
            for j, n in enumerate(self._scaled):
                if n not in X.columns:  # a missing scaled feature is its centre, as for a dict
                    A[:, self._cols[j]] = self._center[j]
        else:
            try:
                with np.errstate(over="ignore", invalid="ignore"):
                    A = np.asarray(X, dtype=float)
            except (TypeError, ValueError, OverflowError):
                return None, 0
            if A.ndim != 2 or A.shape[1] != len(self._schema):
                raise InvalidRecord(
                    "wrong_dimension", f"expected rows of {len(self._schema)} features"
                )
        finite = np.isfinite(A).all(axis=1)
        k = len(A) if finite.all() else int(np.argmin(finite))
        return A, k

    @staticmethod
    def row(X, i: int):
        """Row i of a batch as ``transform_one`` takes it."""
        return X.iloc[i].to_dict() if _is_frame(X) else np.asarray(X)[i]

    def _apply(self, A: np.ndarray) -> np.ndarray:
        """The map on valid rows in schema order (a new array)."""
        B = np.array(A, dtype=float, copy=True)
        cols = self._cols
        S = np.clip(B[:, cols], self._lower, self._upper)
        B[:, cols] = (S - self._center) / self._spread
        B /= self._norm
        return B

    def transform_many(self, X):
        """The scaled rows: a DataFrame for a DataFrame, else a 2-D array in schema order.

        Raises :class:`~stream_dp.records.InvalidRecord` if any row holds a non-finite value.
        """
        A, k = self.rows(X)
        if A is None or k < len(A):
            for i in range(k, len(X)):
                self.transform_one(self.row(X, i))  # raises the first bad row's own error
            raise InvalidRecord("wrong_type", "the batch cannot be read as numbers")
        B = self._apply(A)
        if _is_frame(X):
            import pandas as pd

            return pd.DataFrame(B, columns=list(self._schema), index=X.index)
        return B
