"""Machinery shared by the offline private pairwise learners.

Every offline learner takes a finite dataset, returns one private model and keeps a ledger of
what it released. This module holds what they share, so that no algorithm re-implements it:

* the estimator protocol (:mod:`stream_dp.offline._sklearn`): parameters are the ``__init__``
  arguments, scikit-learn tags, methods that exist only for their task, ``score``;
  scikit-learn itself is optional;
* secrets: ``seed=None`` (the default) draws a fresh 128-bit secret for every fit; an integer
  seed is refused unless ``reproducible=True`` declares the run non-private, which the
  ledger then says (:func:`stream_dp.privacy.secrets.check_seed`);
* data preparation (:mod:`stream_dp.offline.inputs`): rows clipped to ``‖x‖₂ ≤ R`` (part of
  every privacy proof), non-finite, complex or sparse input rejected; labels checked as
  scikit-learn does (two classes for AUC, any classes for a metric);
* the loss and constraint set of a task (shared :mod:`stream_dp.losses` and
  :mod:`stream_dp.constraints`), with the constants G, L, α derived once by the loss;
* output perturbation: classic Gaussian (``ApproxDPAccountant``) or Laplace
  (``PureDPAccountant``) noise drawn from :class:`stream_dp.privacy.KeyedNoise` under the
  ``"release"`` purpose, calibrated by the generic mechanisms of
  :mod:`stream_dp.privacy.mechanisms` from the sensitivity each paper's module derives, then
  ``Π_C``;
* the ledger: every charge of every offline algorithm goes through
  :meth:`OfflinePairwiseBase._charge`, before the value it pays for is returned;
* prediction from the **release only**: ``decision_function``/``predict_proba``/``predict``
  (AUC) and ``transform``/``distance`` (metric).

Neighbouring datasets differ in one record (replace-one, ``docs/privacy.md``, *Privacy unit and
neighbouring streams*). Each fit starts a fresh ledger that belongs to the model it releases; a
fit that raises leaves the estimator as it was.
"""

from __future__ import annotations

import contextlib
import math

import numpy as np
from scipy import special

from stream_dp.constraints import ConstraintSet, L2Ball, PSDFrobeniusBall, PSDNuclearBall
from stream_dp.linalg import psd_sqrt
from stream_dp.losses import LossConstants, PairwiseLoss, Regularized, get_loss
from stream_dp.metrics import pair_roc_auc, roc_auc
from stream_dp.offline._sklearn import (
    EstimatorBase,
    NotFittedError,
    estimator_tags,
    for_task,
)
from stream_dp.offline.inputs import (
    encode_labels,
    label_array,
    prepare_features,
)
from stream_dp.privacy.budget import PrivacyBudget, approx_budget, pure_budget
from stream_dp.privacy.events import ApproxDPEvent, Event, LaplaceEvent
from stream_dp.privacy.mechanisms import gaussian_sigma_classic_safe, laplace_scale_from_l2
from stream_dp.privacy.noise import KeyedNoise
from stream_dp.privacy.secrets import check_seed

__all__ = ["OfflinePairwiseBase", "make_constraint"]

TASKS = ("auc", "metric")


def make_constraint(task: str, radius: float, kind: str = "default") -> ConstraintSet:
    """C for a task: L2 ball (AUC), PSD ∩ Frobenius ball or PSD ∩ nuclear ball (metric).

    Examples
    --------
    >>> make_constraint("metric", 1.0, "nuclear")
    PSDNuclearBall(radius=1.0)

    """
    if task == "auc":
        if kind not in ("default", "l2"):
            raise ValueError(f"the AUC task uses the L2 ball, got constraint={kind!r}")
        return L2Ball(radius)
    if kind in ("default", "frobenius"):
        return PSDFrobeniusBall(radius)
    if kind == "nuclear":
        return PSDNuclearBall(radius)
    raise ValueError(f"constraint must be 'frobenius' or 'nuclear' for metric, got {kind!r}")


def _positive(name: str, v, allow_none: bool = False) -> None:
    if v is None and allow_none:
        return
    if isinstance(v, bool) or not isinstance(v, int | float) or not (v > 0 and math.isfinite(v)):
        raise ValueError(f"{name} must be a positive finite number, got {v!r}")


