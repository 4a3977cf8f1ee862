"""Pairwise losses, vectorised over a whole buffer, and their constants (SPEC §2).

Every loss works on *pair differences*: for a new record ``(x, y)`` and buffer rows
``(X[k], Y[k])``, ``D[k] = x − X[k]`` and a per-pair label coefficient ``c[k]``. One call handles
the whole buffer: no Python loop over partners.

The constants G (Lipschitz in w), L (smoothness) and α (strong convexity) hold for data clipped
to ``‖x‖₂ ≤ R`` (so ``‖D[k]‖ ≤ 2R``) and are derived here and nowhere else:

=================  ====================================  ==============  ==========
loss               ℓ(w; z, z')                           G               L
=================  ====================================  ==============  ==========
LogisticAUC        φ((y − y')·wᵀ(x − x'))                ``4R``          ``4R²``
LogisticMetric     φ(Y·(1 − (x−x')ᵀW(x−x')))              ``4R²``         ``4R⁴``
HingeAUC           (1 − s·wᵀ(x − x'))₊, s = (y−y')/2      ``2R``          non-smooth
HingeMetric        (1 + τ·(x−x')ᵀW(x−x'))₊                ``4R²``         non-smooth
=================  ====================================  ==============  ==========

with ``φ(u) = log(1 + e^{−u})``, ``|φ'| < 1``, ``φ'' ≤ 1/4``; ``Y = τ = +1`` for a same-class
pair and ``−1`` otherwise. :class:`Regularized` adds ``(α/2)‖w − w₀‖²`` and updates the constants
(``G ← G + α·r``, ``L ← L + α``, strong convexity α), where r bounds ``‖w − w₀‖`` over C.

"""

from __future__ import annotations

import dataclasses
import math

import numpy as np
from scipy import special

__all__ = [
    "LossConstants",
    "PairwiseLoss",
    "LogisticAUCLoss",
    "LogisticMetricLoss",
    "HingeAUCLoss",
    "HingeMetricLoss",
    "Regularized",
    "ContrastiveLoss",
    "get_loss",
]


@dataclasses.dataclass(frozen=True)
class LossConstants:
    """G (Lipschitz constant in w), L (smoothness; ``inf`` if non-smooth), α (strong convexity)."""

    lipschitz: float
    smoothness: float
    strong_convexity: float = 0.0


def _phi(u: np.ndarray) -> np.ndarray:
    # log(1 + e^{-u}) without overflow.
    return np.logaddexp(0.0, -u)


def _dphi(u: np.ndarray) -> np.ndarray:
    # φ'(u) = −1 / (1 + e^{u}) = −σ(−u).
    return -special.expit(-u)


class PairwiseLoss:
    """Base class. Subclasses implement ``_values`` and ``_grad_sum`` on pair differences."""

    task: str = ""
    smooth: bool = True

    def param_shape(self, dim: int) -> tuple[int, ...]:
        return (dim,) if self.task == "auc" else (dim, dim)

    def pair_coefficients(self, y: float, Y: np.ndarray) -> np.ndarray:
        """AUC: ``y − y'`` in {−2, 0, 2} (labels are ±1). Metric: +1 same class, −1 otherwise."""
        if self.task == "auc":
            return y - Y
        return np.where(Y == y, 1.0, -1.0)

    def constants(self, data_radius: float, model_radius: float) -> LossConstants:
        raise NotImplementedError

    # --- on explicit pair differences -------------------------------------------------------
    def _values(self, w: np.ndarray, D: np.ndarray, c: np.ndarray) -> np.ndarray:
        raise NotImplementedError

    def _grad_sum(
        self, w: np.ndarray, D: np.ndarray, c: np.ndarray, weights: np.ndarray | None = None
    ) -> np.ndarray:
        raise NotImplementedError

    def pair_values(self, w: np.ndarray, D: np.ndarray, c: np.ndarray) -> np.ndarray:
        """Per-pair losses for differences ``D`` (n × d) and coefficients ``c`` (n,)."""
        return self._values(w, D, c)

    def pair_gradient_sum(
        self, w: np.ndarray, D: np.ndarray, c: np.ndarray, weights: np.ndarray | None = None
    ) -> np.ndarray:
        """Σ_k weights[k]·∇_w ℓ_k over the pairs (one matrix product, no per-pair loop)."""
        return self._grad_sum(w, D, c, weights)

    # --- against a buffer -------------------------------------------------------------------
    def value(self, w: np.ndarray, x: np.ndarray, y: float, X: np.ndarray, Y: np.ndarray) -> float:
        """``L̂(w) = (1/|B|) Σ_k ℓ(w; (x, y), (X[k], Y[k]))``; 0 for an empty buffer."""
        n = len(Y)
        if n == 0:
            return 0.0
        return float(self._values(w, x - X, self.pair_coefficients(y, Y)).sum() / n)

    def gradient(
        self, w: np.ndarray, x: np.ndarray, y: float, X: np.ndarray, Y: np.ndarray
    ) -> np.ndarray:
        """``∇L̂(w)``, the buffer-averaged gradient (zeros for an empty buffer)."""
        n = len(Y)
        if n == 0:
            return np.zeros_like(w)
        return self._grad_sum(w, x - X, self.pair_coefficients(y, Y)) / n


