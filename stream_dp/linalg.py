"""Small dense linear algebra for the metric task: eigendecomposition, PSD square roots.

A release of the metric task is a d × d PSD matrix; serving it needs its eigenpairs (the
projection onto the PSD cone, ``docs/algorithms.md``, and the square root that
``transform_one`` applies). At d ≈ 32 the per-call overhead of LAPACK and NumPy dominates, so
:func:`sym_eigh`, :func:`is_pos_def` and :func:`row_dots` have a second body for compiled code
(:func:`stream_dp._jit.compiled_body`): a Householder + implicit-QL eigensolver (~40 % faster
than LAPACK's ``dsyevd`` at d = 32), a Cholesky test, and a loop without temporaries. The two
eigensolvers are both backward stable: eigenvalues and spectral projectors agree to
~d·eps·‖S‖, not bit for bit (``tests/test_metric_kernels.py`` holds them together on hard cases).

Why LAPACK through SciPy: NumPy's bundled OpenBLAS multi-threads inside ``eigh`` even for a
32 × 32 matrix, which on a busy two-core machine cost 1–5 ms per call instead of ~70 µs.
"""

from __future__ import annotations

import math

import numpy as np
from scipy.linalg import lapack

from stream_dp._jit import NUMBA_INSTALLED, compiled_body, njit, numba_active

__all__ = [
    "apply_sqrt_factors",
    "is_pos_def",
    "psd_sqrt",
    "row_dots",
    "sqrt_factors",
    "sqrt_from_eigh",
    "sym_eigh",
]

_EPS = float(np.finfo(float).eps)