def _positive_int(name: str, v, allow_none: bool = True) -> None:
    if v is None and allow_none:
        return
    if isinstance(v, bool) or not isinstance(v, int | np.integer) or v < 1:
        raise ValueError(f"{name} must be an int >= 1, got {v!r}")


class OfflinePairwiseBase(EstimatorBase):
    """Base class of the offline learners (not an algorithm by itself).

    Subclasses implement ``_fit_private(X, Y)`` returning the released model, using the helpers
    below, and ``_statistic(X, Y, noise)`` (the statistic the mechanism perturbs, for audits).
    """

    #: Tasks the algorithm supports.
    _tasks: tuple[str, ...] = TASKS
    #: Whether δ = 0 (pure ε-DP with Laplace noise) is supported.
    _supports_pure: bool = True
    #: Whether δ > 0 is supported.
    _supports_approx: bool = True

    def __sklearn_tags__(self):
        return estimator_tags(self, super().__sklearn_tags__())

    def __sklearn_is_fitted__(self) -> bool:
        return getattr(self, "_release", None) is not None

    # -- privacy state ---------------------------------------------------------------------------
    @property
    def private(self) -> bool:
        """False when an explicit (guessable) ``seed`` makes the releases reproducible, and so
        not private; True for the default ``seed=None`` (a fresh secret for every fit)."""
        return self.seed is None

    @property
    def accountant(self):
        """The ledger of the last fit (``accountant_``); None before ``fit``."""
        return getattr(self, "accountant_", None)

    @property
    def budget(self) -> PrivacyBudget | None:
        """The budget of the last fit (``budget_``), which refused any overrun; None before."""
        return getattr(self, "budget_", None)

    def _charge(self, event: Event) -> None:
        """Charge one release to this fit's budget, before the value it pays for is used."""
        self.budget_.charge(event)

    # -- validation -----------------------------------------------------------------------------
    def _check_common(self) -> None:
        check_seed(self.seed, self.reproducible, owner=type(self).__name__)
        if self.task not in self._tasks:
            raise ValueError(
                f"{type(self).__name__} supports task in {self._tasks}, got {self.task!r}"
            )
        _positive("epsilon", self.epsilon)
        _positive("data_radius", self.data_radius)
        _positive("model_radius", self.model_radius)
        d = self.delta
        if isinstance(d, bool) or not isinstance(d, int | float) or not (0 <= d < 1):
            raise ValueError(f"delta must be in [0, 1), got {d!r}")
        if d == 0 and not self._supports_pure:
            raise ValueError(f"{type(self).__name__} has no pure ε-DP (δ = 0) variant")
        if d > 0 and not self._supports_approx:
            raise ValueError(f"{type(self).__name__} is pure ε-DP only: use delta=0")

    @property
    def pure(self) -> bool:
        """True for the pure ε-DP (Laplace, δ = 0) variant."""
        return self.delta == 0

    # -- data ------------------------------------------------------------------------------------
    def _prepare(self, X, y) -> tuple[np.ndarray, np.ndarray]:
        Xc = prepare_features(X, self.data_radius)
        Y, classes = encode_labels(y, len(Xc), self.task, type(self).__name__)
        if len(Y) < 2:
            raise ValueError(f"pairwise learning needs at least 2 records, got n_samples={len(Y)}")
        self.classes_ = classes
        self.n_features_in_ = Xc.shape[1]
        self.n_samples_ = len(Y)
        return Xc, Y

    def _validated(self, X, y) -> tuple[np.ndarray, np.ndarray]:
        self._check_common()
        self._check_params()
        return self._prepare(X, y)

    def _make_noise(self) -> KeyedNoise:
        return KeyedNoise(self.seed, self.model_id)

    def _base_loss(self) -> PairwiseLoss:
        return get_loss(self.task, "logistic")

    def _regularized(self, alpha: float, center=None, center_radius=None) -> PairwiseLoss:
        base = self._base_loss()
        if alpha == 0 and center is None:
            return base
        return Regularized(base, alpha, center=center, center_radius=center_radius)

    def _constants(self, loss: PairwiseLoss) -> LossConstants:
        return loss.constants(float(self.data_radius), float(self.model_radius))

    # -- output perturbation ----------------------------------------------------------------
    def _new_budget(self) -> PrivacyBudget:
        if self.pure:
            return pure_budget(self.epsilon)
        return approx_budget(self.epsilon, self.delta)

    def _output_noise(
        self,
        stat: np.ndarray,
        sensitivity: float,
        noise: KeyedNoise,
        step: int = 0,
        sigma: float | None = None,
        epsilon: float | None = None,
    ) -> tuple[np.ndarray, ApproxDPEvent | LaplaceEvent | None]:
        """``stat + noise`` (not projected) and the ledger event that pays for it.

        ``sensitivity`` is the ℓ2 sensitivity of ``stat``. With δ > 0 the noise is Gaussian
        with ``sigma`` (default: the classic ``Δ√(2 ln(1.25/δ))/ε``, raised only where that is
        not (ε, δ)-DP) and the event an ``ApproxDPEvent`` carrying the (ε, δ) guarantee; with
        δ = 0 it is Laplace with ``b = √p·Δ/ε`` per coordinate (p = ``stat.size``) and the
        event a ``LaplaceEvent``. A zero sensitivity means a data-independent statistic: it is
        returned as is, with no event (it costs nothing).
        """
        eps = self.epsilon if epsilon is None else epsilon
        if sensitivity == 0:
            self.noise_scale_ = 0.0
            return stat, None
        if self.pure:
            b = laplace_scale_from_l2(sensitivity, eps, int(stat.size))
            event = LaplaceEvent(step=step, sensitivity=math.sqrt(stat.size) * sensitivity, scale=b)
            self.noise_scale_ = b
            return stat + noise.laplace(step, stat.shape, b, purpose="release"), event
        if sigma is None:
            sigma = gaussian_sigma_classic_safe(sensitivity, eps, self.delta)
        event = ApproxDPEvent(
            step=step, sensitivity=sensitivity, scale=sigma, epsilon=eps, delta=self.delta
        )
        self.noise_scale_ = sigma
        return stat + noise.gaussian(step, stat.shape, sigma, purpose="release"), event

    def _perturb_output(
        self,
        stat: np.ndarray,
        sensitivity: float,
        constraint: ConstraintSet,
        noise: KeyedNoise,
        step: int = 0,
        sigma: float | None = None,
    ) -> np.ndarray:
        """Release ``Π_C(stat + noise)`` (see :meth:`_output_noise`) and charge the ledger."""
        noisy, event = self._output_noise(stat, sensitivity, noise, step, sigma)
        if event is not None:
            self._charge(event)
        return constraint.project(noisy)

    # -- fitting ------------------------------------------------------------------------------
    @contextlib.contextmanager
    def _atomic(self):
        """Undo every attribute a failed fit set: a rejected fit leaves the model as it was."""
        before = dict(self.__dict__)
        try:
            yield
        except BaseException:
            self.__dict__.clear()
            self.__dict__.update(before)
            raise

    def fit(self, X, y):
        """Learn from ``(X, y)`` and release one private model (``private_weights``).

        Rows of X are clipped to ``‖x‖₂ ≤ data_radius``; ``y`` holds two classes (AUC) or any
        class labels (metric). Each fit draws a fresh noise secret (unless ``seed`` is set,
        with ``reproducible=True``) and starts a new ledger in ``accountant``.
        """
        with self._atomic():
            Xc, Y = self._validated(X, y)
            self.budget_ = self._new_budget()
            self.accountant_ = self.budget_.accountant
            self.accountant_.private = self.private
            self._release = self._fit_private(Xc, Y)
        return self

    def _noiseless_fit(self, X, y) -> np.ndarray:
        """The statistic the output mechanism perturbs, computed without noise (audits only)."""
        Xc, Y = self._validated(X, y)
        return self._statistic(Xc, Y, self._make_noise())[0]

    def _check_params(self) -> None:
        """Algorithm-specific validation (subclasses)."""

    def _fit_private(self, X: np.ndarray, Y: np.ndarray) -> np.ndarray:  # pragma: no cover
        raise NotImplementedError

    def _statistic(self, X: np.ndarray, Y: np.ndarray, noise: KeyedNoise):  # pragma: no cover
        raise NotImplementedError

    # -- what leaves the trust boundary --------------------------------------------------------
    @property
    def private_weights(self) -> np.ndarray | None:
        """The released model (a copy): ``w`` (AUC) or ``W`` (metric); None before ``fit``."""
        w = getattr(self, "_release", None)
        return None if w is None else w.copy()

    def _released(self) -> np.ndarray:
        w = getattr(self, "_release", None)
        if w is None:
            raise NotFittedError(
                f"This {type(self).__name__} instance is not fitted yet: call fit before using "
                "it to predict or transform"
            )
        return w

    def _inputs(self, X) -> np.ndarray:
        self._released()
        Xc = prepare_features(X, self.data_radius)
        if Xc.shape[1] != self.n_features_in_:
            raise ValueError(
                f"X has {Xc.shape[1]} features, but {type(self).__name__} is expecting "
                f"{self.n_features_in_} features as input"
            )
        return Xc

    @for_task("auc")
    def decision_function(self, X) -> np.ndarray:
        """AUC: the ranking scores ``w̃ᵀx`` of the (clipped) rows of X."""
        return self._inputs(X) @ self._released()

    @for_task("auc")
    def predict_proba(self, X) -> np.ndarray:
        """AUC: ``[1 − p, p]`` with ``p = expit(w̃ᵀx)`` — a monotone score, not calibrated."""
        p = special.expit(self.decision_function(X))
        return np.column_stack([1.0 - p, p])

    @for_task("auc")
    def predict(self, X) -> np.ndarray:
        """AUC: ``classes_[1]`` where the score is positive, else ``classes_[0]``.

        A ranking model has no intercept: the threshold 0 is not learned, so use the scores
        (``decision_function``, ``score``) to judge it, not the accuracy of ``predict``.
        """
        return np.where(self.decision_function(X) > 0, self.classes_[1], self.classes_[0])

    @for_task("metric")
    def transform(self, X) -> np.ndarray:
        """Metric: ``x ↦ W̃^{1/2}x``, so Euclidean distances are the learned metric's."""
        return self._inputs(X) @ psd_sqrt(self._released())

    @for_task("metric")
    def fit_transform(self, X, y=None, **fit_params) -> np.ndarray:
        """Metric: ``fit(X, y, ...)`` then ``transform(X)`` with the released metric."""
        return self.fit(X, y, **fit_params).transform(X)

    @for_task("metric")
    def distance(self, a, b) -> float:
        """Metric: the learned (private) distance ``√((a − b)ᵀW̃(a − b))``."""
        va, vb = self._inputs([a])[0], self._inputs([b])[0]
        diff = va - vb
        return float(math.sqrt(max(float(diff @ self._released() @ diff), 0.0)))

    def score(self, X, y) -> float:
        """How well the released model ranks ``(X, y)``: higher is better, 0.5 is chance.

        AUC task: the ROC AUC of ``decision_function(X)`` with ``classes_[1]`` positive.
        Metric task: the ROC AUC of the learned distances for "same class" over all pairs of
        rows, i.e. the probability that a random same-class pair is closer than a random
        different-class pair (:func:`stream_dp.metrics.pair_roc_auc`, O(n²)). NaN when y has
        one class only. Scores computed on private data are not private themselves.
        """
        Z = self.decision_function(X) if self.task == "auc" else self.transform(X)
        labels = label_array(y, len(Z), type(self).__name__)
        if self.task == "auc":
            unseen = ~np.isin(labels, self.classes_)
            if unseen.any():
                raise ValueError(
                    f"y holds labels not seen in fit: {labels[unseen][:3].tolist()}; "
                    f"the classes are {self.classes_.tolist()}"
                )
            return roc_auc(Z, labels == self.classes_[1])
        return pair_roc_auc(Z, labels)
