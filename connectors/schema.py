"""Wire formats of the engine: input records, release messages and dead letters.

Everything that crosses a process boundary is one of three pydantic v2 models:

* :class:`InputRecord` -- one labelled example read from a source. Untrusted: it is always
  built through :func:`parse_record`, which turns every defect into a :class:`RecordError`
  with a short machine-readable ``reason`` code (see :data:`REASONS`), so bad input can be
  routed to a dead-letter sink instead of stopping the engine or being learned from.

:class:`RecordError` is the one record-error type of the whole project: the learners of
``stream_dp`` raise it too (``stream_dp.records``), with the same reason codes and the same
number check (:func:`finite_float`), so the engine catches one type from parsing to learning.
It lives here, at the bottom of the layers, because this package imports nothing of
``stream_dp`` (``docs/design.md``, *Layers*).
* :class:`ReleaseMessage` -- one differentially private model release (``docs/privacy.md``,
  "The engine: one release per step"). It carries the released weights, compactly encoded,
  and the privacy accounting only: never raw records, gradients or the internal iterate.
* :class:`DeadLetter` -- a rejected input with its reason. It contains the raw payload, so a
  dead-letter file or topic holds personal data and must be protected like the input.
"""

from __future__ import annotations

import base64
import binascii
import json
import math
import numbers
import struct
import time
from collections.abc import Collection, Container, Mapping, Sequence
from datetime import UTC, datetime
from typing import Any, Literal

import numpy as np
from pydantic import (
    BaseModel,
    ConfigDict,
    Field,
    ValidationError,
    field_validator,
    model_validator,
)
from pydantic_core import PydanticCustomError

__all__ = [
    "LEARNER_REASONS",
    "REASONS",
    "DeadLetter",
    "InputRecord",
    "Label",
    "RecordError",
    "ReleaseEncoder",
    "ReleaseMessage",
    "WEIGHTS_DTYPE",
    "conform_features",
    "finite_float",
    "is_number",
    "parse_conformed",
    "parse_record",
    "release_message_bytes",
]

#: Reason codes of the wire format, carried by :class:`RecordError` and :class:`DeadLetter`.
#:
#: ``invalid_json``      payload is not UTF-8 JSON
#: ``oversize``          payload longer than ``max_bytes``
#: ``wrong_type``        top level not an object, or a field of the wrong type (e.g. a string
#:                       or bool used as a feature, a list as label)
#: ``missing_features``  no ``x`` field
#: ``empty_features``    ``x`` is ``{}`` or ``[]``
#: ``missing_label``     no ``y`` field, or ``y`` is null or an empty string
#: ``non_finite``        NaN or +-inf (or a number too large for a float) in ``x``, ``y`` or
#:                       ``ts``
#: ``invalid_timestamp`` ``ts`` is a string but not an ISO 8601 date-time
#: ``no_known_features`` none of the record's feature names is in the declared schema
#:                       (:func:`conform_features`; unknown names are otherwise ignored)
#: ``wrong_dimension``   a feature list of the wrong length (:func:`conform_features`)
REASONS: tuple[str, ...] = (
    "invalid_json",
    "oversize",
    "wrong_type",
    "missing_features",
    "empty_features",
    "missing_label",
    "non_finite",
    "invalid_timestamp",
    "no_known_features",
    "wrong_dimension",
)

#: The further reason codes of the learners' own checks (``stream_dp.records``), which share
#: ``wrong_type``, ``non_finite``, ``empty_features`` and ``wrong_dimension`` (an array record
#: of the wrong length) with :data:`REASONS`:
#:
#: ``bad_label``         a label the learner's task cannot take: an AUC label other than
#:                       True/False, 1/0 or +-1; a class label that is missing or unhashable
#: ``no_schema``         an array record before any schema exists (a learner without declared
#:                       features takes its schema from the first record it learns)
LEARNER_REASONS: tuple[str, ...] = ("bad_label", "no_schema")

#: Labels may be booleans, integers, finite floats or non-empty strings.
Label = bool | int | float | str

_DEAD_LETTER_MAX_CHARS = 10_000


class RecordError(ValueError):
    """A rejected input record: bad input, never learned from (the engine dead-letters it).

    Parameters
    ----------
    reason : str
        Machine-readable code, one of :data:`REASONS` or :data:`LEARNER_REASONS`. Safe to use
        as a metric label.
    message : str, optional
        Human-readable explanation. May quote feature *names* but never feature values, so
        that it can be logged without leaking record contents.

    Examples
    --------
    >>> try:
    ...     parse_record(b'{"x": [1.0]}')
    ... except RecordError as err:
    ...     print(err.reason)
    missing_label
    """

    def __init__(self, reason: str, message: str = "") -> None:
        self.reason = reason
        self.message = message or reason.replace("_", " ")
        super().__init__(f"{reason}: {self.message}")

    def __reduce__(self) -> tuple[Any, ...]:
        # Needed so the error survives pickling (multiprocessing) with both arguments.
        return (type(self), (self.reason, self.message))


