"""Records: the fixed feature schema, labels, and the norm clip that the privacy proof needs.

Every ``x`` is clipped to ``‖x‖₂ ≤ R`` before it touches the model or the buffer (the
Lipschitz constants hold only for clipped data); non-finite values are rejected, never learned
from; the feature space (names, order, d) is fixed before the first record — it is schema, not
data. Features are ordered by name so that two learners fed the same records with their keys in
a different order are identical (noise coordinates follow the schema order).

A rejected record raises :class:`RecordError` (also named :class:`InvalidRecord` here), the one
record-error type of the library and the engine, with a reason code of
:data:`connectors.schema.REASONS` or :data:`connectors.schema.LEARNER_REASONS`; like every
record error, its message may name a feature but never quotes a value. Numbers are checked by
:func:`connectors.schema.finite_float`, as the engine's wire format checks them
(``docs/design.md``, *Layers*, says why that type lives in ``connectors``).
"""

from __future__ import annotations

import math
import operator
from collections.abc import Hashable, Mapping, Sequence

import numpy as np

from connectors.schema import RecordError, finite_float, is_number

__all__ = [
    "FeatureSchema",
    "InvalidRecord",
    "LabelCodes",
    "RecordError",
    "auc_label",
    "clip_norm",
    "clip_rows",
]

#: The name the learners' callers know :class:`RecordError` by: the same class.
InvalidRecord = RecordError

# ``np.vdot`` itself, without the ``__array_function__`` dispatch around it (a third of the
# call on a short vector, and the per-record path makes one): the same function, the same sum.
_vdot = getattr(np.vdot, "_implementation", np.vdot)


def _sort_key(k: Hashable) -> tuple[str, str]:
    return (type(k).__name__, str(k))


#: :attr:`FeatureSchema.ignored` when no field is ignored (a marker no record can carry).
_NO_FIELD: Hashable = object()


