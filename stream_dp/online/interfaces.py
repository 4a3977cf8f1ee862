"""River-facing behaviour of the two tasks: AUC scoring and Mahalanobis metric transforms.

Both read the model through ``_served_weights()`` — the latest release (or the smoothed
release) for the private learners — never the internal iterate: predictions leave the trust
boundary too (SPEC §6).

"""

from __future__ import annotations

import math

import numpy as np
from river import base
from scipy import special

__all__ = ["AUCInterface", "MetricInterface", "PrivateMetricDistance", "psd_sqrt"]


class AUCInterface(base.Classifier):
    """Bipartite ranking as a binary river classifier.

    The score of ``x`` is ``w̃ᵀx`` (x clipped to R, as in training). ``predict_proba_one``
    maps it through the logistic function: a monotone score for ranking (AUC), not a calibrated
    probability — the pairwise loss is invariant to a shift of the scores, so there is no
    intercept to calibrate with.
    """

    @property
    def _multiclass(self) -> bool:
        return False

    def score_one(self, x) -> float:
        """The ranking score ``w̃ᵀx`` (0 before the first release)."""
        w = self._served_weights()
        v = self._model_input(x)
        if w is None or v is None:
            return 0.0
        return float(w @ v)

    def predict_proba_one(self, x, **kwargs) -> dict[bool, float]:
        p = float(special.expit(self.score_one(x)))
        return {False: 1.0 - p, True: p}

    def predict_one(self, x, **kwargs) -> bool:
        return self.score_one(x) > 0.0


def psd_sqrt(W: np.ndarray) -> np.ndarray:
    """Symmetric square root of a PSD matrix (negative eigenvalues from rounding clipped)."""
    lam, V = np.linalg.eigh(0.5 * (W + W.T))
    return (V * np.sqrt(np.maximum(lam, 0.0))) @ V.T


class MetricInterface(base.SupervisedTransformer):
    """Mahalanobis metric learning as a river supervised transformer.

    ``transform_one(x)`` returns ``W̃^{1/2}x`` keyed by feature name, so Euclidean distances in
    the output are the learned distances ``√((a − b)ᵀW̃(a − b))``. Before the first release the
    metric is the identity (a data-independent choice).
    """

    def _sqrt(self, W: np.ndarray) -> np.ndarray:
        key = self._served_version()
        cache = self.__dict__.get("_sqrt_cache_v")
        if cache is None or cache[0] != key:
            cache = (key, psd_sqrt(W))
            self.__dict__["_sqrt_cache_v"] = cache
        return cache[1]

    def transform_one(self, x) -> dict:
        v = self._model_input(x)
        if v is None:
            return dict(x) if isinstance(x, dict) else {}
        W = self._served_weights()
        out = v if W is None else self._sqrt(W) @ v
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
        return float(math.sqrt(max(float(d @ W @ d), 0.0)))

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