def is_number(value: object, *, bools: bool = False) -> bool:
    """Whether ``value`` is a real number (NumPy scalars included; never a string).

    A bool is a number only with ``bools``: a learner takes ``True`` as 1 in a dict record, as
    river does, while in a wire record ``true`` as a feature is almost always an upstream
    encoding bug. NumPy's ``bool_`` is never a number.

    Examples
    --------
    >>> is_number(2), is_number(np.float32(0.5)), is_number("2"), is_number(True)
    (True, True, False, False)
    >>> is_number(True, bools=True)
    True
    """
    return isinstance(value, numbers.Real) and (bools or not isinstance(value, bool))


def finite_float(value: object, what: str, *, bools: bool = False) -> float:
    """``value`` as a finite float, or a :class:`RecordError` naming ``what`` it is.

    Raises
    ------
    RecordError
        ``wrong_type`` (not a number, see :func:`is_number`) or ``non_finite`` (NaN, ±inf, or
        an int beyond a double).

    Examples
    --------
    >>> finite_float(3, "feature 'a'")
    3.0
    >>> try:
    ...     finite_float(10**400, "feature 'a'")
    ... except RecordError as err:
    ...     print(err)
    non_finite: feature 'a' is too large for a float
    """
    if not is_number(value, bools=bools):
        raise RecordError("wrong_type", f"{what} must be a number, got {type(value).__name__}")
    try:
        as_float = float(value)  # type: ignore[arg-type]
    except OverflowError:
        # Python ints are unbounded; 10**400 does not fit in a double.
        raise RecordError("non_finite", f"{what} is too large for a float") from None
    if not math.isfinite(as_float):
        raise RecordError("non_finite", f"{what} is not finite")
    return as_float


def _finite_float(value: object, what: str) -> float:
    """:func:`finite_float` inside a pydantic validator (which carries the reason on)."""
    try:
        return finite_float(value, what)
    except RecordError as err:
        raise PydanticCustomError(err.reason, "{message}", {"message": err.message}) from None


class InputRecord(BaseModel):
    """One labelled example.

    Parameters
    ----------
    x : dict of str to float, or list of float
        Features, by name or by position. Must be non-empty; every value must be a finite
        int or float (bools and numeric strings are rejected, not coerced).
    y : bool, int, float or str
        Label. Finite if numeric, non-empty if a string.
    key : str, optional
        Routing key (e.g. the user or the partition key), never used as a feature.
    ts : float or str, optional
        Event time, as unix seconds or an ISO 8601 string; stored as unix seconds (naive ISO
        strings are taken as UTC).

    Notes
    -----
    Use :func:`parse_record` for untrusted input: it maps every validation failure onto a
    single :class:`RecordError` reason. Unknown top-level fields are ignored so producers may
    add metadata without breaking the engine.

    Examples
    --------
    >>> InputRecord(x={"age": 31, "income": 2.5}, y=1).x
    {'age': 31.0, 'income': 2.5}
    >>> InputRecord(x=[0.5, 1.5], y="pos", ts="2024-01-01T00:00:00Z").ts
    1704067200.0
    """

    model_config = ConfigDict(extra="ignore", frozen=True)

    x: dict[str, float] | list[float]
    y: Label
    key: str | None = None
    ts: float | None = None

    @field_validator("x", mode="before")
    @classmethod
    def _check_features(cls, value: object) -> dict[str, float] | list[float]:
        if isinstance(value, np.ndarray):
            if value.ndim != 1:
                raise PydanticCustomError("wrong_type", "x must be one-dimensional")
            value = value.tolist()
        if isinstance(value, Mapping):
            if not value:
                raise PydanticCustomError("empty_features", "x has no features")
            out: dict[str, float] = {}
            isfinite = math.isfinite
            for name, v in value.items():
                if type(name) is not str and not isinstance(name, str):
                    raise PydanticCustomError("wrong_type", "feature names must be strings")
                # JSON decodes numbers to exact float/int: check those without the ABC
                # machinery of _finite_float (this loop runs once per feature per record).
                if type(v) is float and isfinite(v):
                    out[name] = v
                else:
                    out[name] = _finite_float(v, f"feature {name!r}")
            return out
        if isinstance(value, Sequence) and not isinstance(value, str | bytes | bytearray):
            if len(value) == 0:
                raise PydanticCustomError("empty_features", "x has no features")
            return [_finite_float(v, f"feature [{i}]") for i, v in enumerate(value)]
        raise PydanticCustomError(
            "wrong_type",
            "x must be an object or a list of numbers, got {kind}",
            {"kind": type(value).__name__},
        )

    @field_validator("y", mode="before")
    @classmethod
    def _check_label(cls, value: object) -> Label:
        if value is None or (isinstance(value, str) and not value):
            raise PydanticCustomError("missing_label", "label y is null or empty")
        if isinstance(value, bool | str):
            return value
        if isinstance(value, np.bool_):
            return bool(value)
        if is_number(value):
            as_float = _finite_float(value, "label y")
            return int(value) if isinstance(value, numbers.Integral) else as_float
        raise PydanticCustomError(
            "wrong_type",
            "label y must be a bool, number or string, got {kind}",
            {"kind": type(value).__name__},
        )

    @field_validator("key", mode="before")
    @classmethod
    def _check_key(cls, value: object) -> str | None:
        if value is None or isinstance(value, str):
            return value
        raise PydanticCustomError(
            "wrong_type", "key must be a string, got {kind}", {"kind": type(value).__name__}
        )

    @field_validator("ts", mode="before")
    @classmethod
    def _check_ts(cls, value: object) -> float | None:
        if value is None:
            return None
        if isinstance(value, str):
            try:
                parsed = datetime.fromisoformat(value)
            except ValueError:
                raise PydanticCustomError(
                    "invalid_timestamp", "ts is not an ISO 8601 date-time"
                ) from None
            if parsed.tzinfo is None:
                parsed = parsed.replace(tzinfo=UTC)
            return parsed.timestamp()
        return _finite_float(value, "ts")

    @property
    def dim(self) -> int:
        """Number of features."""
        return len(self.x)

    def to_vector(self, feature_names: Sequence[str] | None = None) -> np.ndarray:
        """Return the features as a float64 vector in the model's feature order.

        Unknown feature names are ignored and missing ones are 0, as in river (see
        :func:`conform_features`).

        Parameters
        ----------
        feature_names : sequence of str, optional
            The model's feature order. Required when ``x`` is a dict; when ``x`` is a list
            it only fixes the expected length.

        Returns
        -------
        numpy.ndarray
            Shape ``(d,)``.

        Raises
        ------
        RecordError
            ``no_known_features`` or ``wrong_dimension``.

        Examples
        --------
        >>> InputRecord(x={"b": 2, "a": 1, "zz": 9}, y=0).to_vector(["a", "b", "c"])
        array([1., 2., 0.])
        """
        if isinstance(self.x, list) and feature_names is None:
            return np.asarray(self.x, dtype=np.float64)
        if feature_names is None:
            raise ValueError("feature_names is required when x is a dict")
        x, _ = conform_features(self, feature_names)
        if isinstance(x, list):
            return np.asarray(x, dtype=np.float64)
        return np.fromiter(
            (x.get(name, 0.0) for name in feature_names),
            dtype=np.float64,
            count=len(feature_names),
        )