class FeatureSchema:
    """Feature names and their order: declared up front, or (non-private use only) taken from the
    first learned record. An int ``d`` stands for the names ``x0 … x{d−1}`` of array input.

    Examples
    --------
    >>> s = FeatureSchema()
    >>> s.to_array({"b": 2.0, "a": 1.0}, learning=True)
    array([1., 2.])
    >>> s.names
    ('a', 'b')
    >>> s.to_array({"a": 3.0}, learning=True)  # a missing feature is 0, as in river
    array([3., 0.])
    >>> s.to_array({"a": 1.0, "z": 5.0}, learning=True), s.last_unknown  # unknown: ignored
    (array([1., 0.]), True)

    """

    #: While set, the general dict path records which declared features each record carries
    #: (:attr:`last_present`); the learner's input sets it until every feature has arrived.
    track_presence = False
    #: Positions of the declared features the last converted record carried, when it lacked
    #: some and :attr:`track_presence` is set; None: it carried them all (or nobody asked).
    last_present: list[int] | None = None
    #: A field that is no feature and is skipped without a check (a unit-level learner's unit
    #: key, which a record may carry into a prediction). The default is a private marker, not
    #: None: None is a valid dict key, and a record keyed by it must still be checked.
    ignored: Hashable = _NO_FIELD

    def __init__(self, names: Sequence[Hashable] | int | None = None) -> None:
        self.names: tuple | None = None
        #: Accepted records that carried features outside the schema (those were ignored). The
        #: learner counts a record once it has accepted it (a rejected record leaves no trace).
        self.unknown_records = 0
        #: Whether the last converted record carried features outside the schema.
        self.last_unknown = False
        #: Whether :meth:`to_clipped` clipped the last record (its norm exceeded R).
        self.last_clipped = False
        self._index: dict = {}
        self._getter: operator.itemgetter | None = None
        # (dict, values, radius, clipped vector) of the last dict to_clipped converted; the vector
        # is shared with the caller, so nothing may write into what to_clipped returns.
        self._last: tuple | None = None
        if isinstance(names, int | np.integer) and not isinstance(names, bool):
            names = tuple(f"x{i}" for i in range(int(names)))
        if names is not None:
            self._set(tuple(names))

    def _set(self, names: tuple) -> None:
        if len(names) == 0:
            raise RecordError("empty_features", "a record needs at least one feature")
        if len(set(names)) != len(names):
            raise ValueError("feature names must be unique")
        self.names = names
        self._index = {n: i for i, n in enumerate(names)}
        self._getter = operator.itemgetter(*names)

    def __getstate__(self) -> dict:
        # The conversion cache holds a raw record: never pickle or copy it with the model.
        return {
            **self.__dict__,
            "_last": None,
            "last_unknown": False,
            "last_clipped": False,
            "last_present": None,
        }

    @property
    def dim(self) -> int | None:
        return None if self.names is None else len(self.names)

    @property
    def frozen(self) -> bool:
        return self.names is not None

    def to_array(self, x: Mapping | Sequence | np.ndarray, *, learning: bool) -> np.ndarray:
        """Turn a record's features into a float vector in schema order.

        Features outside the schema are ignored (they carry no weight; learned records that had
        any are counted in ``unknown_records``), missing features are 0, as in river. Without a
        declared schema the first learned record's keys become the schema (non-private
        learners only: a private learner needs the schema before any data).
        Raises :class:`RecordError` for non-numeric or non-finite values.
        """
        if isinstance(x, Mapping):
            return self._dict_to_array(x, learning)
        if isinstance(x, np.ndarray | list | tuple):
            try:
                arr = np.asarray(x)
            except (ValueError, TypeError, OverflowError):  # ragged, undecodable bytes, ...
                raise RecordError(
                    "wrong_type", "an array record must be a 1-D numeric vector"
                ) from None
            if arr.ndim != 1 or arr.dtype.kind not in "biuf":  # not complex, str, object, ...
                raise RecordError("wrong_type", "an array record must be a 1-D numeric vector")
            with np.errstate(over="ignore", invalid="ignore"):  # huge longdouble -> inf: rejected
                arr = arr.astype(float)
            if self.names is None:
                if not learning:
                    raise RecordError("no_schema", "no schema yet: learn a record first")
                self._set(tuple(f"x{i}" for i in range(len(arr))))
            if len(arr) != self.dim:
                raise RecordError(
                    "wrong_dimension", f"expected {self.dim} features, got {len(arr)}"
                )
            if not np.isfinite(arr).all():
                raise RecordError("non_finite", "features must be finite (no NaN or inf)")
            return arr
        raise RecordError("wrong_type", f"x must be a dict or a 1-D array, got {type(x).__name__}")

    def _dict_to_array(self, x: Mapping, learning: bool) -> np.ndarray:
        self.last_unknown = False
        self.last_present = None
        fast = self._fast_dict(x)
        if fast is not None:
            return fast
        isfinite = math.isfinite
        ignored = self.ignored
        for k, v in x.items():
            if (type(v) is not float or not isfinite(v)) and k != ignored:
                finite_float(v, f"feature {k!r}", bools=True)  # plain finite floats need no more
        if self.names is None:
            if not learning:
                return np.zeros(0)
            # The unit key is read, never learned: it never becomes a feature.
            self._set(tuple(sorted((k for k in x if k != ignored), key=_sort_key)))
        out = np.zeros(len(self.names))
        index = self._index
        unknown = False
        present: list[int] | None = [] if self.track_presence else None
        for k, v in x.items():
            i = index.get(k)
            if i is None:  # not part of the model: ignored (and counted when learning)
                unknown = unknown or k != ignored
                continue
            out[i] = v
            if present is not None:
                present.append(i)
        self.last_unknown = unknown
        if present is not None and len(present) < len(out):
            self.last_present = present
        return out

    def to_clipped(self, x, radius: float, *, learning: bool) -> np.ndarray:
        """``clip_norm(self.to_array(x, learning=learning), radius)``, faster for plain dicts.

        The fast path computes ‖x‖² once, both to detect a non-finite value (the general path
        then raises as :meth:`to_array` does) and to clip.
        """
        names = self.names
        self.last_unknown = False
        self.last_present = None
        if isinstance(x, dict) and names is not None and self._no_extra_keys(x, names):
            try:
                vals = self._getter(x)
            except (KeyError, TypeError):
                vals = None
            if vals is not None:
                if len(names) == 1:
                    vals = (vals,)
                last = self._last
                # The same dict with the same values as the last call (predict, then learn, of
                # one record): converted once. Equal values read as equal floats, so the vector
                # is what a conversion would give.
                if last is not None and x is last[0] and vals == last[1] and radius == last[2]:
                    self.last_clipped = last[4]
                    return last[3]
                try:
                    arr = np.array(vals)
                except (TypeError, ValueError, OverflowError):
                    arr = None
                if arr is not None and arr.dtype.char == "d" and arr.ndim == 1:
                    sq = _vdot(arr, arr)
                    if math.isfinite(sq):
                        # clip_norm, inlined: arr is this call's own, so it is scaled in place
                        # (the same product, element by element, without a second array)
                        norm = math.sqrt(sq)
                        clipped = norm > radius
                        if clipped:
                            arr *= radius / norm
                        self.last_clipped = clipped
                        self._last = (x, vals, radius, arr, clipped)
                        return arr
                # ints, or anything else: the general path converts, or raises
        v = self.to_array(x, learning=learning)
        out = clip_norm(v, radius)
        self.last_clipped = out is not v
        return out

    def _no_extra_keys(self, x: Mapping, names: tuple) -> bool:
        """No key of ``x`` is outside the schema, given that the schema's getter finds all of
        its names in ``x``: as many keys as names, or one more that is the ignored unit field."""
        extra = len(x) - len(names)
        return extra == 0 or (extra == 1 and self.ignored in x)

    def _fast_dict(self, x: Mapping, check_finite: bool = True) -> np.ndarray | None:
        """The common case in ~2 µs: exactly the schema's keys, plain finite numbers.

        Returns None (the general path then decides, and raises for bad input) unless ``x`` has
        exactly the schema's keys (and perhaps the ignored unit field) and NumPy reads the values
        as floats or ints (so no strings, None, complex or objects; bools make NumPy choose
        ``bool`` or ``object`` unless mixed with floats, and are then numbers for both paths)
        that are all finite.
        """
        names = self.names
        if names is None or not self._no_extra_keys(x, names):
            return None
        try:
            vals = self._getter(x)
        except (KeyError, TypeError):
            return None
        arr = self._values_array(vals if len(names) > 1 else (vals,))
        if arr is None or (check_finite and not np.isfinite(arr).all()):
            return None
        return arr

    @staticmethod
    def _values_array(vals: tuple) -> np.ndarray | None:
        """The values as float64 when NumPy reads them all as floats or ints, else None."""
        try:
            arr = np.array(vals)
        except (TypeError, ValueError, OverflowError):
            return None
        if arr.dtype != np.float64:
            if arr.dtype.kind != "i":
                return None
            arr = arr.astype(float)
        return arr if arr.ndim == 1 else None

    def to_dict(self, v: np.ndarray) -> dict:
        return dict(zip(self.names or (), np.asarray(v, dtype=float).tolist(), strict=True))


