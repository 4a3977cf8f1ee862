"""Constraint sets C and their Euclidean projections Π_C (`docs/algorithms.md`,
*Conventions shared by all learners*).

Projections are non-expansive; every sensitivity bound in :mod:`stream_dp.sensitivity` relies on
that. Each set also reports ``max_norm`` (sup ‖w‖ over C) and ``diameter`` (sup ‖w − w'‖), and
can draw a data-independent random point (the warm-up releases of OnPairStrC, OnPairC's w₀).

"""

from __future__ import annotations

import math

import numpy as np

from stream_dp._jit import jitable
from stream_dp.linalg import is_pos_def, sym_eigh

__all__ = [
    "ConstraintSet",
    "L2Ball",
    "NonnegativeBall",
    "PSDFrobeniusBall",
    "PSDNuclearBall",
    "project_l2",
    "project_nonnegative_l2",
    "project_psd_frobenius",
    "project_simplex_leq",
]


# -- the projections, in place on flat parameter vectors (also called from compiled code) -----
@jitable
def project_l2(w, radius):
    """``w ← w·min(1, D/‖w‖)`` in place (Euclidean / Frobenius ball)."""
    norm = math.sqrt(np.dot(w, w))
    if norm > radius:
        w *= radius / norm


@jitable
def project_nonnegative_l2(w, radius):
    """Project ``w`` in place onto ``{w ≥ 0, ‖w‖ ≤ D}``: clip at 0, then scale into the ball.

    The diagonal of :func:`project_psd_frobenius`: the cone is invariant under positive scaling
    and scaling keeps it, so the two projections in this order are the joint one.
    """
    for i in range(w.shape[0]):
        if w[i] < 0.0:
            w[i] = 0.0
    project_l2(w, radius)


@jitable
def project_psd_frobenius(w, d, radius, lam_out, V_out):
    """Project the flattened d × d matrix ``w`` in place onto ``{W ⪰ 0, ‖W‖_F ≤ D}``.

    Symmetrise; if the result is positive definite (its Cholesky factorisation succeeds) it is
    its own projection onto the cone, and only the ball remains (a scaling) — no
    eigendecomposition. Otherwise: eigendecompose, clip the eigenvalues at 0, scale them into the
    ball and rebuild. Returns 1 when the eigenpairs of the result were written to ``lam_out`` /
    ``V_out`` (so a square root costs no second decomposition), 0 otherwise. Compiled, the
    eigendecomposition is :func:`stream_dp.linalg.sym_eigh`'s QL body (agreeing with LAPACK's to
    ~d·eps·‖S‖).
    """
    W = w.reshape((d, d))
    S = 0.5 * (W + W.T)
    # A positive diagonal is necessary for positive definiteness: a cheap gate before Cholesky
    # (a noisy release almost never passes it, the learner's iterate almost always does).
    if np.all(np.diag(S) > 0.0) and is_pos_def(S):
        norm = math.sqrt(np.sum(S * S))
        if norm > radius:
            S = S * (radius / norm)
        w[:] = S.ravel()
        return 0
    lam, V = sym_eigh(S)
    lam = np.maximum(lam, 0.0)
    norm = math.sqrt(np.dot(lam, lam))
    if norm > radius:
        lam = lam * (radius / norm)
    # Only the positive eigenpairs contribute: for a noisy release about half of them.
    keep = np.flatnonzero(lam > 0.0)
    Vk = V[:, keep]
    P = np.dot(Vk * lam[keep], Vk.T)
    w[:] = (0.5 * (P + P.T)).ravel()
    lam_out[:] = lam
    V_out[:, :] = V
    return 1


class ConstraintSet:
    """Base class for closed convex sets with an exact projection, of radius ``D``."""

    radius: float

    def __init__(self, radius: float) -> None:
        if not (radius > 0 and math.isfinite(radius)):
            raise ValueError(f"radius must be a positive finite number, got {radius!r}")
        self.radius = float(radius)

    def project(self, w: np.ndarray) -> np.ndarray:  # pragma: no cover - abstract
        raise NotImplementedError

    def contains(self, w: np.ndarray, tol: float = 1e-9) -> bool:  # pragma: no cover
        raise NotImplementedError

    def project_inplace(self, flat: np.ndarray, lam: np.ndarray, V: np.ndarray) -> bool:
        """Project the flattened parameter in place; True when the eigenpairs of the result
        were written to ``lam``/``V`` (PSD sets: the square root of a release then costs no
        second decomposition)."""
        d = lam.shape[0]
        shape = (d, d) if flat.size == d * d and flat.size != d else (flat.size,)
        flat[:] = self.project(flat.reshape(shape)).reshape(-1)
        return False

    @property
    def max_norm(self) -> float:
        return self.radius

    @property
    def diameter(self) -> float:  # pragma: no cover - abstract
        raise NotImplementedError

    def sample(self, rng: np.random.Generator, shape: tuple[int, ...]) -> np.ndarray:
        raise NotImplementedError  # pragma: no cover

    def __repr__(self) -> str:
        return f"{type(self).__name__}(radius={self.radius})"