def conform_features(
    record: InputRecord, feature_names: Sequence[str], known: Container[str] | None = None
) -> tuple[dict[str, float] | list[float], int]:
    """Restrict a record's features to a declared schema.

    The schema is fixed before the first record (the privacy analysis treats it as public), so
    a record can never add a feature: names outside the schema are dropped and counted, and
    features the record lacks are left out (the learner reads them as 0).

    Parameters
    ----------
    record : InputRecord
    feature_names : sequence of str
        The declared schema, in model order.
    known : container of str, optional
        ``frozenset(feature_names)``, passed by callers that conform many records.

    Returns
    -------
    x : dict of str to float, or list of float
        The features to learn from: a dict holding only declared names, or the record's list
        (which must have one value per declared feature).
    n_unknown : int
        How many feature names were dropped.

    Raises
    ------
    RecordError
        ``no_known_features`` when a dict record names none of the declared features (it
        would be learned as the zero vector, which is never what its producer meant), or
        ``wrong_dimension`` for a list of the wrong length.

    Examples
    --------
    >>> rec = parse_record(b'{"x": {"a": 1, "\\\\ud800": 2, "zz": 3}, "y": 1}')
    >>> conform_features(rec, ["a", "b"])
    ({'a': 1.0}, 2)
    """
    x = record.x
    if isinstance(x, list):
        if len(x) != len(feature_names):
            raise RecordError(
                "wrong_dimension", f"expected {len(feature_names)} features, got {len(x)}"
            )
        return x, 0
    names = frozenset(feature_names) if known is None else known
    kept = {k: v for k, v in x.items() if k in names}
    if not kept:
        raise RecordError(
            "no_known_features",
            f"none of the record's {len(x)} feature name(s) is in the declared schema of "
            f"{len(feature_names)} features",
        )
    return kept, len(x) - len(kept)


def _record_error_from_validation(err: ValidationError) -> RecordError:
    first = err.errors(include_url=False)[0]
    kind, loc = first["type"], first.get("loc", ())
    field = loc[0] if loc else None
    if kind in REASONS:
        return RecordError(kind, first["msg"])
    if kind == "missing" and field == "y":
        return RecordError("missing_label", "record has no label field 'y'")
    if kind == "missing" and field == "x":
        return RecordError("missing_features", "record has no feature field 'x'")
    where = ".".join(str(p) for p in loc) or "record"
    return RecordError("wrong_type", f"{where}: {first['msg']}")


