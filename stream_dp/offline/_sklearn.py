"""The scikit-learn protocol of the offline estimators; scikit-learn itself stays optional.

With scikit-learn installed (1.6 or newer: the ``sklearn`` extra), every offline estimator *is*
a scikit-learn estimator: it derives from ``sklearn.base.BaseEstimator`` and declares its tags
(``__sklearn_tags__``), so ``clone``, ``Pipeline``, ``cross_val_score``, ``GridSearchCV``,
``is_classifier`` and ``check_estimator`` treat it as one. (Before 1.6 scikit-learn read tags
from another protocol, and its ``check_classifiers_classes`` required ``predict`` to output
every class on the training set, which a noisy ranking model without intercept cannot promise;
1.6 dropped that requirement.) Without scikit-learn the same classes derive from
:class:`ParamsBase`, which implements the part of the protocol that needs no library (the
parameters are the ``__init__`` arguments, as in scikit-learn and river), so importing and
using :mod:`stream_dp.offline` never requires it.

What the tags say, and why (``docs/algorithms.md``, *scikit-learn*):

* ``task="auc"`` makes a binary classifier (``predict``, ``predict_proba``,
  ``decision_function``; ``is_classifier`` is True), ``task="metric"`` a transformer
  (``transform``, ``fit_transform``). A method of the other task does not exist on the
  instance (``hasattr`` is False), as with scikit-learn's ``available_if``.
* ``non_deterministic``: True unless the run is reproducible (an explicit ``seed``, allowed
  only with ``reproducible=True``). A private estimator draws a fresh noise secret for every
  fit, so two fits on the same data publish different models. That is the privacy guarantee,
  not a defect: a secret reused across fits would let anyone who sees two releases of
  neighbouring datasets (two cross-validation folds) subtract the noise.
* ``poor_score``: a released model carries noise calibrated to hide any one record, and a
  ranking model has no intercept (its threshold at 0 is not learned), so the training accuracy
  scikit-learn expects of a classifier (0.83 on its blobs) is not a meaningful bar.

Three of scikit-learn's checks refit one estimator and require identical outputs whatever the
``non_deterministic`` tag says; :func:`expected_failed_checks` names them for a private
estimator, and each passes for a reproducible one.
"""

from __future__ import annotations

import functools
import inspect
import types
from collections.abc import Callable

__all__ = [
    "SKLEARN_INSTALLED",
    "DataConversionWarning",
    "EstimatorBase",
    "NotFittedError",
    "ParamsBase",
    "estimator_tags",
    "expected_failed_checks",
    "for_task",
]


class ParamsBase:
    """The parameter protocol of scikit-learn and river, for when scikit-learn is not installed.

    Parameters are the ``__init__`` arguments, stored unchanged under their own names;
    ``get_params``/``set_params`` read and write them, and ``repr`` shows those that differ
    from their defaults.
    """

    @classmethod
    def _get_param_names(cls) -> list[str]:
        sig = inspect.signature(cls.__init__)
        return sorted(
            p.name
            for p in sig.parameters.values()
            if p.name != "self" and p.kind not in (p.VAR_POSITIONAL, p.VAR_KEYWORD)
        )

    def get_params(self, deep: bool = True) -> dict:
        """The constructor parameters (``deep`` has no effect: no parameter is an estimator)."""
        return {name: getattr(self, name) for name in self._get_param_names()}

    def set_params(self, **params):
        """Set constructor parameters; an unknown name raises ``ValueError``. Returns self."""
        valid = set(self._get_param_names())
        for k, v in params.items():
            if k not in valid:
                raise ValueError(f"Invalid parameter {k!r} for estimator {type(self).__name__}")
            setattr(self, k, v)
        return self

    def __repr__(self) -> str:
        defaults = {
            p.name: p.default for p in inspect.signature(type(self).__init__).parameters.values()
        }
        items = [
            f"{k}={v!r}"
            for k, v in self.get_params().items()
            if not (k in defaults and _same(defaults[k], v))
        ]
        return f"{type(self).__name__}({', '.join(items)})"


def _same(a, b) -> bool:
    try:
        return bool(a == b) and type(a) is type(b)
    except Exception:  # arrays and other non-scalar parameters
        return a is b


try:
    from sklearn.base import BaseEstimator as EstimatorBase
    from sklearn.exceptions import DataConversionWarning, NotFittedError

    SKLEARN_INSTALLED = True
except ImportError:  # scikit-learn is an optional extra
    SKLEARN_INSTALLED = False
    EstimatorBase = ParamsBase

    class NotFittedError(ValueError, AttributeError):
        """A model was used before ``fit`` (scikit-learn's exception of the same name)."""

    class DataConversionWarning(UserWarning):
        """Input was converted to the expected form (scikit-learn's warning of the same name)."""


class for_task:  # noqa: N801 - used as a decorator, like scikit-learn's available_if
    """A method that exists only when the estimator's ``task`` is ``task``.

    On an instance of the other task, reading the attribute raises ``AttributeError`` naming
    the task it belongs to, so ``hasattr(model, "predict")`` answers for the task the model
    was built with.

    Examples
    --------
    >>> class M:
    ...     task = "metric"
    ...     @for_task("auc")
    ...     def predict(self, X):
    ...         return X
    >>> hasattr(M(), "predict")
    False

    """

    def __init__(self, task: str) -> None:
        self.task = task
        self.fn: Callable | None = None

    def __call__(self, fn: Callable) -> for_task:
        self.fn = fn
        functools.update_wrapper(self, fn)
        return self

    def __get__(self, obj, owner=None):
        if obj is None:
            return self.fn
        if obj.task != self.task:
            raise AttributeError(
                f"{self.fn.__name__} is for task={self.task!r}; "
                f"this {type(obj).__name__} has task={obj.task!r}"
            )
        return types.MethodType(self.fn, obj)


def estimator_tags(estimator, tags):
    """Complete scikit-learn's default ``tags`` for an offline estimator (see the module docs)."""
    from sklearn.utils import ClassifierTags, TransformerTags

    tags.non_deterministic = estimator.seed is None
    tags.target_tags.required = True
    tags.input_tags.sparse = False
    if estimator.task == "auc":
        tags.estimator_type = "classifier"
        tags.classifier_tags = ClassifierTags(multi_class=False, poor_score=True)
    else:
        tags.transformer_tags = TransformerTags()
    return tags


_REFIT_AND_COMPARE = (
    "refits the estimator and requires the same predictions; a private estimator draws a fresh "
    "noise secret for every fit, so two fits publish different models by design (the check "
    "passes with seed=<int>, reproducible=True, which is not private)"
)


def expected_failed_checks(estimator) -> dict[str, str]:
    """The scikit-learn checks a private ``estimator`` fails by design, with the reason.

    Pass it to ``sklearn.utils.estimator_checks.check_estimator(estimator,
    expected_failed_checks=...)``. Empty for a reproducible estimator (explicit ``seed``),
    which passes every check.

    Examples
    --------
    >>> from stream_dp.offline import DPGDSC
    >>> sorted(expected_failed_checks(DPGDSC()))
    ['check_classifier_data_not_an_array', 'check_fit_idempotent', 'check_supervised_y_2d']
    >>> expected_failed_checks(DPGDSC(seed=0, reproducible=True))
    {}

    """
    if estimator.seed is not None:
        return {}
    names = ["check_fit_idempotent"]
    if estimator.task == "auc":
        names += ["check_classifier_data_not_an_array", "check_supervised_y_2d"]
    return dict.fromkeys(names, _REFIT_AND_COMPARE)