def _uniform_in_ball(rng: np.random.Generator, shape: tuple[int, ...], radius: float) -> np.ndarray:
    g = rng.standard_normal(shape)
    n = g.size
    norm = float(np.linalg.norm(g))
    return g * (radius * rng.random() ** (1.0 / n) / max(norm, 1e-300))


class L2Ball(ConstraintSet):
    """``{w : ‖w‖₂ ≤ D}`` (Frobenius norm for matrices).

    Examples
    --------
    >>> import numpy as np
    >>> L2Ball(1.0).project(np.array([3.0, 4.0]))
    array([0.6, 0.8])

    """

    def project(self, w: np.ndarray) -> np.ndarray:
        out = np.array(w, dtype=float)  # a copy: project_l2 works in place
        project_l2(out.reshape(-1), self.radius)
        return out

    def contains(self, w: np.ndarray, tol: float = 1e-9) -> bool:
        return float(np.linalg.norm(w)) <= self.radius * (1 + tol)

    def project_inplace(self, flat: np.ndarray, lam: np.ndarray, V: np.ndarray) -> bool:
        project_l2(flat, self.radius)
        return False

    @property
    def diameter(self) -> float:
        return 2.0 * self.radius

    def sample(self, rng: np.random.Generator, shape: tuple[int, ...]) -> np.ndarray:
        """Uniform in the ball."""
        return _uniform_in_ball(rng, shape, self.radius)


class NonnegativeBall(ConstraintSet):
    """``{w ≥ 0 : ‖w‖₂ ≤ D}``: the diagonal metrics ``W = diag(w)`` of the PSD ∩ Frobenius ball.

    ``diag(w)`` is PSD exactly when ``w ≥ 0`` and ``‖diag(w)‖_F = ‖w‖₂``, so this is
    :class:`PSDFrobeniusBall` restricted to diagonal matrices, with the same diameter ``√2·D``
    (non-negative vectors have non-negative inner products).

    Examples
    --------
    >>> import numpy as np
    >>> NonnegativeBall(1.0).project(np.array([3.0, -4.0]))
    array([1., 0.])

    """

    def project(self, w: np.ndarray) -> np.ndarray:
        out = np.array(w, dtype=float)
        if out.ndim != 1:
            raise ValueError(f"expected a vector (the diagonal of W), got shape {out.shape}")
        project_nonnegative_l2(out, self.radius)
        return out

    def contains(self, w: np.ndarray, tol: float = 1e-9) -> bool:
        w = np.asarray(w, dtype=float)
        return bool(w.min(initial=0.0) >= -tol * max(1.0, self.radius)) and float(
            np.linalg.norm(w)
        ) <= self.radius * (1 + tol)

    def project_inplace(self, flat: np.ndarray, lam: np.ndarray, V: np.ndarray) -> bool:
        project_nonnegative_l2(flat, self.radius)
        return False

    @property
    def diameter(self) -> float:
        return math.sqrt(2.0) * self.radius

    def sample(self, rng: np.random.Generator, shape: tuple[int, ...]) -> np.ndarray:
        """The absolute value of a uniform point of the ball (data-independent, in the set)."""
        return np.abs(_uniform_in_ball(rng, shape, self.radius))


def _sym(W: np.ndarray) -> np.ndarray:
    return 0.5 * (W + W.T)