def parse_record(
    raw: bytes | bytearray | memoryview | str | Mapping[str, Any], *, max_bytes: int = 1_000_000
) -> InputRecord:
    """Validate one untrusted input record.

    Parameters
    ----------
    raw : bytes, str or dict
        A JSON object as UTF-8 bytes or text, or an already decoded mapping (which skips the
        size check: it was never a wire message).
    max_bytes : int, default 1_000_000
        Larger payloads are rejected *before* JSON decoding, so a huge message cannot
        exhaust memory or CPU in the parser.

    Returns
    -------
    InputRecord

    Raises
    ------
    RecordError
        With one of the :data:`REASONS` codes.

    Examples
    --------
    >>> parse_record(b'{"x": {"a": 1.5}, "y": true}').y
    True
    >>> try:
    ...     parse_record('{"x": {"a": NaN}, "y": 1}')
    ... except RecordError as err:
    ...     print(err.reason, "-", err.message)
    non_finite - feature 'a' is not finite
    """
    if isinstance(raw, Mapping):
        data: object = raw
    else:
        if isinstance(raw, str):
            # len(str) <= len(utf-8 bytes): the cheap test settles most oversize cases.
            if len(raw) > max_bytes or len(raw.encode("utf-8", "surrogatepass")) > max_bytes:
                raise RecordError("oversize", f"record is larger than {max_bytes} bytes")
        elif isinstance(raw, bytes | bytearray | memoryview):
            if len(raw) > max_bytes:
                raise RecordError("oversize", f"record is larger than {max_bytes} bytes")
        else:
            raise RecordError("wrong_type", f"cannot parse a {type(raw).__name__}")
        try:
            data = json.loads(bytes(raw) if isinstance(raw, memoryview) else raw)
        except UnicodeDecodeError:
            raise RecordError("invalid_json", "record is not valid UTF-8") from None
        except (ValueError, RecursionError) as err:
            # ValueError covers JSONDecodeError; RecursionError a pathologically nested input.
            kind = type(err).__name__
            raise RecordError("invalid_json", f"record is not valid JSON ({kind})") from None
    if not isinstance(data, Mapping):
        raise RecordError("wrong_type", f"record must be a JSON object, got {type(data).__name__}")
    try:
        return InputRecord.model_validate(data)
    except ValidationError as err:
        raise _record_error_from_validation(err) from None


_FLOAT_INT = 2**1023


_FLOAT_TYPE = {float}


def _finite_floats(values: Collection[object]) -> bool:
    """Whether ``values`` are all finite floats, in C loops: JSON decodes ``1.5`` as a float
    and ``NaN`` or ``Infinity`` as non-finite ones, which make the sum non-finite (as does an
    overflowing sum of finite ones: :func:`_plain_number` then decides, value by value)."""
    return set(map(type, values)) == _FLOAT_TYPE and math.isfinite(sum(values))


def _plain_number(value: object) -> bool:
    """A JSON number that :class:`InputRecord` takes as it is: a finite float, or an int that
    fits a float (anything else goes through the full validation, which says why not)."""
    kind = type(value)
    if kind is float:
        return math.isfinite(value)  # type: ignore[arg-type]
    return kind is int and -_FLOAT_INT < value < _FLOAT_INT  # type: ignore[operator]


def parse_conformed(
    raw: bytes | bytearray | memoryview | str,
    feature_names: Sequence[str],
    known: Container[str],
    *,
    max_bytes: int = 1_000_000,
) -> tuple[dict[str, float] | list[float], Label, int]:
    """:func:`parse_record` then :func:`conform_features`, with a fast path for plain records.

    A record whose fields are what JSON decodes plainly (an object ``x`` of finite numbers, a
    boolean, number or non-empty string ``y``, a string or absent ``key``, an absent ``ts``) is
    checked here without building an :class:`InputRecord`; any other record goes through the
    full validation. Both paths accept the same records with the same values and reject the
    same ones with the same reason (``tests/test_fast_records.py`` holds them equal).

    Parameters
    ----------
    raw : bytes or str
    feature_names : sequence of str
        The declared schema, in model order.
    known : container of str
        ``frozenset(feature_names)``.
    max_bytes : int, default 1_000_000

    Returns
    -------
    x : dict of str to float, or list of float
    y : bool, int, float or str
    n_unknown : int

    Raises
    ------
    RecordError

    Examples
    --------
    >>> parse_conformed(b'{"x": {"a": 1, "zz": 2.5}, "y": true}', ["a", "b"], {"a", "b"})
    ({'a': 1.0}, True, 1)
    """
    data = None
    if isinstance(raw, bytes) and len(raw) <= max_bytes:
        try:
            data = json.loads(raw)
        except (ValueError, RecursionError):
            data = None  # the full path names the reason
    if type(data) is dict:
        x, y, key = data.get("x"), data.get("y"), data.get("key")
        kind_y = type(y)
        if (
            type(x) is dict
            and x
            and (kind_y is bool or (kind_y is str and y) or _plain_number(y))
            and (key is None or type(key) is str)
            and data.get("ts") is None
        ):
            values = x.values()
            floats = _finite_floats(values)
            if floats or all(map(_plain_number, values)):
                # The common record, finite floats with every key declared, kept as decoded.
                if floats and len(x) == len(feature_names) and all(map(known.__contains__, x)):
                    return x, y, 0
                kept = {k: float(v) for k, v in x.items() if k in known}
                if kept:
                    return kept, y, len(x) - len(kept)
    record = parse_record(raw, max_bytes=max_bytes)
    x, n_unknown = conform_features(record, feature_names, known)
    return x, record.y, n_unknown