class LogisticAUCLoss(PairwiseLoss):
    """Huai et al. (2020) Example 2: ``φ((y − y')·wᵀ(x − x'))``, labels in {−1, +1}.

    Examples
    --------
    >>> import numpy as np
    >>> loss = LogisticAUCLoss()
    >>> w = np.array([1.0, 0.0])
    >>> X, Y = np.array([[0.0, 1.0], [1.0, 0.0]]), np.array([-1.0, 1.0])
    >>> round(loss.value(w, np.array([1.0, 0.0]), 1.0, X, Y), 4)  # a tie costs φ(0) = log 2
    0.41
    >>> loss.constants(data_radius=1.0, model_radius=1.0)
    LossConstants(lipschitz=4.0, smoothness=4.0, strong_convexity=0.0)

    """

    task = "auc"

    def constants(self, data_radius: float, model_radius: float) -> LossConstants:
        return LossConstants(4.0 * data_radius, 4.0 * data_radius**2)

    def _values(self, w, D, c):
        out = np.full(len(c), math.log(2.0))  # φ(0) for tied labels; kept for the value only
        m = c != 0
        out[m] = _phi(c[m] * (D[m] @ w))
        return out

    def _grad_sum(self, w, D, c, weights=None):
        m = c != 0  # tied pairs have zero gradient: skip them cheaply
        if not m.any():
            return np.zeros_like(w)
        Dm, cm = D[m], c[m]
        coef = _dphi(cm * (Dm @ w)) * cm
        if weights is not None:
            coef = coef * weights[m]
        return coef @ Dm


class LogisticMetricLoss(PairwiseLoss):
    """Huai et al. (2020) Example 1: ``φ(Y·(1 − (x−x')ᵀW(x−x')))``, W symmetric PSD.

    Examples
    --------
    >>> import numpy as np
    >>> loss = LogisticMetricLoss()
    >>> W = np.eye(2) * 0.5
    >>> g = loss.gradient(W, np.array([1.0, 0.0]), "a", np.array([[0.0, 0.0]]), np.array(["b"]))
    >>> g.shape
    (2, 2)

    """

    task = "metric"

    def constants(self, data_radius: float, model_radius: float) -> LossConstants:
        return LossConstants(4.0 * data_radius**2, 4.0 * data_radius**4)

    @staticmethod
    def _quad(W, D):
        return np.einsum("ij,ij->i", D @ W, D)

    def _values(self, w, D, c):
        return _phi(c * (1.0 - self._quad(w, D)))

    def _grad_sum(self, w, D, c, weights=None):
        # ∇_W φ(c(1 − δᵀWδ)) = −φ'(u)·c·δδᵀ; summed: −Dᵀ diag(φ'(u)·c) D.
        coef = _dphi(c * (1.0 - self._quad(w, D))) * c
        if weights is not None:
            coef = coef * weights
        return -(D.T * coef) @ D


class HingeAUCLoss(PairwiseLoss):
    """Yang et al. (2021): ``(1 − wᵀ(x − x'))₊·1[y = +1, y' = −1]``, taken over both orders.

    A pair (z, z') with ``s = (y − y')/2 ≠ 0`` contributes ``(1 − s·wᵀ(x − x'))₊``; tied pairs
    contribute nothing.
    """

    task = "auc"
    smooth = False

    def constants(self, data_radius: float, model_radius: float) -> LossConstants:
        return LossConstants(2.0 * data_radius, math.inf)

    def _values(self, w, D, c):
        s = c / 2.0
        return np.where(s != 0, np.maximum(0.0, 1.0 - s * (D @ w)), 0.0)

    def _grad_sum(self, w, D, c, weights=None):
        s = c / 2.0
        coef = s * ((s != 0) & (1.0 - s * (D @ w) > 0))
        if weights is not None:
            coef = coef * weights
        return -coef @ D


class HingeMetricLoss(PairwiseLoss):
    """Yang et al. (2021): ``(1 + τ·(x−x')ᵀW(x−x'))₊``, τ = +1 same class, −1 otherwise."""

    task = "metric"
    smooth = False

    def constants(self, data_radius: float, model_radius: float) -> LossConstants:
        return LossConstants(4.0 * data_radius**2, math.inf)

    def _values(self, w, D, c):
        return np.maximum(0.0, 1.0 + c * LogisticMetricLoss._quad(w, D))

    def _grad_sum(self, w, D, c, weights=None):
        coef = c * ((1.0 + c * LogisticMetricLoss._quad(w, D)) > 0)
        if weights is not None:
            coef = coef * weights
        return (D.T * coef) @ D