def clip_norm(x: np.ndarray, radius: float, sq: float | None = None) -> np.ndarray:
    """``x · min(1, R/‖x‖₂)`` — part of the privacy proof, not a preprocessing nicety.

    ``sq`` is ``np.vdot(x, x)`` when the caller already has it.

    Examples
    --------
    >>> clip_norm(np.array([3.0, 4.0]), 1.0)
    array([0.6, 0.8])

    """
    # vdot: the same sum as ``x @ x``, without a warning when ‖x‖² overflows.
    norm = math.sqrt(_vdot(x, x) if sq is None else sq)
    if norm > radius:
        if math.isinf(norm):
            return _clip_huge(x, radius)
        return x * (radius / norm)
    return x


def _clip_huge(x: np.ndarray, radius: float) -> np.ndarray:
    """:func:`clip_norm` for a finite x whose ‖x‖² overflows: rescale first, keep the direction."""
    scale = float(np.max(np.abs(x)))
    u = x / scale
    unit_norm = math.sqrt(np.vdot(u, u))
    if scale * unit_norm <= radius:  # only for radii beyond 1.3e154
        return x
    return u * (radius / unit_norm)


def clip_rows(X: np.ndarray, radius: float) -> np.ndarray:
    """:func:`clip_norm` applied to every row of a 2-D array (a new C-contiguous array).

    Row by row with the same arithmetic as :func:`clip_norm`, so a batch is clipped bit for bit
    as its records would be one at a time.

    Examples
    --------
    >>> clip_rows(np.array([[3.0, 4.0], [0.3, 0.4]]), 1.0)
    array([[0.6, 0.8],
           [0.3, 0.4]])

    """
    out = np.array(X, dtype=float, order="C")
    if out.ndim != 2 or out.size == 0:
        return out
    # A row whose squared norm is below R²(1 − 1e-9) by any summation order is left unchanged by
    # clip_norm; only the others (and non-finite ones) need its exact arithmetic, row by row.
    inside = radius * radius * (1.0 - 1e-9)  # inf for radii beyond 1.3e154: check every row
    with np.errstate(over="ignore", invalid="ignore"):
        sq = np.einsum("ij,ij->i", out, out)
    for i in np.flatnonzero(~(sq <= inside) | (inside == math.inf)):
        row = out[i]
        norm = math.sqrt(np.vdot(row, row))
        if norm > radius:
            if math.isinf(norm):
                row[:] = _clip_huge(row, radius)
            else:
                row *= radius / norm
    return out


def auc_label(y: object) -> float:
    """Map a binary label to ±1: ``True/False``, ``1/0`` and ``±1`` are accepted.

    Examples
    --------
    >>> auc_label(True), auc_label(0), auc_label(-1)
    (1.0, -1.0, -1.0)

    """
    if y is True or y is False or isinstance(y, np.bool_):
        return 1.0 if y else -1.0
    if is_number(y, bools=True) and not (isinstance(y, float) and math.isnan(y)):
        if y == 1:
            return 1.0
        if y == 0 or y == -1:
            return -1.0
    raise RecordError(
        "bad_label", f"an AUC label must be True/False, 1/0 or +1/-1, not this {type(y).__name__}"
    )


class LabelCodes:
    """Class labels of metric learning, coded as floats (only equality of labels matters)."""

    def __init__(self) -> None:
        self.codes: dict = {}

    def encode(self, y: object, register: bool = True) -> float:
        """The code of label ``y``; with ``register=False`` a new label is validated, not stored."""
        if y is None or (isinstance(y, float) and math.isnan(y)):
            raise RecordError("bad_label", f"a class label is required, got {y!r}")
        if not isinstance(y, Hashable):
            raise RecordError(
                "bad_label", f"a class label must be hashable, not a {type(y).__name__}"
            )
        if isinstance(y, np.generic):
            y = y.item()
            if isinstance(y, float) and math.isnan(y):  # np.float32('nan') is no Python float
                raise RecordError("bad_label", f"a class label is required, got {y!r}")
        code = self.codes.get(y)
        if code is None:
            code = float(len(self.codes))
            if register:
                self.codes[y] = code
        return code