#: How release weights travel: little-endian IEEE-754 float64, C order, base64 (RFC 4648).
WEIGHTS_DTYPE = "<f8"


def _encode_weights(weights: object) -> tuple[str, list[int]]:
    arr = np.asarray(weights, dtype=np.float64)
    if not np.isfinite(arr).all():
        raise ValueError("weights must be finite")
    data = np.ascontiguousarray(arr, dtype=WEIGHTS_DTYPE).tobytes()
    return base64.b64encode(data).decode("ascii"), list(arr.shape)


class ReleaseMessage(BaseModel):
    """One differentially private model release, as published on the release topic.

    The weights travel as base64 of little-endian float64 in C order (``dtype`` ``"<f8"``)
    with their ``shape``: a third of the size of decimal JSON and exact to the bit, so a
    metric model with d = 240 (57,600 weights) is a 0.6 MB message, under Kafka's 1 MiB
    default. :meth:`weights_array` decodes them; any language can (``base64`` then a float64
    array).

    Parameters
    ----------
    schema_version : int, default 2
        2 since the compact weights. Version 1 messages (weights as a JSON list) are read and
        converted.
    model_id : str
        Stable identifier of the model; also the Kafka message key, so all releases of one
        model land in one partition, in order.
    run_id : str, optional
        Identifier of the model's run (drawn at its first start, independent of data and of
        the noise secret). Steps count from 1 within a run; ``--fresh`` starts a new run.
    algorithm : str
        Name of the learner (e.g. ``"OnPairStrC"``).
    task : {"auc", "metric"}
    step : int
        Number of records learned from when this release was made (t in the papers).
    release_index : int
        Number of charged releases of this run so far.
    weights : str
        The released weights (base64, see above). The constructor also accepts a list or
        array of numbers and encodes it.
    dtype : {"<f8"}
    shape : list of int
        Shape of the weights, e.g. ``[d]`` for AUC or ``[d, d]`` for a metric. Inferred from
        an array given as ``weights``.
    feature_names : list of str
    rho_spent, rho_budget : float
        zCDP spent so far and the total budget (``None``: unbounded).
    epsilon_spent, delta : float
        The (epsilon, delta)-DP equivalent of ``rho_spent``.
    exhausted : bool
        True once the budget is used up: this is the final release.
    private : bool, default True
        False for a run declared non-private (a reproducible, guessable noise seed).
    privacy_unit : dict, optional
        A unit-level model's neighbouring relation (the unit's field, k events per unit, b
        steps apart); absent for an event-level model, whose guarantee is per record.
    epsilon_event_spent : float, optional
        A unit-level model's ε for one record at the same noise, beside ``epsilon_spent``.
    time : float, default now
        Unix seconds when the release was made.

    Examples
    --------
    >>> msg = ReleaseMessage(model_id="m", algorithm="a", task="auc", step=10,
    ...                      release_index=0, weights=[0.1, 0.2],
    ...                      feature_names=["f0", "f1"], rho_spent=0.1, rho_budget=1.0,
    ...                      epsilon_spent=2.3, delta=1e-6, exhausted=False, time=0.0)
    >>> msg.weights
    'mpmZmZmZuT+amZmZmZnJPw=='
    >>> ReleaseMessage.from_json(msg.to_json()) == msg
    True
    >>> msg.weights_array()
    array([0.1, 0.2])
    """

    model_config = ConfigDict(extra="forbid", frozen=True, allow_inf_nan=False)

    schema_version: Literal[2] = 2
    model_id: str = Field(min_length=1)
    run_id: str | None = None
    algorithm: str = Field(min_length=1)
    task: Literal["auc", "metric"]
    step: int = Field(ge=0)
    release_index: int = Field(ge=0)
    weights: str
    dtype: Literal["<f8"] = WEIGHTS_DTYPE
    shape: list[int]
    feature_names: list[str]
    rho_spent: float = Field(ge=0)
    rho_budget: float | None = Field(default=None, ge=0)
    epsilon_spent: float = Field(ge=0)
    delta: float = Field(ge=0, lt=1)
    exhausted: bool
    private: bool = True
    privacy_unit: dict[str, str | int] | None = None
    epsilon_event_spent: float | None = Field(default=None, ge=0)
    time: float = Field(default_factory=time.time)

    @model_validator(mode="before")
    @classmethod
    def _encode(cls, data: Any) -> Any:
        if not isinstance(data, Mapping):
            return data
        weights = data.get("weights")
        if weights is None or isinstance(weights, str):
            return data
        out = dict(data)
        try:
            out["weights"], shape = _encode_weights(weights)
        except (TypeError, ValueError) as err:
            raise ValueError(f"weights must be finite numbers: {err}") from None
        out.setdefault("shape", shape)
        if out.get("schema_version") == 1:
            out["schema_version"] = 2  # converted: the weights are now the compact encoding
        return out

    @field_validator("shape")
    @classmethod
    def _check_shape(cls, value: list[int]) -> list[int]:
        if any(n < 0 for n in value):
            raise ValueError("shape entries must be non-negative")
        return value

    @model_validator(mode="after")
    def _check_weights(self) -> ReleaseMessage:
        try:
            raw = base64.b64decode(self.weights, validate=True)
        except (binascii.Error, ValueError):
            raise ValueError("weights is not valid base64") from None
        need = 8 * math.prod(self.shape)
        if len(raw) != need:
            raise ValueError(f"shape {self.shape} needs {need // 8} weights, got {len(raw) / 8:g}")
        if not np.isfinite(np.frombuffer(raw, dtype=WEIGHTS_DTYPE)).all():
            raise ValueError("weights must be finite")
        return self

    @classmethod
    def from_weights(cls, weights: np.ndarray, **fields: Any) -> ReleaseMessage:
        """Build a release from a weight array (shape recorded).

        Parameters
        ----------
        weights : numpy.ndarray
        **fields
            All other fields.

        Returns
        -------
        ReleaseMessage
        """
        encoded, shape = _encode_weights(weights)
        return cls(weights=encoded, shape=shape, **fields)

    def weights_array(self) -> np.ndarray:
        """Return the weights as a float64 array of shape :attr:`shape`.

        Returns
        -------
        numpy.ndarray
        """
        raw = base64.b64decode(self.weights)
        return np.frombuffer(raw, dtype=WEIGHTS_DTYPE).astype(np.float64).reshape(self.shape)

    def to_json(self) -> bytes:
        """Serialise to compact UTF-8 JSON (the bytes published on the release topic); an
        event-level release has no unit fields."""
        unset = {f for f in _UNIT_FIELDS if getattr(self, f) is None}
        return self.model_dump_json(exclude=unset or None).encode("utf-8")

    @classmethod
    def from_json(cls, data: bytes | str) -> ReleaseMessage:
        """Parse and validate a release produced by :meth:`to_json` (or a version 1 one)."""
        return cls.model_validate(json.loads(data))


