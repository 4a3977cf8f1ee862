"""Machinery shared by the offline private pairwise learners (SPEC §7).

Every offline learner takes a finite dataset, returns one private model and keeps a ledger of
what it released. This module holds what they share, so that no algorithm re-implements it:

* scikit-learn style parameters (``get_params``/``set_params`` from the ``__init__`` signature,
  as scikit-learn and river do, without importing either);
* data preparation: rows clipped to ``‖x‖₂ ≤ R`` with :func:`stream_dp.records.clip_norm`
  (part of every privacy proof), non-finite values rejected, labels mapped with
  :func:`stream_dp.records.auc_label` / :class:`stream_dp.records.LabelCodes`;
* the loss and constraint set of a task (shared :mod:`stream_dp.losses` and
  :mod:`stream_dp.constraints`), with the constants G, L, α derived once by the loss;
* output perturbation: classic Gaussian (``ApproxDPAccountant``) or Laplace
  (``PureDPAccountant``) noise drawn from :class:`stream_dp.privacy.KeyedNoise`, calibrated by
  :mod:`stream_dp.privacy.mechanisms`, then ``Π_C``;
* prediction from the **release only**: ``decision_function``/``predict_proba``/``predict``
  (AUC) and ``transform``/``distance`` (metric).

Neighbouring datasets differ in one record (replace-one), as everywhere in the project. Noise is
keyed by ``(seed, model_id)``: fitting the same data with the same seed reproduces the same
release bit for bit (which costs nothing more), and each ``fit`` starts a fresh ledger that
belongs to the model it releases.

"""

from __future__ import annotations

import inspect
import math

import numpy as np
from scipy import special

from stream_dp.constraints import ConstraintSet, L2Ball, PSDFrobeniusBall, PSDNuclearBall
from stream_dp.linalg import psd_sqrt
from stream_dp.losses import LossConstants, PairwiseLoss, Regularized, get_loss
from stream_dp.privacy.accountant import ApproxDPAccountant, PureDPAccountant
from stream_dp.privacy.events import ApproxDPEvent, LaplaceEvent
from stream_dp.privacy.mechanisms import gaussian_sigma_classic_safe, laplace_scale_from_l2
from stream_dp.privacy.noise import KeyedNoise
from stream_dp.records import InvalidRecord, LabelCodes, auc_label, clip_norm

__all__ = ["OfflinePairwiseBase", "prepare_features", "make_constraint"]

TASKS = ("auc", "metric")


def prepare_features(X, data_radius: float) -> np.ndarray:
    """A float matrix with every row clipped to ``‖x‖₂ ≤ R`` (non-finite input rejected).

    Examples
    --------
    >>> prepare_features([[3.0, 4.0], [0.1, 0.0]], 1.0)
    array([[0.6, 0.8],
           [0.1, 0. ]])

    """
    try:
        with np.errstate(over="ignore", invalid="ignore"):  # values too large for a double: inf
            arr = np.asarray(X, dtype=float)
    except (TypeError, ValueError, OverflowError):  # not numbers, ragged rows, ...
        raise InvalidRecord("wrong_type", "X must be a 2-D array of real numbers") from None
    if arr.ndim != 2 or arr.shape[1] == 0:
        raise InvalidRecord("wrong_type", f"X must be a 2-D array (n, d), got shape {arr.shape}")
    if not np.isfinite(arr).all():
        raise InvalidRecord("non_finite", "features must be finite (no NaN or inf)")
    return np.array([clip_norm(row, float(data_radius)) for row in arr]).reshape(arr.shape)


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