class PSDFrobeniusBall(ConstraintSet):
    """``{W symmetric PSD : ‖W‖_F ≤ D}``.

    The projection symmetrises, clips eigenvalues at 0 (projection onto the PSD cone), then
    scales into the Frobenius ball. Composing the two projections in this order is exact for
    this pair of sets: scaling a PSD matrix keeps it PSD and the cone is invariant under
    positive scaling, so the KKT conditions of the joint problem hold (checked against a generic
    convex solver in the tests).

    The set's Frobenius diameter is ``√2·D``: for PSD A, B, ``⟨A, B⟩ ≥ 0``, so
    ``‖A − B‖² ≤ ‖A‖² + ‖B‖² ≤ 2D²``.

    Examples
    --------
    >>> import numpy as np
    >>> W = PSDFrobeniusBall(1.0).project(np.array([[2.0, 0.0], [0.0, -1.0]]))
    >>> W
    array([[1., 0.],
           [0., 0.]])

    """

    def project(self, W: np.ndarray) -> np.ndarray:
        """Symmetrise, then: positive definite (a Cholesky test) → only the ball applies (a
        scaling, no eigendecomposition); otherwise clip the eigenvalues at 0 and scale them into
        the ball (:func:`project_psd_frobenius`, shared with the learners' fast path)."""
        d = W.shape[0]
        if W.ndim != 2 or W.shape[1] != d:
            raise ValueError(f"expected a square matrix, got shape {W.shape}")
        out = np.array(W, dtype=float)
        project_psd_frobenius(out.reshape(-1), d, self.radius, np.empty(d), np.empty((d, d)))
        return out

    def contains(self, W: np.ndarray, tol: float = 1e-9) -> bool:
        if not np.allclose(W, W.T, atol=tol * max(1.0, self.radius)):
            return False
        lam = np.linalg.eigvalsh(_sym(W))
        return bool(lam.min() >= -tol * max(1.0, self.radius)) and float(
            np.linalg.norm(lam)
        ) <= self.radius * (1 + tol)

    def project_inplace(self, flat: np.ndarray, lam: np.ndarray, V: np.ndarray) -> bool:
        return bool(project_psd_frobenius(flat, lam.shape[0], self.radius, lam, V))

    @property
    def diameter(self) -> float:
        return math.sqrt(2.0) * self.radius

    def sample(self, rng: np.random.Generator, shape: tuple[int, ...]) -> np.ndarray:
        """A random PSD matrix: uniform in the Frobenius ball of symmetric matrices, projected.

        Only data independence matters for privacy; exact uniformity on C does not.
        """
        A = _uniform_in_ball(rng, shape, self.radius)
        return self.project(A)


def project_simplex_leq(v: np.ndarray, z: float) -> np.ndarray:
    """Euclidean projection of ``v`` onto ``{λ ≥ 0, Σλ ≤ z}`` (sort-based, O(n log n)).

    Examples
    --------
    >>> project_simplex_leq(np.array([0.5, 0.2]), 1.0)
    array([0.5, 0.2])
    >>> project_simplex_leq(np.array([2.0, 0.0]), 1.0)
    array([1., 0.])

    """
    p = np.maximum(v, 0.0)
    if p.sum() <= z:
        return p
    # Onto the face Σλ = z (Duchi et al. 2008).
    u = np.sort(v)[::-1]
    css = np.cumsum(u)
    k = np.arange(1, len(u) + 1)
    cond = u - (css - z) / k > 0
    r = k[cond][-1]
    theta = (css[r - 1] - z) / r
    return np.maximum(v - theta, 0.0)


class PSDNuclearBall(ConstraintSet):
    """``{W symmetric PSD : ‖W‖_{S1} ≤ D}`` (nuclear norm; trace for PSD), Yang et al. (2021).

    Projection: eigenvalues onto ``{λ ≥ 0, Σλ ≤ D}``. ``max_norm`` (Frobenius) is D and the
    Frobenius diameter is ``√2·D``.
    """

    def project(self, W: np.ndarray) -> np.ndarray:
        lam, V = np.linalg.eigh(_sym(W))
        lam = project_simplex_leq(lam, self.radius)
        return _sym((V * lam) @ V.T)

    def contains(self, W: np.ndarray, tol: float = 1e-9) -> bool:
        if not np.allclose(W, W.T, atol=tol * max(1.0, self.radius)):
            return False
        lam = np.linalg.eigvalsh(_sym(W))
        scale = max(1.0, self.radius)
        return bool(lam.min() >= -tol * scale) and float(lam.sum()) <= self.radius + tol * scale

    @property
    def diameter(self) -> float:
        return math.sqrt(2.0) * self.radius

    def sample(self, rng: np.random.Generator, shape: tuple[int, ...]) -> np.ndarray:
        return self.project(_uniform_in_ball(rng, shape, self.radius))
