"""River-facing behaviour of the two tasks: AUC scoring and Mahalanobis metric transforms.

Both read the model through ``_served_weights()`` — the latest release (or the smoothed
release) for the private learners — never the internal iterate: predictions leave the trust
boundary too (``docs/privacy.md``, *Threat model*).

"""

from __future__ import annotations

import math

import numpy as np
from river import base

from stream_dp.linalg import apply_sqrt_factors, psd_sqrt, sqrt_factors
from stream_dp.online.composition import LEARNED_METRIC

__all__ = [
    "AUCInterface",
    "MetricInterface",
    "PrivateMetricDistance",
    "RiverChecks",
    "SEEDED_RIVER_CHECKS",
]

#: River's checks that rebuild the model with ``seed=42`` (``river.checks.utils.seed_params``).
SEEDED_RIVER_CHECKS = frozenset(
    {
        "check_shuffle_features_no_impact",
        "check_seeding_is_idempotent",
        "check_predict_many_matches_predict_one",
        "check_learn_many_matches_learn_one",
        "check_predict_proba_many_matches_predict_proba_one",
        "check_transform_many_matches_transform_one",
    }
)


class RiverChecks:
    """What river's ``check_estimator`` may do to a learner.

    The checks in :data:`SEEDED_RIVER_CHECKS` set ``seed=42``; a private learner refuses an
    integer seed (it would make its noise guessable) unless ``reproducible=True`` declares the
    run non-private. So a private construction — the README's, ``seed=None`` — skips those
    checks, and a reproducible one runs them all (``tests/test_river_checks.py`` does both).
    """

    def _unit_test_skips(self) -> set[str]:
        return set() if self.reproducible else set(SEEDED_RIVER_CHECKS)


class AUCInterface(RiverChecks, base.Classifier):
    """Bipartite ranking as a binary river classifier.

    The score of ``x`` is ``w̃ᵀx`` (x clipped to R, as in training). ``predict_proba_one``
    returns ``P(True) = (1 + w̃ᵀx / (‖w̃‖R)) / 2``: the score as a fraction of its largest
    possible value (Cauchy–Schwarz: ``|w̃ᵀx| ≤ ‖w̃‖R``), moved to ``[0, 1]``. It is a monotone
    score for ranking (AUC), not a calibrated probability — the pairwise loss is invariant to a
    shift of the scores, so there is no intercept to calibrate with. The map reads only the
    served release and the public radius R, never data.

    Why not the logistic function: the score is bounded by ``‖w̃‖R ≤ DR`` (1 by default), so
    the logistic keeps every probability in ``[0.27, 0.73]`` and usually in a much narrower band,
    and river's default ``metrics.ROCAUC()`` — which counts ten thresholds evenly spaced in
    ``[0, 1]`` — sees two or three operating points and reports an AUC near 0.5 for a model
    whose exact AUC is 0.9. Spread over ``[0, 1]`` by the model's own bound, the same ten
    thresholds come within a few hundredths of the exact AUC (``docs/algorithms.md``,
    *Measuring AUC with river*). For the exact value, use :func:`stream_dp.metrics.roc_auc`
    on the scores.
    """

    @property
    def _multiclass(self) -> bool:
        return False

    def score_one(self, x) -> float:
        """The ranking score ``w̃ᵀx`` (0 before the first release)."""
        schema = self._schema
        if schema.names is None:  # nothing learned yet (as _model_input, inlined)
            return 0.0
        v = schema.to_clipped(x, self._radius, learning=False)
        w = self._served_weights()
        if w is None:
            return 0.0
        return float(w.dot(v))  # the method: half the call overhead of @ on short vectors

    def predict_proba_one(self, x, **kwargs) -> dict[bool, float]:
        inp = self._input  # (the _schema and _radius properties, inlined: a per-record path)
        schema, radius = inp.schema, inp.radius
        if schema.names is None:
            return {False: 0.5, True: 0.5}
        s = self._state
        ring = s.ring
        if ring is not None and s.mechanism.publishes:  # _served_and_norm's common case
            w, norm = ring.served_and_norm(s.smoothed)
        else:
            w, norm = self._served_and_norm()
        if w is None:
            return {False: 0.5, True: 0.5}
        v = schema.to_clipped(x, radius, learning=False)
        bound = norm * radius
        if bound <= 0.0:
            return {False: 0.5, True: 0.5}
        p = 0.5 * (1.0 + float(w.dot(v)) / bound)  # see _spread; clipped as min(max(p, 0), 1)
        if p < 0.0:
            p = 0.0
        elif p > 1.0:
            p = 1.0
        return {False: 1.0 - p, True: p}

    def predict_one(self, x, **kwargs) -> bool:
        return self.score_one(x) > 0.0

    def score_many(self, X) -> np.ndarray:
        """Scores ``w̃ᵀx`` of the rows of a 2-D array or a DataFrame (as :meth:`score_one`)."""
        w = self._served_weights()
        A = self._model_inputs(X)
        if w is None or A is None:
            return np.zeros(len(X))
        return A @ w

    def predict_proba_many(self, X):
        """``P(False)``, ``P(True)`` per row: a DataFrame for a DataFrame (as river's mini-batch
        API), else an array of shape ``(n, 2)``."""
        w = self._served_weights()
        bound = 0.0 if w is None else math.sqrt(w.dot(w)) * self._radius
        p = _spread(self.score_many(X), bound)
        if hasattr(X, "columns") and hasattr(X, "index"):
            import pandas as pd

            return pd.DataFrame({False: 1.0 - p, True: p}, index=X.index)
        return np.column_stack([1.0 - p, p])

    def predict_many(self, X) -> np.ndarray:
        """``score > 0`` per row."""
        return self.score_many(X) > 0.0