def _json(value: object) -> str:
    return json.dumps(value, ensure_ascii=False, separators=(",", ":"), allow_nan=False)


def _number(value: object) -> str:
    """A finite float as JSON: its ``repr``, which is what :func:`json.dumps` writes."""
    number = float(value)  # type: ignore[arg-type]
    if not math.isfinite(number):
        raise ValueError(f"{number} is not a finite number")
    return repr(number)


#: A unit-level model's release fields (absent from an event-level model's releases).
_UNIT_FIELDS = ("privacy_unit", "epsilon_event_spent")


class ReleaseEncoder:
    """Serialise a learner's release fields to the bytes of a :class:`ReleaseMessage`, fast.

    The engine publishes one release per learning step. The fields that stay the same for a
    model's run (ids, algorithm, task, shape, feature names, budget, δ, privacy flag) are
    encoded once into a template; each release fills in its step, counters, weights, spent
    budget and time. The bytes are compact JSON that :meth:`ReleaseMessage.from_json` reads
    into exactly the message ``ReleaseMessage(**fields)`` would be (``tests/test_fast_records.py``
    holds them equal); non-finite weights or budgets are refused as there.

    Examples
    --------
    >>> f = dict(model_id="m", algorithm="a", task="auc", step=3, release_index=1,
    ...          weights=[0.5, -1.0], shape=[2], feature_names=["p", "q"], rho_spent=0.1,
    ...          rho_budget=1.0, epsilon_spent=1.2, delta=1e-6, exhausted=False)
    >>> raw = ReleaseEncoder().encode(f, run_id="r", time=0.0)
    >>> ReleaseMessage.from_json(raw) == ReleaseMessage(**f, run_id="r", time=0.0)
    True
    """

    def __init__(self) -> None:
        self._key: tuple | None = None
        self._head = self._middle = self._tail = ""

    def _template(self, key: tuple) -> None:
        """Encode the fields that stay the same for a model's run (``key``, as :meth:`encode`
        builds it) once."""
        model_id, run_id, algorithm, task, shape, names, rho_budget, delta, private, unit = key
        self._head = (
            f'{{"schema_version":2,"model_id":{_json(model_id)},'
            f'"run_id":{_json(run_id)},"algorithm":{_json(algorithm)},'
            f'"task":{_json(task)},"step":'
        )
        self._middle = f'","dtype":"{WEIGHTS_DTYPE}","shape":{_json(list(shape))},' + (
            f'"feature_names":{_json(list(names))},"rho_spent":'
        )
        self._tail = (
            f',"rho_budget":{_json(rho_budget)},"delta":{_json(delta)}',
            f',"private":{_json(bool(private))}'
            + ("" if unit is None else f',"privacy_unit":{unit}')
            + ',"time":',
        )

    def encode(self, fields: Mapping[str, Any], **more: Any) -> bytes:
        """The message bytes of ``fields`` (a learner's ``release_message()``) and ``more``
        (``run_id``, ``time``; ``private`` defaults to True, ``time`` to now)."""
        data = {"run_id": None, "private": True, **fields, **more}
        weights = data["weights"]
        shape = data.get("shape")
        if type(weights) is list and shape and _flat_floats(weights):
            # A learner's release: a flat list of floats (``ravel().tolist()``). Packed by
            # struct, it is the bytes NumPy would write, at a fraction of NumPy's per-call cost.
            raw = struct.pack(f"<{len(weights)}d", *weights)
        else:
            arr = np.asarray(weights, dtype=np.float64)
            if not np.isfinite(arr).all():
                raise ValueError("weights must be finite")
            if not shape:
                data["shape"] = list(arr.shape)
            raw = arr.astype(WEIGHTS_DTYPE, copy=False).tobytes()
        self._use_template(data)
        when = data.get("time")
        stamp = _number(time.time() if when is None else when)
        return self._text(
            data["step"], data["release_index"], raw, data["rho_spent"], data["epsilon_spent"],
            data.get("epsilon_event_spent"), data["exhausted"], stamp,
        )  # fmt: skip

    def encode_many(
        self,
        fields: Mapping[str, Any],
        steps: Sequence[int],
        indices: Sequence[int],
        weights: np.ndarray,
        rhos: Sequence[float],
        epsilons: Sequence[float],
        **more: Any,
    ) -> list[bytes]:
        """The messages of a batch of releases of one model: each is :meth:`encode` of
        ``fields`` with its step, release index, weights (a row of ``weights``, in the shape
        of ``fields["shape"]``), ρ and ε spent, not exhausted, and ``more``; one time for all."""
        data = {"run_id": None, "private": True, **fields, **more}
        rows = np.ascontiguousarray(weights, dtype=WEIGHTS_DTYPE)
        if rows.ndim != 2 or len(rows) != len(steps) or not np.isfinite(rows).all():
            raise ValueError("weights must be finite, one row per release")
        if not data.get("shape"):
            raise ValueError("the batch's fields need the model's shape")
        if data.get("epsilon_event_spent") is not None:  # its ε per release is not given here
            raise ValueError("a unit-level model's releases are encoded one at a time")
        self._use_template(data)
        when = data.get("time")
        stamp = _number(time.time() if when is None else when)  # one time for the batch
        text = self._text
        return [
            text(step, index, row.tobytes(), rho, eps, None, False, stamp)
            for step, index, row, rho, eps in zip(steps, indices, rows, rhos, epsilons, strict=True)
        ]

    def _use_template(self, data: Mapping[str, Any]) -> None:
        key = (
            data["model_id"], data["run_id"], data["algorithm"], data["task"],
            tuple(data["shape"]), tuple(data["feature_names"]), data["rho_budget"],
            data["delta"], data["private"],
            None if data.get("privacy_unit") is None else _json(data["privacy_unit"]),
        )  # fmt: skip
        if key != self._key:
            self._template(key)
            self._key = key

    def _text(
        self, step, index, raw: bytes, rho, eps, eps_event, exhausted: bool, stamp: str
    ) -> bytes:
        """A release's bytes from the template: ``raw`` its weights' bytes, ``stamp`` its time
        already written as JSON."""
        weights = base64.b64encode(raw).decode()
        return (
            f'{self._head}{int(step)},"release_index":{int(index)},'
            f'"weights":"{weights}{self._middle}{_number(rho)}'
            f'{self._tail[0]},"epsilon_spent":{_number(eps)}'
            + ("" if eps_event is None else f',"epsilon_event_spent":{_number(eps_event)}')
            + f',"exhausted":{"true" if exhausted else "false"}{self._tail[1]}{stamp}}}'
        ).encode("utf-8")


