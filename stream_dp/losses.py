"""Pairwise losses, vectorised over a whole buffer, and their constants.

Every loss works on *pair differences*: for a new record ``(x, y)`` and buffer rows
``(X[k], Y[k])``, ``D[k] = x − X[k]`` and a per-pair label coefficient ``c[k]``. One call handles
the whole buffer: no Python loop over partners. The classes serve the offline algorithms and the
online learners' reference step; :func:`buffer_terms` is the same logistic losses as one compiled
pass over a buffer, for the online fast path (``docs/design.md``, *Reference step and fast
path*), held equal to the classes by ``tests/test_fast_paths.py``. One concept — the pairwise losses
of the papers, in the two forms the learners need — hence one module of ~600 lines.

The constants G (Lipschitz in w), L (smoothness) and α (strong convexity) hold for data clipped
to ``‖x‖₂ ≤ R`` (so ``‖D[k]‖ ≤ 2R``) and are derived here and nowhere else:

=================  ====================================  ==============  ==========
loss               ℓ(w; z, z')                           G               L
=================  ====================================  ==============  ==========
LogisticAUC        φ((y − y')·wᵀ(x − x'))                ``4R``          ``4R²``
LogisticMetric     φ(Y·(1 − (x−x')ᵀW(x−x')))              ``4R²``         ``4R⁴``
DiagonalMetric     φ(Y·(1 − Σ_k w_k (x_k − x'_k)²))        ``4R²``         ``4R⁴``
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

from stream_dp._jit import NUMBA_INSTALLED, compiled_body, jitable, njit
from stream_dp.linalg import row_dots

__all__ = [
    "buffer_terms",
    "dphi",
    "phi",
    "LossConstants",
    "PairwiseLoss",
    "LogisticAUCLoss",
    "LogisticMetricLoss",
    "DiagonalMetricLoss",
    "HingeAUCLoss",
    "HingeMetricLoss",
    "Regularized",
    "ContrastiveLoss",
    "get_loss",
    "METRICS",
]


@dataclasses.dataclass(frozen=True)
class LossConstants:
    """G (Lipschitz constant in w), L (smoothness; ``inf`` if non-smooth), α (strong convexity)."""

    lipschitz: float
    smoothness: float
    strong_convexity: float = 0.0


def phi(u: np.ndarray) -> np.ndarray:
    """The logistic loss ``φ(u) = log(1 + e^{−u})``, without overflow.

    Examples
    --------
    >>> float(phi(np.array(0.0))) == math.log(2.0)
    True

    """
    return np.logaddexp(0.0, -u)


def dphi(u: np.ndarray) -> np.ndarray:
    """``φ'(u) = −1 / (1 + e^{u}) = −σ(−u)``, in (−1, 0).

    Examples
    --------
    >>> float(dphi(np.array(0.0)))
    -0.5

    """
    return -special.expit(-u)


# numba has neither logaddexp nor expit: the same functions, written with exp and log1p.
@compiled_body(phi)
def _phi_compiled(u):
    def impl(u):  # log(1 + e^{−u}) = max(−u, 0) + log1p(e^{−|u|})
        return np.maximum(-u, 0.0) + np.log1p(np.exp(-np.abs(u)))

    return impl


@compiled_body(dphi)
def _dphi_compiled(u):
    def impl(u):  # exp overflows to inf harmlessly: −1/(1 + inf) = −0
        return -1.0 / (1.0 + np.exp(u))

    return impl


class PairwiseLoss:
    """Base class.

    A concrete loss is ``ℓ = f(u, c)`` of one pair statistic ``u`` (``wᵀδ`` for AUC, ``δᵀWδ`` for
    metric learning, with ``δ = x − x'``) and the pair coefficient ``c``; its gradient is
    ``coef(u, c)·φ(δ)`` with the feature ``φ(δ) = δ`` (AUC) or ``δδᵀ`` (metric). Subclasses give
    ``_pair_loss`` and ``_coef`` once; the buffer path (``_values``/``_grad_sum``) and the
    all-pairs path (``all_pairs_value``/``all_pairs_gradient``) are both built from them, so each
    derivative formula exists exactly once.
    """

    task: str = ""
    smooth: bool = True
    #: Pairs with c == 0 have zero gradient and are skipped in ``_grad_sum`` (AUC ties).
    _skip_zero_coefficients: bool = False

    def param_shape(self, dim: int) -> tuple[int, ...]:
        return (dim,) if self.task == "auc" else (dim, dim)

    def pair_coefficients(self, y: float, Y: np.ndarray) -> np.ndarray:
        """AUC: ``y − y'`` in {−2, 0, 2} (labels are ±1). Metric: +1 same class, −1 otherwise.

        ``y`` may be an array broadcasting against ``Y`` (the all-pairs path passes a column).
        """
        if self.task == "auc":
            return y - Y
        return np.where(Y == y, 1.0, -1.0)

    def constants(self, data_radius: float, model_radius: float) -> LossConstants:
        raise NotImplementedError

    # --- the loss as a function of the pair statistic (subclasses) -------------------------
    def _pair_loss(self, u: np.ndarray, c: np.ndarray) -> np.ndarray:
        raise NotImplementedError

    def _coef(self, u: np.ndarray, c: np.ndarray) -> np.ndarray:
        """``∂ℓ/∂(feature)``: the gradient of one pair is ``_coef(u, c)·φ(δ)``."""
        raise NotImplementedError

    # --- the pair statistic and the feature (AUC: linear; metric: quadratic) ---------------
    def _stat(self, w: np.ndarray, D: np.ndarray) -> np.ndarray:
        if self.task == "auc":
            return D @ w
        return np.einsum("ij,ij->i", D @ w, D)

    def _feature_sum(self, D: np.ndarray, coef: np.ndarray) -> np.ndarray:
        if self.task == "auc":
            return coef @ D
        return (D.T * coef) @ D

    # --- on explicit pair differences -------------------------------------------------------
    def _values(self, w: np.ndarray, D: np.ndarray, c: np.ndarray) -> np.ndarray:
        return self._pair_loss(self._stat(w, D), c)

    def _grad_sum(
        self, w: np.ndarray, D: np.ndarray, c: np.ndarray, weights: np.ndarray | None = None
    ) -> np.ndarray:
        if self._skip_zero_coefficients:
            m = c != 0  # tied pairs have zero gradient: skip them cheaply
            if not m.any():
                return np.zeros_like(w)
            if not m.all():
                D, c = D[m], c[m]
                weights = None if weights is None else weights[m]
        coef = self._coef(self._stat(w, D), c)
        if weights is not None:
            coef = coef * weights
        return self._feature_sum(D, coef)

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

    # --- over all ordered pairs of a dataset (offline algorithms) --------------------------
    def _all_pairs_blocks(self, w: np.ndarray, X: np.ndarray, Y: np.ndarray, block: int):
        """Yield ``(rows, U, C)``: the statistics and coefficients of pairs (i ∈ rows, j), i ≠ j.

        The statistic comes from the Gram structure, never from an n² × d array of
        differences: ``U_ij = s_i − s_j`` with ``s = Xw`` (AUC) or ``K_ii + K_jj − 2K_ij`` with
        ``K = XWXᵀ`` (metric). The diagonal (i = j) gets coefficient c = 0 and is masked out.
        """
        n = len(Y)
        if self.task == "auc":
            s = X @ w
        else:
            # U = K_ii + K_jj − 2K_ij as one product: [XW, k, 1]·[−2X, 1, k]ᵀ.
            XW = X @ w
            k_diag = np.einsum("ij,ij->i", XW, X)[:, None]
            ones = np.ones((n, 1))
            left = np.hstack([XW, k_diag, ones])
            right_t = np.hstack([-2.0 * X, ones, k_diag]).T
        for start in range(0, n, block):
            rows = np.arange(start, min(start + block, n))
            if self.task == "auc":
                U = s[rows, None] - s[None, :]
            else:
                U = left[rows] @ right_t
            c = np.asarray(self.pair_coefficients(Y[rows, None], Y[None, :]), dtype=float)
            yield rows, U, c

    def all_pairs_value(
        self, w: np.ndarray, X: np.ndarray, Y: np.ndarray, block: int = 1024
    ) -> float:
        """The empirical pairwise risk ``L(w; D) = 1/(n(n−1)) Σ_{i≠j} ℓ(w; z_i, z_j)``.

        Xue et al. (IJCAI 2021) eq. (1), Huai et al. (AAAI 2020) eq. (1). Vectorised over all
        pairs in row blocks of ``block`` (memory O(block·n)). 0 when n < 2.

        Examples
        --------
        >>> import numpy as np
        >>> X, Y = np.array([[1.0, 0.0], [0.0, 1.0]]), np.array([1.0, -1.0])
        >>> round(LogisticAUCLoss().all_pairs_value(np.array([1.0, -1.0]), X, Y), 5)
        0.01815

        """
        n = len(Y)
        if n < 2:
            return 0.0
        total = 0.0
        for rows, U, c in self._all_pairs_blocks(w, X, Y, block):
            V = self._pair_loss(U, c)
            V[np.arange(len(rows)), rows] = 0.0
            total += float(V.sum())
        return total / (n * (n - 1))

    def all_pairs_gradient(
        self, w: np.ndarray, X: np.ndarray, Y: np.ndarray, block: int = 1024
    ) -> np.ndarray:
        """``∇L(w; D)`` over all ordered pairs i ≠ j (Xue et al. Alg. 1–4, Kang et al. Alg. 1).

        With the per-pair coefficients ``C_ij = coef(u_ij, c_ij)`` the sum of features is
        ``Σ_ij C_ij (x_i − x_j) = (C1 − Cᵀ1)ᵀX`` (AUC) and
        ``Σ_ij C_ij δ_ij δ_ijᵀ = Xᵀ diag(C1 + Cᵀ1) X − XᵀCᵀX − XᵀCX`` (metric): O(n²) scalar
        work plus O(n d²), the same result as summing ``pair_gradient_sum`` over every row.

        Examples
        --------
        >>> import numpy as np
        >>> X, Y = np.array([[1.0, 0.0], [0.0, 1.0]]), np.array([1.0, -1.0])
        >>> LogisticAUCLoss().all_pairs_gradient(np.zeros(2), X, Y)
        array([-1.,  1.])

        """
        n = len(Y)
        if n < 2:
            return np.zeros_like(w)
        d = X.shape[1]
        r = np.zeros(n)  # Σ_j C_ij
        s = np.zeros(n)  # Σ_i C_ij
        cross = np.zeros((d, d)) if self.task != "auc" else None
        for rows, U, c in self._all_pairs_blocks(w, X, Y, block):
            C = self._coef(U, c)
            C[np.arange(len(rows)), rows] = 0.0
            r[rows] += C.sum(axis=1)
            s += C.sum(axis=0)
            if cross is not None:
                cross += X[rows].T @ (C @ X)
        if self.task == "auc":
            g = (r - s) @ X
        else:
            g = (X.T * (r + s)) @ X - cross - cross.T
        return g / (n * (n - 1))


class LogisticAUCLoss(PairwiseLoss):
    """Huai et al. (2020) Example 2: ``φ((y − y')·wᵀ(x − x'))``, labels in {−1, +1}.

    With ``slope_cap`` κ ∈ (0, 1) the loss is the *capped* logistic ``ψ_κ``: ``φ(v)`` for
    ``v ≥ v₀ = ln(1/κ − 1)``, continued linearly below with slope −κ
    (``ψ_κ(v) = φ(v₀) − κ(v − v₀)``). It is convex, C¹, κ-Lipschitz and ¼-smooth — the logistic
    loss for well-ranked pairs, a hinge-like constant slope for misranked ones — so every pair
    term is at most ``2·2R·κ`` whatever the model radius (``docs/privacy.md``, *Capped
    logistic AUC loss*; :func:`stream_dp.privacy.influence.pair_term_bounds`).

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
    >>> capped = LogisticAUCLoss(slope_cap=0.5)  # ψ(v) = log 2 − v/2 for v < 0
    >>> float(capped._pair_loss(np.array(-2.0), 1.0)) == math.log(2.0) + 1.0
    True
    >>> capped.constants(data_radius=0.5, model_radius=100.0).lipschitz
    1.0

    """

    task = "auc"
    _skip_zero_coefficients = True

    def __init__(self, slope_cap: float | None = None) -> None:
        if slope_cap is not None and not (0.0 < slope_cap <= 1.0):
            raise ValueError(f"slope_cap must be None or in (0, 1], got {slope_cap!r}")
        self.slope_cap = None if slope_cap is None or slope_cap == 1.0 else float(slope_cap)

    @property
    def cap(self) -> float:
        """κ: the largest slope of the loss in its argument (1: the plain logistic loss)."""
        return 1.0 if self.slope_cap is None else self.slope_cap

    @property
    def knee(self) -> float:
        """``v₀ = ln(1/κ − 1)``: below it the capped loss is linear (−inf without a cap)."""
        return -math.inf if self.slope_cap is None else math.log(1.0 / self.slope_cap - 1.0)

    def constants(self, data_radius: float, model_radius: float) -> LossConstants:
        return LossConstants(4.0 * data_radius * self.cap, 4.0 * data_radius**2)

    def _pair_loss(self, u, c):
        # φ(c·u); a tied pair (c = 0) gives φ(0) = log 2, kept for the value only.
        v = c * u
        if self.slope_cap is None:
            return phi(v)
        v0 = self.knee
        return np.where(v >= v0, phi(np.maximum(v, v0)), phi(v0) - self.slope_cap * (v - v0))

    def _coef(self, u, c):
        if self.slope_cap is None:
            return dphi(c * u) * c  # zero for tied pairs
        return np.maximum(dphi(c * u), -self.slope_cap) * c


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

    def _pair_loss(self, u, c):
        return phi(c * (1.0 - u))

    def _coef(self, u, c):
        # ∇_W φ(c(1 − δᵀWδ)) = −φ'(c(1 − u))·c·δδᵀ.
        return -dphi(c * (1.0 - u)) * c


class DiagonalMetricLoss(LogisticMetricLoss):
    """The logistic metric loss of Huai et al. (2020) Example 1 for a diagonal ``W = diag(w)``.

    ``φ(Y·(1 − Σ_k w_k δ_k²))``: the pair statistic is ``wᵀ(δ∘δ)`` and the gradient of a pair
    ``coef·(δ∘δ)``, the diagonal of the full loss's ``coef·δδᵀ`` — d parameters instead of
    d², so the correlated noise moves d coordinates instead of d(d+1)/2. With ``‖x‖ ≤ R``,
    ``‖δ∘δ‖₂ ≤ ‖δ‖₂² ≤ 4R²``, so G and L are the full metric's (``docs/privacy.md``,
    *Diagonal metric*).

    Examples
    --------
    >>> import numpy as np
    >>> loss = DiagonalMetricLoss()
    >>> x, X, Y = np.array([1.0, 0.0]), np.array([[0.0, 0.5]]), np.array(["b"])
    >>> g = loss.gradient(np.array([0.5, 0.5]), x, "a", X, Y)
    >>> full = LogisticMetricLoss().gradient(np.eye(2) * 0.5, x, "a", X, Y)
    >>> bool(np.allclose(g, np.diag(full)))
    True

    """

    diagonal = True

    def param_shape(self, dim: int) -> tuple[int, ...]:
        return (dim,)

    def _stat(self, w, D):
        return (D * D) @ w

    def _feature_sum(self, D, coef):
        return coef @ (D * D)

    def _all_pairs_blocks(self, w, X, Y, block):
        # U_ij = K_ii + K_jj − 2K_ij with K = X diag(w) Xᵀ: the full loss's blocks at diag(w).
        yield from super()._all_pairs_blocks(np.diag(w), X, Y, block)

    def all_pairs_gradient(self, w, X, Y, block: int = 1024):
        """The diagonal of the full loss's all-pairs gradient at ``diag(w)``: O(n²) scalar
        work plus O(n·d) (the cross term ``Σ_ij C_ij x_ik x_jk`` is ``Σ_i x_ik (C X)_ik``)."""
        n = len(Y)
        if n < 2:
            return np.zeros_like(w)
        r, s = np.zeros(n), np.zeros(n)
        cross = np.zeros(X.shape[1])
        for rows, U, c in self._all_pairs_blocks(w, X, Y, block):
            C = self._coef(U, c)
            C[np.arange(len(rows)), rows] = 0.0
            r[rows] += C.sum(axis=1)
            s += C.sum(axis=0)
            cross += np.einsum("ik,ik->k", X[rows], C @ X)
        return ((r + s) @ (X * X) - 2.0 * cross) / (n * (n - 1))


class HingeAUCLoss(PairwiseLoss):
    """Yang et al. (2021): ``(1 − wᵀ(x − x'))₊·1[y = +1, y' = −1]``, taken over both orders.

    A pair (z, z') with ``s = (y − y')/2 ≠ 0`` contributes ``(1 − s·wᵀ(x − x'))₊``; tied pairs
    contribute nothing.
    """

    task = "auc"
    smooth = False

    def constants(self, data_radius: float, model_radius: float) -> LossConstants:
        return LossConstants(2.0 * data_radius, math.inf)

    def _pair_loss(self, u, c):
        s = c / 2.0
        return np.where(s != 0, np.maximum(0.0, 1.0 - s * u), 0.0)

    def _coef(self, u, c):
        s = c / 2.0
        return -s * ((s != 0) & (1.0 - s * u > 0))


class HingeMetricLoss(PairwiseLoss):
    """Yang et al. (2021): ``(1 + τ·(x−x')ᵀW(x−x'))₊``, τ = +1 same class, −1 otherwise."""

    task = "metric"
    smooth = False

    def constants(self, data_radius: float, model_radius: float) -> LossConstants:
        return LossConstants(4.0 * data_radius**2, math.inf)

    def _pair_loss(self, u, c):
        return np.maximum(0.0, 1.0 + c * u)

    def _coef(self, u, c):
        return c * ((1.0 + c * u) > 0)


class Regularized(PairwiseLoss):
    """``ℓ(w) + (α/2)‖w − w₀‖²`` (``w₀ = 0`` when ``center`` is None).

    Used by OnPairStrC/OffPairStrC (``center=None``: G grows by ``α·D``) and by OnPairC/OffPairC
    (``center=w₀ ∈ C``: G grows by ``α·diam(C)``), as in Huai et al. (2020) Alg. 1–2
    (``docs/algorithms.md``, *Conventions shared by all learners*).

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

    def param_shape(self, dim: int) -> tuple[int, ...]:
        return self.base.param_shape(dim)

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

    def all_pairs_value(self, w, X, Y, block: int = 1024) -> float:
        reg = 0.5 * self.alpha * float(np.sum(self._shift(w) ** 2))
        return self.base.all_pairs_value(w, X, Y, block) + reg

    def all_pairs_gradient(self, w, X, Y, block: int = 1024) -> np.ndarray:
        return self.base.all_pairs_gradient(w, X, Y, block) + self.alpha * self._shift(w)


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
    def clip_rows(grads: np.ndarray, h: float, norm: float = 2) -> np.ndarray:
        """Clip every row of every per-pair gradient to norm ``h`` (Li et al. Alg. 1 step 7).

        ``norm`` is the ℓp norm of the clip: 2 (default) or 1 — Li et al.'s Laplace mechanism
        needs ℓ1 sensitivity, which a per-row ℓ1 clip bounds directly.
        """
        norms = np.linalg.norm(grads, ord=norm, axis=2, keepdims=True)
        return grads * np.minimum(1.0, h / np.maximum(norms, 1e-300))


#: The metric parameterisations: a full PSD matrix W, or a diagonal ``W = diag(w)``, w ≥ 0.
METRICS = ("full", "diagonal")

_LOSSES = {
    ("auc", "logistic"): LogisticAUCLoss,
    ("metric", "logistic"): LogisticMetricLoss,
    ("auc", "hinge"): HingeAUCLoss,
    ("metric", "hinge"): HingeMetricLoss,
}


def get_loss(
    task: str, name: str = "logistic", metric: str = "full", **params: float
) -> PairwiseLoss:
    """The loss for a task (``"auc"`` or ``"metric"``) by name (``"logistic"`` or ``"hinge"``);
    ``metric="diagonal"`` the logistic metric loss of a diagonal W
    (:class:`DiagonalMetricLoss`); ``params`` go to its constructor (``slope_cap`` of the
    logistic AUC loss)."""
    if metric not in METRICS:
        raise ValueError(f"metric must be one of {METRICS}, got {metric!r}")
    if metric == "diagonal":
        if (task, name) != ("metric", "logistic"):
            raise ValueError(f"metric='diagonal' is the logistic metric loss, not {name!r}")
        return DiagonalMetricLoss(**params)
    try:
        kind = _LOSSES[(task, name)]
    except KeyError:
        raise ValueError(
            f"no {name!r} loss for task {task!r}; choose from {sorted(_LOSSES)}"
        ) from None
    return kind(**params)


# -- the logistic losses over a buffer, compiled (the online fast path) ------------------------
_LOG2 = math.log(2.0)


def _auc_terms(w, s, x, y, X, Y, n, want_val, want_grad, g, cap, knee):  # pragma: no cover
    """The (capped) logistic AUC loss of ``(x, y)`` against the first n rows, in one pass.

    Tied pairs (``y = Y[k]``) cost ``ψ(0)`` (``φ(0) = log 2`` unless the knee is above 0) and
    no gradient. The log of the product of the factors ``1 + e^{−|u|}`` ∈ (1, 2] replaces one
    log per pair (one per ~700 pairs). With
    ``cap`` < 1 (``knee = ln(1/cap − 1)``) the pairs below the knee cost
    ``φ(knee) − cap·(u − knee)`` and their slope is ``cap`` (:class:`LogisticAUCLoss`); ``cap``
    1 and ``knee`` −inf is the plain loss.
    """
    dim = x.shape[0]
    xw = 0.0
    xs = 0.0
    for i in range(dim):
        xw += x[i] * w[i]
        xs += x[i] * s[i]
    if want_grad:
        g[:] = 0.0
    value = 0.0  # Σ max(−u, 0)
    logs = 0.0
    prod = 1.0
    csum = 0.0
    ties = 0
    linear = 0.0  # Σ cap·(knee − u) over the pairs below the knee
    below = 0
    for k in range(n):
        c = y - Y[k]
        if c == 0.0:
            ties += 1
            continue
        a = 0.0
        b = 0.0
        for i in range(dim):
            a += X[k, i] * s[i]
            b += X[k, i] * w[i]
        if want_val:
            u = c * (xs - a)
            if u < knee:
                linear += cap * (knee - u)
                below += 1
            else:
                if u < 0.0:
                    value -= u
                prod *= 1.0 + math.exp(-abs(u))
                if prod > 1e200:
                    logs += math.log(prod)
                    prod = 1.0
        if want_grad:
            slope = 1.0 / (1.0 + math.exp(c * (xw - b)))
            if slope > cap:
                slope = cap
            coef = -c * slope
            csum += coef
            for i in range(dim):
                g[i] -= coef * X[k, i]
    if want_grad:
        for i in range(dim):
            g[i] += csum * x[i]
    if not want_val:
        return 0.0
    phi_knee = 0.0
    if knee > -math.inf:
        phi_knee = max(-knee, 0.0) + math.log1p(math.exp(-abs(knee)))
    tie = _LOG2 if knee <= 0.0 else phi_knee + cap * knee  # ψ(0): past the knee or before it
    return value + (logs + math.log(prod)) + ties * tie + below * phi_knee + linear


@jitable
def _metric_terms(d, w, s, x, y, X, Y, n, want_val, want_grad, g):
    """The logistic metric loss: ``δᵀWδ`` of all partners at once (:func:`row_dots` of ``D·W``
    and ``D``), gradient ``−Dᵀdiag(φ'·c)D`` scaling the rows of D (one BLAS product)."""
    D = x - X[:n]
    c = np.where(Y[:n] == y, 1.0, -1.0)
    value = 0.0
    if want_val:
        u_s = row_dots(np.dot(D, s.reshape((d, d))), D)
        value = np.sum(phi(c * (1.0 - u_s)))
    if want_grad:
        u_w = row_dots(np.dot(D, w.reshape((d, d))), D)
        coef = -dphi(c * (1.0 - u_w)) * c
        g[:] = np.dot(D.T, D * coef.reshape((n, 1))).ravel()
    return value


@jitable
def _diagonal_terms(w, s, x, y, X, Y, n, want_val, want_grad, g):
    """The logistic metric loss of a diagonal W: ``wᵀ(δ∘δ)`` of all partners at once (one
    matrix-vector product with ``V = D∘D``), gradient ``Σ coef·(δ∘δ) = Vᵀcoef``."""
    D = x - X[:n]
    V = D * D
    c = np.where(Y[:n] == y, 1.0, -1.0)
    value = 0.0
    if want_val:
        value = np.sum(phi(c * (1.0 - np.dot(V, s))))
    if want_grad:
        coef = -dphi(c * (1.0 - np.dot(V, w))) * c
        g[:] = np.dot(coef, V)
    return value


if NUMBA_INSTALLED:
    # Reassociation lets LLVM vectorise the dot products; only these sums change order.
    _auc_terms = njit(_auc_terms, fastmath={"reassoc", "contract"})


@jitable
def buffer_terms(task, d, w, s, x, y, X, Y, n, want_val, want_grad, g, cap, knee):  # noqa: E501  # pragma: no cover
    """Σ over the first n buffer rows of the logistic loss at ``s`` and its gradient at ``w``.

    The compiled fast path's form of :class:`LogisticAUCLoss` (``task`` 0, ``w`` of length d;
    its slope cap as ``cap`` and ``knee``, 1 and −inf without one),
    :class:`LogisticMetricLoss` (``task`` 1, ``w`` a flattened d × d matrix) and
    :class:`DiagonalMetricLoss` (``task`` 2, ``w`` the diagonal, length d): returns
    ``Σ_k ℓ(s; (x, y), (X_k, Y_k))`` when ``want_val`` (else 0.0) and writes
    ``Σ_k ∇ℓ(w; …)`` into ``g`` when ``want_grad`` — the served model's penalty and the
    iterate's gradient against the same partners in one pass. Sums are ordered differently
    from the classes': they agree to ~1e-15 (``tests/test_fast_paths.py``).
    """
    if task == 0:
        return _auc_terms(w, s, x, y, X, Y, n, want_val, want_grad, g, cap, knee)
    if task == 2:
        return _diagonal_terms(w, s, x, y, X, Y, n, want_val, want_grad, g)
    return _metric_terms(d, w, s, x, y, X, Y, n, want_val, want_grad, g)