class Regularized(PairwiseLoss):
    """``ℓ(w) + (α/2)‖w − w₀‖²`` (``w₀ = 0`` when ``center`` is None).

    Used by OnPairStrC/OffPairStrC (``center=None``: G grows by ``α·D``) and by OnPairC/OffPairC
    (``center=w₀ ∈ C``: G grows by ``α·diam(C)``), as SPEC §2 and Huai et al. Alg. 2.

    Parameters
    ----------
    base
        The unregularised pairwise loss.
    alpha
        Regularisation strength; becomes the strong-convexity constant.
    center
        ``w₀``; ``None`` for the origin.
    center_radius
        A bound on ``‖w − w₀‖`` over C. Defaults to ``model_radius`` (for ``w₀ = 0``); pass the
        set's diameter when ``w₀`` is an arbitrary point of C.

    """

    def __init__(
        self,
        base: PairwiseLoss,
        alpha: float,
        center: np.ndarray | None = None,
        center_radius: float | None = None,
    ) -> None:
        if not alpha >= 0:
            raise ValueError(f"alpha must be >= 0, got {alpha!r}")
        self.base = base
        self.alpha = float(alpha)
        self.center = None if center is None else np.asarray(center, dtype=float)
        self.center_radius = center_radius
        self.task = base.task
        self.smooth = base.smooth

    def constants(self, data_radius: float, model_radius: float) -> LossConstants:
        c = self.base.constants(data_radius, model_radius)
        r = model_radius if self.center_radius is None else self.center_radius
        return LossConstants(
            c.lipschitz + self.alpha * r,
            c.smoothness + self.alpha,
            c.strong_convexity + self.alpha,
        )

    def _shift(self, w):
        return w if self.center is None else w - self.center

    def _values(self, w, D, c):
        return self.base._values(w, D, c) + 0.5 * self.alpha * float(np.sum(self._shift(w) ** 2))

    def _grad_sum(self, w, D, c, weights=None):
        total = len(c) if weights is None else float(np.sum(weights))
        return self.base._grad_sum(w, D, c, weights) + total * self.alpha * self._shift(w)

    def value(self, w, x, y, X, Y) -> float:
        reg = 0.5 * self.alpha * float(np.sum(self._shift(w) ** 2))
        return self.base.value(w, x, y, X, Y) + reg

    def gradient(self, w, x, y, X, Y) -> np.ndarray:
        return self.base.gradient(w, x, y, X, Y) + self.alpha * self._shift(w)


class ContrastiveLoss:
    """Li et al. (2020) contrastive loss on labelled pairs, ``W ∈ R^{d'×d}``.

    ``ℓ = ½(1 − y)·D_W² + ½·y·max(0, m − D_W)²`` with ``D_W = ‖W Δx‖`` and ``y = 0`` for a
    similar pair, ``1`` for a dissimilar one. Its gradient is not globally Lipschitz: DPP-DML
    bounds sensitivity by clipping each row of each per-pair gradient to norm ``h``.
    """

    task = "metric"

    def __init__(self, margin: float = 1.0) -> None:
        self.margin = float(margin)

    def pair_values(self, W: np.ndarray, D: np.ndarray, y: np.ndarray) -> np.ndarray:
        dist = np.linalg.norm(D @ W.T, axis=1)
        return 0.5 * (1 - y) * dist**2 + 0.5 * y * np.maximum(0.0, self.margin - dist) ** 2

    def per_pair_gradients(self, W: np.ndarray, D: np.ndarray, y: np.ndarray) -> np.ndarray:
        """Gradients for each pair, shape ``(n, d', d)``."""
        P = D @ W.T  # (n, d') = W Δx
        dist = np.linalg.norm(P, axis=1)
        safe = np.where(dist > 0, dist, 1.0)
        # similar: ∂(½‖WΔ‖²)/∂W = WΔΔᵀ; dissimilar inside the margin: −(m − D)/D · WΔΔᵀ.
        coef = (1 - y) - y * np.where(dist < self.margin, (self.margin - dist) / safe, 0.0)
        coef = np.where((dist == 0) & (y == 1), 0.0, coef)
        return coef[:, None, None] * P[:, :, None] * D[:, None, :]

    @staticmethod
    def clip_rows(grads: np.ndarray, h: float) -> np.ndarray:
        """Clip every row of every per-pair gradient to ℓ2 norm ``h`` (Li et al. Alg. 1)."""
        norms = np.linalg.norm(grads, axis=2, keepdims=True)
        return grads * np.minimum(1.0, h / np.maximum(norms, 1e-300))


_LOSSES = {
    ("auc", "logistic"): LogisticAUCLoss,
    ("metric", "logistic"): LogisticMetricLoss,
    ("auc", "hinge"): HingeAUCLoss,
    ("metric", "hinge"): HingeMetricLoss,
}


def get_loss(task: str, name: str = "logistic") -> PairwiseLoss:
    """The loss for a task (``"auc"`` or ``"metric"``) by name (``"logistic"`` or ``"hinge"``)."""
    try:
        return _LOSSES[(task, name)]()
    except KeyError:
        raise ValueError(
            f"no {name!r} loss for task {task!r}; choose from {sorted(_LOSSES)}"
        ) from None