def _flat_floats(values: list) -> bool:
    """Whether ``values`` are all finite floats; a non-finite one is refused here."""
    for v in values:
        if type(v) is not float:
            return False
    if not all(map(math.isfinite, values)):
        raise ValueError("weights must be finite")
    return True


def release_message_bytes(
    task: str,
    feature_names: Sequence[str],
    model_id: str,
    algorithm: str,
    privacy_unit: Mapping[str, str | int] | None = None,
) -> int:
    """An upper bound on the size of any release of a model, from its schema alone.

    Every field whose length can vary is set to its longest form (float fields to a
    17-digit mantissa with a three-digit exponent, counters to 2⁵³), so the bound holds for
    every release the model will ever make. The engine checks it against the release sink's
    limit before the first record.

    Parameters
    ----------
    task : {"auc", "metric"}
        ``d`` weights for AUC, ``d × d`` for a metric.
    feature_names : sequence of str
    model_id, algorithm : str
    privacy_unit : mapping, optional
        A unit-level model's relation (its release messages carry it).

    Returns
    -------
    int
        Bytes of the serialised message.

    Examples
    --------
    >>> release_message_bytes("metric", [f"f{i}" for i in range(240)], "m", "OnPairStrC")
    616451
    """
    d = len(feature_names)
    shape = (d,) if task == "auc" else (d, d)
    longest = -1.2345678901234567e-300  # the longest repr of a float64 in JSON (24 characters)
    big = 2**53
    msg = ReleaseMessage.model_construct(
        schema_version=2,
        model_id=model_id,
        run_id="f" * 32,
        algorithm=algorithm,
        task=task,
        step=big,
        release_index=big,
        weights=base64.b64encode(bytes(8 * math.prod(shape))).decode("ascii"),
        dtype=WEIGHTS_DTYPE,
        shape=[big] * len(shape),
        feature_names=list(feature_names),
        rho_spent=longest,
        rho_budget=longest,
        epsilon_spent=longest,
        delta=longest,
        exhausted=False,
        private=False,
        privacy_unit=None if privacy_unit is None else dict(privacy_unit),
        epsilon_event_spent=None if privacy_unit is None else longest,
        time=longest,
    )
    return len(msg.to_json())