def _spread(score: np.ndarray, bound: float) -> np.ndarray:
    """``(1 + score/bound)/2`` in ``[0, 1]`` (½ for a zero model): ``|score| ≤ bound`` holds
    by Cauchy–Schwarz, the clip only absorbs rounding."""
    if bound <= 0.0:
        return np.full(len(score), 0.5)
    return np.clip(0.5 * (1.0 + score / bound), 0.0, 1.0)


class MetricInterface(RiverChecks, base.SupervisedTransformer):
    """Mahalanobis metric learning as a river supervised transformer.

    ``transform_one(x)`` returns ``W̃^{1/2}x`` keyed by feature name, so Euclidean distances in
    the output are the learned distances ``√((a − b)ᵀW̃(a − b))``. A diagonal metric (released
    as the vector w of ``W̃ = diag(w)``) scales each feature by ``√w_k``. Before the first
    release the metric is the identity (a data-independent choice).

    For k-nearest neighbours use :class:`~stream_dp.online.PrivateMetricKNN`. The composition
    ``metric learner | neighbors.KNNClassifier()`` is refused with
    :class:`~stream_dp.online.composition.UnsupportedComposition` (the learner's tag
    ``LEARNED_METRIC`` says why: :mod:`stream_dp.online.composition`): river's ``Pipeline``
    (0.26) runs a supervised transformer as a final step when learning — the kNN stores the
    records untransformed — but transforms the queries, and even a kNN that stored transformed
    records would hold each under the release of its own time while the metric changes with
    every release. Measured: 16 % accuracy on ``datasets.ImageSegments`` at ε = 4 (chance 14 %),
    where ``PrivateMetricKNN`` has 86 %.
    """

    def _more_tags(self) -> set[str]:
        return {LEARNED_METRIC}

    def _apply_sqrt(self, W: np.ndarray, v: np.ndarray) -> np.ndarray:
        """``W^{1/2} v``, from a per-release cache: the release's own eigenpairs when the
        kernel kept them (no second eigendecomposition, no d × d root), else the root."""
        key = self._served_version()
        cache = self.__dict__.get("_sqrt_cache_v")
        if W.ndim == 1:  # a diagonal metric: W^{1/2} is the elementwise root
            if cache is None or cache[0] != key:
                cache = (key, np.sqrt(np.maximum(W, 0.0)), None)
                self.__dict__["_sqrt_cache_v"] = cache
            return cache[1] * v
        if cache is None or cache[0] != key:
            factors = self._served_factors()
            cache = (key, psd_sqrt(W), None) if factors is None else (key, *sqrt_factors(*factors))
            self.__dict__["_sqrt_cache_v"] = cache
        _, L, R = cache
        if R is None:
            return L @ v
        return apply_sqrt_factors(L, R, v)

    def _served_factors(self) -> tuple[np.ndarray, np.ndarray] | None:
        return None

    def transform_one(self, x) -> dict:
        v = self._model_input(x)
        if v is None:
            return dict(x) if isinstance(x, dict) else {}
        W = self._served_weights()
        out = v if W is None else self._apply_sqrt(W, v)
        return self._schema.to_dict(out)

    def distance(self, a, b) -> float:
        """The learned (private) Mahalanobis distance between two records."""
        va, vb = self._model_input(a), self._model_input(b)
        if va is None or vb is None:
            return 0.0
        d = va - vb
        W = self._served_weights()
        if W is None:
            return float(math.sqrt(d @ d))
        quad = float(W @ (d * d)) if W.ndim == 1 else float(d @ W @ d)
        return float(math.sqrt(max(quad, 0.0)))

    def distance_function(self) -> PrivateMetricDistance:
        """A distance callable for river's kNN that always follows this live learner."""
        return PrivateMetricDistance(self)


class PrivateMetricDistance:
    """``dist(a, b)`` through a live metric learner, safe to hand to river's search engines.

    River's ``KNNClassifier`` deep-copies its engine (and so its ``dist_func``) on construction:
    a bound method of a learner would be frozen at a snapshot and never see a newer release.
    This object survives deep copies as a *reference* to the same learner.
    """

    __slots__ = ("learner",)

    def __init__(self, learner: MetricInterface) -> None:
        self.learner = learner

    def __call__(self, a, b) -> float:
        return self.learner.distance(a, b)

    def __deepcopy__(self, memo) -> PrivateMetricDistance:
        return self

    def __copy__(self) -> PrivateMetricDistance:
        return self

    def __reduce__(self):
        return (PrivateMetricDistance, (self.learner,))