def sym_eigh(S: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """Eigenvalues (ascending) and eigenvectors of a symmetric matrix (LAPACK ``dsyevd``).

    Examples
    --------
    >>> lam, V = sym_eigh(np.array([[2.0, 1.0], [1.0, 2.0]]))
    >>> lam.round(12).tolist()
    [1.0, 3.0]

    """
    lam, V, info = lapack.dsyevd(S, compute_v=1, lower=1)
    if info != 0:  # pragma: no cover - dsyevd does not fail on finite symmetric input
        return np.linalg.eigh(S)
    return lam, V


def _hypot(a, b):  # pragma: no cover - compiled with numba only
    """``√(a² + b²)``: the plain formula where it is exact to an ulp, ``math.hypot`` elsewhere.

    libm's ``hypot`` rescales on every call and costs ~40 % of the QL sweeps below; the squares
    only lose accuracy once they leave the normal range (|a|, |b| beyond ~1e±150).
    """
    r = math.sqrt(a * a + b * b)
    if 1e-150 < r < 1e150:
        return r
    return math.hypot(a, b)


def _eigh_ql(S):  # pragma: no cover - compiled with numba only
    """:func:`sym_eigh` for numba: Householder tridiagonalisation, then implicit QL.

    The EISPACK ``tred2``/``tql2`` pair (as in JAMA), rearranged for row-major arrays: the
    Householder vectors are rows of ``A`` and the eigenvectors are rows of ``U`` while the QL
    rotations run, so every inner loop walks contiguous memory. Why not LAPACK: at d = 32
    ``dsyevd`` spends ~65 µs here (its divide and conquer and back-transformation are tuned for
    large n), this code ~38 µs. Both are backward stable, so the two bodies of
    :func:`sym_eigh` give the same eigenvalues and the same spectral projectors up to
    ~d·eps·‖S‖ — not bit for bit. Returns the eigenvalues ascending and the eigenvectors as
    columns, as ``np.linalg.eigh``; falls back to it if QL has not converged after 30·d sweeps
    (it always converges on finite input; the cap only guards against non-finite input).
    """
    n = S.shape[0]
    top = 0.0
    for i in range(n):
        for j in range(n):
            top = max(top, abs(S[i, j]))
    if top == 0.0:
        return np.zeros(n), np.eye(n)
    if not math.isfinite(top):
        return np.linalg.eigh(S)
    # Scale by a power of two (exact) so that the largest entry is in [0.5, 1): products of two
    # entries, as in the QL sweep below, then neither overflow nor underflow where it matters.
    expo = math.frexp(top)[1]
    A = S * math.ldexp(1.0, -expo)
    d = np.empty(n)
    e = np.empty(n)
    hs = np.zeros(n)
    p = np.empty(n)
    q = np.empty(n)
    u = np.empty(n)
    # 1. A = Q T Qᵀ: Householder reflections H_i = I − u uᵀ/h zero row i left of the subdiagonal.
    for i in range(n - 1, 0, -1):
        scale = 0.0
        for k in range(i):
            scale += abs(A[i, k])
        if i == 1 or scale == 0.0:  # nothing to annihilate
            e[i] = A[i, i - 1]
        else:
            inv = 1.0 / scale  # scaled against under/overflow in h
            h = 0.0
            for k in range(i):
                v = A[i, k] * inv
                A[i, k] = v
                h += v * v
            f = A[i, i - 1]
            g = math.sqrt(h)
            if f > 0.0:
                g = -g
            e[i] = scale * g
            h -= f * g
            A[i, i - 1] = f - g  # row i of A now holds u
            u[:i] = A[i, :i]  # a separate copy lets LLVM vectorise the loops below
            # p = A u / h as a sum of rows of A (A is exactly symmetric: both triangles get the
            # same update): axpys vectorise, dot products would not (no reassociation).
            p[:i] = 0.0
            for k in range(i):
                uk = u[k]
                for j in range(i):
                    p[j] += uk * A[k, j]
            K = 0.0
            for j in range(i):
                p[j] /= h
                K += p[j] * u[j]
            K /= h + h
            for j in range(i):
                q[j] = p[j] - K * u[j]
            for j in range(i):  # A ← A − u qᵀ − q uᵀ on the leading i × i block
                uj = u[j]
                qj = q[j]
                for k in range(i):
                    A[j, k] -= uj * q[k] + qj * u[k]
            hs[i] = h
        d[i] = A[i, i]
    d[0] = A[0, 0]
    # 2. Q = H_{n−1} ··· H_1, applied to I from the left (H_1 first) so that each H_i touches
    #    only X[:i, :i]; uᵀX is a sum of rows (axpys, which vectorise). U = Qᵀ.
    X = np.zeros((n, n))
    for i in range(n):
        X[i, i] = 1.0
    for i in range(2, n):
        h = hs[i]
        if h == 0.0:
            continue
        u[:i] = A[i, :i]
        q[:i] = 0.0
        for k in range(i):
            uk = u[k]
            for j in range(i):
                q[j] += uk * X[k, j]
        for k in range(i):
            f = u[k] / h
            for j in range(i):
                X[k, j] -= f * q[j]
    U = np.ascontiguousarray(X.T)
    # 3. Implicit QL with Wilkinson-type shifts on T (d, e); rotations update rows of U.
    for i in range(1, n):
        e[i - 1] = e[i]
    e[n - 1] = 0.0
    f = 0.0
    tst1 = 0.0
    eps = 2.0**-52
    sweeps = 0
    for l in range(n):
        tst1 = max(tst1, abs(d[l]) + abs(e[l]))
        m = l
        while m < n - 1 and abs(e[m]) > eps * tst1:
            m += 1
        if m > l:
            while True:
                sweeps += 1
                if sweeps > 30 * n:
                    return np.linalg.eigh(S)
                g = d[l]
                pv = (d[l + 1] - g) / (2.0 * e[l])
                r = _hypot(pv, 1.0)
                if pv < 0.0:
                    r = -r
                d[l] = e[l] / (pv + r)
                d[l + 1] = e[l] * (pv + r)
                dl1 = d[l + 1]
                h = g - d[l]
                for i in range(l + 2, n):
                    d[i] -= h
                f += h
                pv = d[m]
                c = 1.0
                c2 = 1.0
                c3 = 1.0
                el1 = e[l + 1]
                s = 0.0
                s2 = 0.0
                for i in range(m - 1, l - 1, -1):
                    c3 = c2
                    c2 = c
                    s2 = s
                    g = c * e[i]
                    h = c * pv
                    r = _hypot(pv, e[i])
                    e[i + 1] = s * r
                    s = e[i] / r
                    # c·d[i] − s·g with c = pv/r, s = e[i]/r: the numerator does not wait for
                    # the square root, which shortens the serial chain of the sweep by ~20 %.
                    t = (pv * d[i] - e[i] * g) / r
                    c = pv / r
                    pv = t
                    d[i + 1] = h + s * (c * g + s * d[i])
                    for k in range(n):
                        h = U[i + 1, k]
                        U[i + 1, k] = s * U[i, k] + c * h
                        U[i, k] = c * U[i, k] - s * h
                pv = -s * s2 * c3 * el1 * e[l] / dl1
                e[l] = s * pv
                d[l] = c * pv
                if not abs(e[l]) > eps * tst1:  # (a NaN ends the loop too)
                    break
        d[l] += f
        e[l] = 0.0
    order = np.argsort(d)
    lam = np.empty(n)
    V = np.empty((n, n))
    back = math.ldexp(1.0, expo)
    for j in range(n):  # ascending, eigenvectors as columns (one pass, no temporaries)
        o = order[j]
        lam[j] = d[o] * back
        for i in range(n):
            V[i, j] = U[o, i]
    return lam, V


if NUMBA_INSTALLED:
    from stream_dp._jit import numba

    _hypot = numba.extending.register_jitable(inline="always")(_hypot)
    _eigh_ql_compiled = njit(_eigh_ql)


@compiled_body(sym_eigh)
def _sym_eigh_compiled(S):
    def impl(S):
        return _eigh_ql_compiled(S)

    return impl


def is_pos_def(S: np.ndarray) -> bool:
    """True when the Cholesky factorisation of the symmetric matrix ``S`` succeeds.

    Examples
    --------
    >>> is_pos_def(np.eye(2)), is_pos_def(-np.eye(2))
    (True, False)

    """
    return lapack.dpotrf(S, lower=1, clean=0)[1] == 0


@compiled_body(is_pos_def)
def _is_pos_def_compiled(S):
    def impl(S):
        try:
            np.linalg.cholesky(S)
            return True
        except Exception:  # numba raises LinAlgError for a non-positive-definite matrix
            return False

    return impl


def row_dots(A: np.ndarray, B: np.ndarray) -> np.ndarray:
    """``Σ_j A[k, j]·B[k, j]`` for every row k (a product with a vector of ones: BLAS).

    Compiled: a loop instead (no n × d temporary; each row summed in order, so the sums may
    differ from BLAS's in the last bit).

    Examples
    --------
    >>> row_dots(np.array([[1.0, 2.0], [3.0, 4.0]]), np.ones((2, 2))).tolist()
    [3.0, 7.0]

    """
    return np.dot(A * B, np.ones(A.shape[1]))


@compiled_body(row_dots)
def _row_dots_compiled(A, B):
    def impl(A, B):
        n, m = A.shape
        out = np.empty(n)
        for k in range(n):
            acc = 0.0
            for j in range(m):
                acc += A[k, j] * B[k, j]
            out[k] = acc
        return out

    return impl


# -- PSD square roots: what ``transform_one`` applies -------------------------------------------
def sqrt_factors(lam: np.ndarray, V: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """``(L, R)`` with ``L @ R = V·diag(√λ)·Vᵀ``: ``L = V₊·diag(√λ₊)``, ``R = V₊ᵀ``.

    ``lam`` is ascending, as :func:`sym_eigh` returns it; ``V₊`` keeps the eigenvectors whose
    eigenvalue is above the rounding level (≤ d·eps·max λ counts as exactly 0). A PSD matrix
    rebuilt from its eigenpairs has its zero eigenvalues back only up to rounding (±1e-17
    instead of 0), and ``√1e-17 ≈ 3e-9`` would be pure rounding noise in the root; cutting at
    the rounding level makes the root the same whether it is taken from the eigenpairs the
    projection computed or from a fresh decomposition of the released matrix. A noisy release
    keeps about half of its eigenpairs, so ``L @ (R @ x)`` costs no more than one product with
    the d × d root, and the root itself is never built.
    """
    fns = _compiled_root()
    if fns is not None:
        return fns[0](lam, V, _sqrt_cut(lam))
    return _root_factors(lam, V, _sqrt_cut(lam))


def _sqrt_cut(lam: np.ndarray) -> float:
    n = lam.shape[0]
    return n * _EPS * max(float(lam[-1]), 0.0) if n else 0.0


def _root_factors(lam, V, cut):
    k = int(np.searchsorted(lam, cut, side="right"))
    Vk = V[:, k:]
    return Vk * np.sqrt(lam[k:]), Vk.T.copy()  # copies: V may be a buffer the fast path reuses


def _root_factors_loops(lam, V, cut):  # pragma: no cover - compiled with numba only
    """:func:`_root_factors` element by element (the same products: bit for bit)."""
    n = lam.shape[0]
    k = 0
    while k < n and lam[k] <= cut:
        k += 1
    m = n - k
    L = np.empty((n, m))
    R = np.empty((m, n))
    for j in range(m):
        r = math.sqrt(lam[k + j])
        for i in range(n):
            vij = V[i, k + j]
            L[i, j] = vij * r
            R[j, i] = vij
    return L, R


def _apply_factors_loops(L, R, v):  # pragma: no cover - compiled with numba only
    """``L @ (R @ v)`` (summed in order; NumPy's BLAS sums in blocks: equal to ~1e-16)."""
    m, n = R.shape
    t = np.empty(m)
    for j in range(m):
        acc = 0.0
        for i in range(n):
            acc += R[j, i] * v[i]
        t[j] = acc
    out = np.empty(L.shape[0])
    for i in range(L.shape[0]):
        acc = 0.0
        for j in range(m):
            acc += L[i, j] * t[j]
        out[i] = acc
    return out


# [(factors, apply) compiled], filled on first use with numba active: the transform of one
# record is a handful of tiny array operations, where NumPy's per-call overhead dominates.
_ROOT_NB: list = []


def _compiled_root():
    if not numba_active():
        return None
    if not _ROOT_NB:
        _ROOT_NB.append((njit(_root_factors_loops), njit(_apply_factors_loops)))
    return _ROOT_NB[0]


def apply_sqrt_factors(L: np.ndarray, R: np.ndarray, v: np.ndarray) -> np.ndarray:
    """``L @ (R @ v)`` for factors from :func:`sqrt_factors` (compiled when numba is active)."""
    fns = _compiled_root()
    return L @ (R @ v) if fns is None else fns[1](L, R, v)


def sqrt_from_eigh(lam: np.ndarray, V: np.ndarray) -> np.ndarray:
    """``V·diag(√λ)·Vᵀ``, eigenvalues at rounding level (≤ d·eps·max λ) treated as exactly 0
    (see :func:`sqrt_factors`)."""
    L, R = sqrt_factors(lam, V)
    return L @ R


def psd_sqrt(W: np.ndarray) -> np.ndarray:
    """Symmetric square root of a PSD matrix (eigenvalues at rounding level or below: 0).

    Examples
    --------
    >>> psd_sqrt(np.diag([4.0, 9.0])).round(12).tolist()
    [[2.0, 0.0], [0.0, 3.0]]

    """
    lam, V = sym_eigh(0.5 * (W + W.T))
    return sqrt_from_eigh(lam, V)
