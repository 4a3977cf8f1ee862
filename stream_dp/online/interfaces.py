"""River-facing behaviour of the two tasks: AUC scoring and Mahalanobis metric transforms.

Both read the model through ``_served_weights()`` — the latest release (or the smoothed
release) for the private learners — never the internal iterate: predictions leave the trust
boundary too (``docs/privacy.md``, *Threat model*).

"""

from __future__ import annotations

import math

import numpy as np
from river import base
from scipy import special

from stream_dp.linalg import apply_sqrt_factors, psd_sqrt, sqrt_factors

__all__ = ["AUCInterface", "MetricInterface", "PrivateMetricDistance"]


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
        schema = self._schema
        if schema.names is None:  # nothing learned yet (as _model_input, inlined)
            return 0.0
        v = schema.to_clipped(x, self._radius, learning=False)
        w = self._served_weights()
        if w is None:
            return 0.0
        return float(w.dot(v))  # the method: half the call overhead of @ on short vectors

    def predict_proba_one(self, x, **kwargs) -> dict[bool, float]:
        s = self.score_one(x)
        # The logistic function, never overflowing: e^{−|s|} ≤ 1.
        if s >= 0.0:
            p = 1.0 / (1.0 + math.exp(-s))
        else:
            e = math.exp(s)
            p = e / (1.0 + e)
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
        p = special.expit(self.score_many(X))
        if hasattr(X, "columns") and hasattr(X, "index"):
            import pandas as pd

            return pd.DataFrame({False: 1.0 - p, True: p}, index=X.index)
        return np.column_stack([1.0 - p, p])

    def predict_many(self, X) -> np.ndarray:
        """``score > 0`` per row."""
        return self.score_many(X) > 0.0


class MetricInterface(base.SupervisedTransformer):
    """Mahalanobis metric learning as a river supervised transformer.

    ``transform_one(x)`` returns ``W̃^{1/2}x`` keyed by feature name, so Euclidean distances in
    the output are the learned distances ``√((a − b)ᵀW̃(a − b))``. Before the first release the
    metric is the identity (a data-independent choice).
    """

    def _apply_sqrt(self, W: np.ndarray, v: np.ndarray) -> np.ndarray:
        """``W^{1/2} v``, from a per-release cache: the release's own eigenpairs when the
        kernel kept them (no second eigendecomposition, no d × d root), else the root."""
        key = self._served_version()
        cache = self.__dict__.get("_sqrt_cache_v")
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