def _printable(text: str) -> str:
    """``text`` with what UTF-8 cannot encode (lone surrogates) spelled as ``\\udXXX`` escapes.

    Reasons and messages may quote a feature name from a record, and a JSON ``"\\ud800"``
    key decodes to a lone surrogate, which no UTF-8 serialiser accepts: a dead letter must
    never fail to serialise because of the record it reports.
    """
    return text.encode("utf-8", "backslashreplace").decode("utf-8")


class DeadLetter(BaseModel):
    """A rejected input record, as written to the dead-letter sink.

    Parameters
    ----------
    reason : str
        One of :data:`REASONS` (or another short code from the engine).
    message : str
        Human-readable explanation.
    payload : str
        The raw payload decoded as UTF-8 (invalid bytes replaced), cut to 10 000 characters.
    payload_length : int
        Length of the original payload in bytes (UTF-8 for text).
    truncated : bool
        True if ``payload`` was cut.
    source_position : dict, optional
        Where the record came from (e.g. topic, partition and offset, or line).
    time : float, default now
        Unix seconds when the record was rejected.

    Notes
    -----
    Dead letters contain raw input: protect them like the input stream.
    """

    model_config = ConfigDict(extra="forbid", frozen=True)

    reason: str
    message: str
    payload: str
    payload_length: int = Field(ge=0)
    truncated: bool = False
    source_position: dict[str, Any] | None = None
    time: float = Field(default_factory=time.time)

    @classmethod
    def from_raw(
        cls,
        reason: str,
        message: str,
        payload: bytes | bytearray | memoryview | str | Mapping[str, Any] | None,
        position: Mapping[str, Any] | None = None,
    ) -> DeadLetter:
        """Build a dead letter from whatever the source delivered.

        Parameters
        ----------
        reason, message : str
        payload : bytes, str, dict or None
            The raw record. Mappings are rendered as JSON (non-JSON values via ``repr``).
        position : dict, optional

        Returns
        -------
        DeadLetter

        Examples
        --------
        >>> DeadLetter.from_raw("invalid_json", "bad", b"\\xff{").payload
        '\\ufffd{'
        """
        if payload is None:
            raw = b""
        elif isinstance(payload, Mapping):
            raw = json.dumps(payload, default=repr, allow_nan=True).encode("utf-8")
        elif isinstance(payload, str):
            raw = payload.encode("utf-8", "surrogatepass")
        else:
            raw = bytes(payload)
        # Decode only the head: a 1 GB payload must not be decoded in full just to be cut.
        # Four bytes per character is the UTF-8 maximum, so the head always covers the limit.
        head = raw[: 4 * _DEAD_LETTER_MAX_CHARS].decode("utf-8", errors="replace")
        text = head[:_DEAD_LETTER_MAX_CHARS]
        truncated = len(text) < len(head) or len(raw) > 4 * _DEAD_LETTER_MAX_CHARS
        return cls(
            reason=_printable(reason),
            message=_printable(message),
            payload=text,
            payload_length=len(raw),
            truncated=truncated,
            source_position=dict(position) if position is not None else None,
        )

    def to_json(self) -> bytes:
        """Serialise to compact UTF-8 JSON."""
        return self.model_dump_json().encode("utf-8")