class OfflinePairwiseBase:
    """Base class of the offline learners (not an algorithm by itself).

    Subclasses implement ``_fit_private(X, Y)`` returning the released model, using the helpers
    below, and ``_noiseless_fit(X, y)`` (the statistic the mechanism perturbs, for audits).
    """

    #: Tasks the algorithm supports.
    _tasks: tuple[str, ...] = TASKS
    #: Whether δ = 0 (pure ε-DP with Laplace noise) is supported.
    _supports_pure: bool = True
    #: Whether δ > 0 is supported.
    _supports_approx: bool = True
    #: Filled by ``fit``.
    accountant = None

    # -- scikit-learn style parameters ---------------------------------------------------------
    @classmethod
    def _get_param_names(cls) -> list[str]:
        sig = inspect.signature(cls.__init__)
        return sorted(
            p.name
            for p in sig.parameters.values()
            if p.name != "self" and p.kind not in (p.VAR_POSITIONAL, p.VAR_KEYWORD)
        )

    def get_params(self, deep: bool = True) -> dict:
        """The constructor parameters (scikit-learn convention; ``deep`` has no nested effect)."""
        return {name: getattr(self, name) for name in self._get_param_names()}

    def set_params(self, **params):
        """Set constructor parameters; unknown names raise ``ValueError``. Returns self."""
        valid = set(self._get_param_names())
        for k, v in params.items():
            if k not in valid:
                raise ValueError(f"invalid parameter {k!r} for {type(self).__name__}")
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

    # -- validation -----------------------------------------------------------------------------
    def _check_common(self) -> None:
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
        y = np.asarray(y)
        if y.ndim != 1 or len(y) != len(Xc):
            raise ValueError(f"y must be 1-D with {len(Xc)} labels, got shape {y.shape}")
        if len(y) < 2:
            raise ValueError("pairwise learning needs at least 2 records")
        if self.task == "auc":
            Y = np.array([auc_label(v.item() if isinstance(v, np.generic) else v) for v in y])
            label_of = {}
            for v, code in zip(y, Y, strict=True):
                label_of.setdefault(code, v.item() if isinstance(v, np.generic) else v)
            self.classes_ = np.array([label_of.get(-1.0, False), label_of.get(1.0, True)])
        else:
            codes = LabelCodes()
            Y = np.array([codes.encode(v.item() if isinstance(v, np.generic) else v) for v in y])
            self.classes_ = np.array(list(codes.codes))
        self.n_features_in_ = Xc.shape[1]
        self.n_samples_ = len(Y)
        return Xc, Y

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
    def _new_accountant(self):
        if self.pure:
            return PureDPAccountant(self.epsilon)
        return ApproxDPAccountant(self.epsilon, self.delta)

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
            return stat + noise.laplace(step, stat.shape, b), event
        if sigma is None:
            sigma = gaussian_sigma_classic_safe(sensitivity, eps, self.delta)
        event = ApproxDPEvent(
            step=step, sensitivity=sensitivity, scale=sigma, epsilon=eps, delta=self.delta
        )
        self.noise_scale_ = sigma
        return stat + noise.gaussian(step, stat.shape, sigma), event

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
            self.accountant.charge(event)
        return constraint.project(noisy)

    # -- fitting ------------------------------------------------------------------------------
    def fit(self, X, y):
        """Learn from ``(X, y)`` and release one private model (``private_weights``).

        Rows of X are clipped to ``‖x‖₂ ≤ data_radius``; ``y`` holds ±1/0-1/bool labels
        (AUC) or any class labels (metric). Each fit starts a new ledger in ``accountant``.
        """
        self._check_common()
        self._check_params()
        Xc, Y = self._prepare(X, y)
        self.accountant = self._new_accountant()
        self._release = self._fit_private(Xc, Y)
        return self

    def _noiseless_fit(self, X, y) -> np.ndarray:
        """The statistic the output mechanism perturbs, computed without noise (audits only)."""
        self._check_common()
        self._check_params()
        Xc, Y = self._prepare(X, y)
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
            raise RuntimeError(f"{type(self).__name__} is not fitted yet: call fit(X, y)")
        return w

    def _inputs(self, X) -> np.ndarray:
        Xc = prepare_features(X, self.data_radius)
        if Xc.shape[1] != self._released().shape[-1]:
            raise ValueError(f"expected {self._released().shape[-1]} features, got {Xc.shape[1]}")
        return Xc

    def decision_function(self, X) -> np.ndarray:
        """AUC: the ranking scores ``w̃ᵀx`` of the (clipped) rows of X."""
        self._require_task("auc", "decision_function")
        return self._inputs(X) @ self._released()

    def predict_proba(self, X) -> np.ndarray:
        """AUC: ``[1 − p, p]`` with ``p = expit(w̃ᵀx)`` — a monotone score, not calibrated."""
        p = special.expit(self.decision_function(X))
        return np.column_stack([1.0 - p, p])

    def predict(self, X) -> np.ndarray:
        """AUC: ``classes_[1]`` where the score is positive, else ``classes_[0]``."""
        return np.where(self.decision_function(X) > 0, self.classes_[1], self.classes_[0])

    def transform(self, X) -> np.ndarray:
        """Metric: ``x ↦ W̃^{1/2}x``, so Euclidean distances are the learned metric's."""
        self._require_task("metric", "transform")
        return self._inputs(X) @ psd_sqrt(self._released())

    def distance(self, a, b) -> float:
        """Metric: the learned (private) distance ``√((a − b)ᵀW̃(a − b))``."""
        self._require_task("metric", "distance")
        va, vb = self._inputs([a])[0], self._inputs([b])[0]
        diff = va - vb
        return float(math.sqrt(max(float(diff @ self._released() @ diff), 0.0)))

    def _require_task(self, task: str, what: str) -> None:
        if self.task != task:
            raise AttributeError(f"{what} is for task={task!r}; this model has task={self.task!r}")


def _same(a, b) -> bool:
    try:
        return bool(a == b) and type(a) is type(b)
    except Exception:  # arrays and other non-scalar parameters
        return a is b
