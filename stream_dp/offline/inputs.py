"""Input of the offline estimators: feature matrices and class labels, checked as scikit-learn
checks them, and rows clipped to ``‖x‖₂ ≤ R`` (part of every privacy proof, ``docs/privacy.md``,
*Privacy unit and neighbouring streams*).

Rejected input is a ``ValueError`` (:class:`stream_dp.records.InvalidRecord` for features),
never a silent repair: a record the learner cannot read is not learned from.
"""

from __future__ import annotations

import numbers
import warnings

import numpy as np
from scipy import sparse

from stream_dp.offline._sklearn import DataConversionWarning
from stream_dp.records import InvalidRecord, clip_norm

__all__ = ["InvalidFeatureType", "encode_labels", "label_array", "prepare_features"]


class InvalidFeatureType(InvalidRecord, TypeError):
    """X holds something that is not a number: a ``ValueError`` like every rejected input, and a
    ``TypeError`` as NumPy (and scikit-learn's input validation) raise for it."""


def prepare_features(X, data_radius: float) -> np.ndarray:
    """A float matrix with every row clipped to ``‖x‖₂ ≤ R``; anything else is refused.

    Refused with a ``ValueError`` (:class:`stream_dp.records.InvalidRecord`): sparse matrices,
    complex numbers, non-finite values, arrays that are not 2-D with at least one feature, and
    entries that are not real numbers (also a ``TypeError``, :class:`InvalidFeatureType`).

    Examples
    --------
    >>> prepare_features([[3.0, 4.0], [0.1, 0.0]], 1.0)
    array([[0.6, 0.8],
           [0.1, 0. ]])

    """
    if sparse.issparse(X):
        raise InvalidRecord(
            "wrong_type", "sparse input is not supported: pass a dense array (X.toarray())"
        )
    try:
        with np.errstate(over="ignore", invalid="ignore"):  # values too large for a double: inf
            raw = np.asarray(X)
            if raw.dtype.kind == "c" or any(isinstance(v, complex) for v in _objects(raw)):
                raise InvalidRecord("wrong_type", "Complex data not supported")
            arr = raw.astype(float)
    except TypeError as exc:  # an entry that is not a number (a dict, None, ...)
        raise InvalidFeatureType("wrong_type", f"X must hold real numbers: {exc}") from None
    except (ValueError, OverflowError) as exc:  # ragged rows, text, ints beyond a double, ...
        if isinstance(exc, InvalidRecord):
            raise
        raise InvalidRecord("wrong_type", "X must be a 2-D array of real numbers") from None
    if arr.ndim != 2:
        raise InvalidRecord(
            "wrong_type",
            f"Expected a 2-D array (n_samples, n_features), got shape {arr.shape}. Reshape your "
            "data with array.reshape(-1, 1) for a single feature or array.reshape(1, -1) for a "
            "single sample.",
        )
    if arr.shape[1] == 0:
        raise InvalidRecord(
            "wrong_type",
            f"Found array with 0 feature(s) (shape={arr.shape}) while a minimum of 1 is required.",
        )
    if not np.isfinite(arr).all():
        raise InvalidRecord("non_finite", "features must be finite (no NaN or inf)")
    return np.array([clip_norm(row, float(data_radius)) for row in arr]).reshape(arr.shape)


def _objects(arr: np.ndarray):
    """The entries of an object array (nothing for a numeric one)."""
    return arr.ravel().tolist() if arr.dtype == object else ()


def label_array(y, n_samples: int | None, owner: str) -> np.ndarray:
    """``y`` as a 1-D array of ``n_samples`` labels (a column vector is accepted, with a
    warning, as scikit-learn does)."""
    if y is None:
        raise ValueError(f"{owner} requires y to be passed, but the target y is None")
    try:
        arr = np.asarray(y)
    except (TypeError, ValueError):  # ragged or otherwise not an array of labels
        raise ValueError("y should be a 1d array of labels") from None
    if arr.ndim == 2 and arr.shape[1] == 1:
        warnings.warn(
            "A column-vector y was passed when a 1d array was expected. Please change the "
            "shape of y to (n_samples,), for example using ravel().",
            DataConversionWarning,
            stacklevel=4,
        )
        arr = arr.ravel()
    if arr.ndim != 1:
        raise ValueError(f"y should be a 1d array, got an array of shape {arr.shape} instead")
    if n_samples is not None and len(arr) != n_samples:
        raise ValueError(
            f"Found input variables with inconsistent numbers of samples: [{n_samples}, {len(arr)}]"
        )
    return arr


def _check_label_values(y: np.ndarray) -> None:
    """Class labels: no complex, missing, infinite or continuous (non-integer) values."""
    if y.dtype.kind == "c":
        raise ValueError("Complex data not supported")
    if y.dtype.kind == "f":
        numeric = y
    else:
        values = _objects(y)
        if any(isinstance(v, complex) for v in values):
            raise ValueError("Complex data not supported")
        if any(v is None for v in values):
            raise ValueError("Input y contains None: every record needs a class label")
        numbers_only = [v for v in values if isinstance(v, numbers.Number)]
        try:
            numeric = np.array([float(v) for v in numbers_only], dtype=float)
        except (TypeError, ValueError, OverflowError):
            raise ValueError("Unknown label type: a label is a number beyond a double") from None
    if not np.isfinite(numeric).all():
        raise ValueError("Input y contains NaN or infinity: every record needs a class label")
    if np.any(numeric != np.round(numeric)):
        raise ValueError(
            "Unknown label type: continuous. Labels are classes (integers, strings, booleans), "
            "not regression targets"
        )


def encode_labels(y, n_samples: int, task: str, owner: str = "this estimator"):
    """Validated class labels: ``(Y, classes)`` with ``classes`` the sorted distinct labels.

    AUC: exactly two classes; ``Y = +1`` for ``classes[1]`` (the positive class: ``1``,
    ``True``, ``+1``, or the larger of two strings, as in scikit-learn), ``−1`` otherwise.
    Metric: any number of classes; ``Y`` is the index of the class (only equality matters).
    The set of classes is schema, like the feature names: it is not protected.

    Examples
    --------
    >>> Y, classes = encode_labels(["no", "yes", "no"], 3, "auc")
    >>> Y.tolist(), classes.tolist()
    ([-1.0, 1.0, -1.0], ['no', 'yes'])

    """
    arr = label_array(y, n_samples, owner)
    _check_label_values(arr)
    try:
        classes, index = np.unique(arr, return_inverse=True)
    except TypeError:  # labels that cannot be compared with each other
        raise ValueError("Unknown label type: labels of mixed types cannot be ordered") from None
    index = index.ravel()
    if task == "auc":
        if len(classes) > 2:
            raise ValueError(
                "Only binary classification is supported. The type of the target is "
                f"multiclass ({len(classes)} classes): use task='metric' for class labels"
            )
        if len(classes) < 2:
            raise ValueError(
                f"AUC learning needs both classes in y, got {len(classes)} class: "
                "a ranking needs positive and negative records"
            )
        return np.where(index == 1, 1.0, -1.0), classes
    return index.astype(float), classes
