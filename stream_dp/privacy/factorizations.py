"""Factorizations ``A = B·C`` of the prefix-sum workload: the strategies of correlated noise.

A learner that adds the noise ``σ·(C⁻¹Z)_t`` to the gradient of step ``t`` (``Z`` standard normal,
one row per step) publishes, up to post-processing, ``C·G + σZ``: one Gaussian mechanism on the
whole gradient stream ``G`` (Denisov et al., NeurIPS 2022; Choquette-Choo et al., ICML 2023).
Every model computed from the noisy gradients is post-processing of it, so releasing a model at
every step costs nothing more. Its cost is ``ρ = Δ²/(2σ²)`` with ``Δ = sup ‖C(G − G′)‖_F`` over
neighbouring streams (``docs/privacy.md``, section *Correlated noise*).

A factorization here answers, for a horizon of ``n`` steps:

* :meth:`~Factorization.column_norms` and :meth:`~Factorization.max_column_norm`: ``‖C e_j‖``;
* :meth:`~Factorization.sensitivity`: ``sup ‖C D‖_F`` over gradient differences ``D`` whose rows
  have norms at most a pattern ``u`` placed anywhere in the stream (the pairwise influence
  pattern, :mod:`stream_dp.privacy.influence`);
* :meth:`~Factorization.prefix_variance`: the per-coordinate variance of the noise in the prefix
  sums ``Σ_{s≤t} ĝ_s`` for ``σ = 1`` — the error that every iterate of SGD inherits;
* :meth:`~Factorization.noise_matrix`: the matrix ``M`` with gradient noise ``σ·M·Z`` (dense, for
  tests and small horizons); the streaming noise is :mod:`stream_dp.privacy.correlated_noise`.

Four strategies share this interface: :class:`SqrtToeplitz` (Fichtenberger, Henzinger and
Upadhyay 2023, the reference), :class:`~stream_dp.privacy.blt.BLT` (buffered linear Toeplitz,
the one to use; in :mod:`stream_dp.privacy.blt`), and the baselines :class:`BinaryTree` (Dwork et
al. 2010, plain estimator) and :class:`Independent` (``C = I``).

"""

from __future__ import annotations

import math

import numpy as np

from stream_dp._signal import fftconvolve

__all__ = [
    "Factorization",
    "ToeplitzFactorization",
    "SqrtToeplitz",
    "BinaryTree",
    "Independent",
    "sqrt_toeplitz_coefficients",
]


def _check_horizon(n: int) -> int:
    if isinstance(n, bool) or not isinstance(n, int | np.integer) or n < 1:
        raise ValueError(f"the horizon must be a positive integer, got {n!r}")
    return int(n)


def _check_pattern(pattern) -> np.ndarray:
    u = np.asarray(pattern, dtype=float)
    if u.ndim != 1 or u.size == 0 or not np.all(np.isfinite(u)) or np.any(u < 0):
        raise ValueError("an influence pattern is a non-empty 1-D array of finite values >= 0")
    return u


class Factorization:
    """A factorization of the prefix-sum workload (base class; see the module docstring)."""

    #: Short name used in ``describe()``, checkpoints and the ledger's description.
    name: str = ""

    def strategy_matrix(self, n: int) -> np.ndarray:  # pragma: no cover - abstract
        """``C`` for ``n`` steps (rows: released values, columns: steps). Dense: small n only."""
        raise NotImplementedError

    def noise_matrix(self, n: int) -> np.ndarray:  # pragma: no cover - abstract
        """``M`` (``n`` × rows of C) with ``M·C`` = I: the gradient noise is ``σ·M·Z``."""
        raise NotImplementedError

    def column_norms(self, n: int) -> np.ndarray:  # pragma: no cover - abstract
        """``‖C e_j‖`` for the steps ``j = 1 … n``."""
        raise NotImplementedError

    def max_column_norm(self, n: int) -> float:
        """``max_j ‖C e_j‖``: the sensitivity for one step's gradient of norm ≤ 1."""
        return float(np.max(self.column_norms(_check_horizon(n))))

    def prefix_variance(self, n: int) -> np.ndarray:  # pragma: no cover - abstract
        """Per-coordinate variance of the noise in ``Σ_{s≤t} ĝ_s`` (σ = 1), for t = 1 … n."""
        raise NotImplementedError

    def max_error(self, n: int) -> float:
        """The largest prefix-sum variance (σ = 1) over ``t ≤ n``."""
        return float(np.max(self.prefix_variance(_check_horizon(n))))

    def mean_error(self, n: int) -> float:
        """The mean prefix-sum variance (σ = 1) over ``t = 1 … n``."""
        return float(np.mean(self.prefix_variance(_check_horizon(n))))

    def loss(self, n: int, error: str = "max") -> float:
        """``max_column_norm(n)² × error``: the prefix-sum variance at unit sensitivity.

        Scale-free (multiplying C by a constant leaves it unchanged), so strategies compare
        on it directly: the noise of every prefix sum at a given ρ is proportional to its
        square root.
        """
        err = self.max_error(n) if error == "max" else self.mean_error(n)
        return self.max_column_norm(n) ** 2 * err

    def sensitivity(self, pattern, n: int) -> float:
        """``sup ‖C D‖_F`` over D with ``‖D_{i+k}‖ ≤ pattern[k]`` (any start i; other rows 0).

        The default is the triangle inequality, valid for every C:
        ``‖C D‖_F ≤ Σ_t ‖C e_t‖·‖D_t‖ ≤ ‖pattern‖₁ · max_j ‖C e_j‖``. Subclasses compute the
        exact supremum where they can.
        """
        u = _check_pattern(pattern)
        return float(u.sum()) * self.max_column_norm(_check_horizon(n))

    def state_dict(self) -> dict:  # pragma: no cover - abstract
        raise NotImplementedError

    def __repr__(self) -> str:
        return f"{type(self).__name__}()"


class ToeplitzFactorization(Factorization):
    """Lower-triangular Toeplitz ``C`` with coefficients ``c_0 = 1, c_1, …`` (all ≥ 0).

    ``C⁻¹`` is Toeplitz too, with coefficients ``d`` (the reciprocal power series). Subclasses
    give :meth:`coefficients` and :meth:`inverse_coefficients`.
    """

    def coefficients(self, n: int) -> np.ndarray:  # pragma: no cover - abstract
        """``c_0 … c_{n−1}`` of C."""
        raise NotImplementedError

    def inverse_coefficients(self, n: int) -> np.ndarray:  # pragma: no cover - abstract
        """``d_0 … d_{n−1}`` of ``C⁻¹``."""
        raise NotImplementedError

    def strategy_matrix(self, n: int) -> np.ndarray:
        return _lower_toeplitz(self.coefficients(_check_horizon(n)))

    def noise_matrix(self, n: int) -> np.ndarray:
        return _lower_toeplitz(self.inverse_coefficients(_check_horizon(n)))

    def column_norms(self, n: int) -> np.ndarray:
        # Column j of a lower-triangular Toeplitz matrix holds c_0 … c_{n−j}.
        c = self.coefficients(_check_horizon(n))
        return np.sqrt(np.cumsum(c * c))[::-1]

    def max_column_norm(self, n: int) -> float:
        c = self.coefficients(_check_horizon(n))
        return math.sqrt(math.fsum(c * c))

    def prefix_variance(self, n: int) -> np.ndarray:
        # Row t of A·C⁻¹ holds D_0 … D_{t−1}, the partial sums of d.
        partial = np.cumsum(self.inverse_coefficients(_check_horizon(n)))
        return np.cumsum(partial * partial)

    def sensitivity(self, pattern, n: int) -> float:
        """Exact: ``‖C u‖`` with the pattern placed at the first step.

        Why this is the supremum (``docs/privacy.md``, *Sensitivity of the gradient stream*):
        with ``c ≥ 0``, ``‖C D‖_F² = Σ_{s,t} (CᵀC)_{st}⟨D_s, D_t⟩ ≤ Σ_{s,t} (CᵀC)_{st} u_s u_t``
        because every ``(CᵀC)_{st} ≥ 0`` and ``⟨D_s, D_t⟩ ≤ u_s u_t``, with equality for
        aligned rows; and placing the pattern later only drops rows of ``C u`` (Toeplitz), each
        of them non-negative.
        """
        n = _check_horizon(n)
        u = _check_pattern(pattern)[:n]
        c = self.coefficients(n)
        if np.any(c < 0):  # pragma: no cover - every strategy here has c >= 0
            return super().sensitivity(u, n)
        cu = fftconvolve(c, u)[:n] if len(u) > 1 else c * u[0]
        # FFT rounding is ~1e-16 relative to the largest entry: round up by far more than that.
        return float(math.sqrt(math.fsum(cu * cu))) * (1.0 + 1e-9)


def _lower_toeplitz(c: np.ndarray) -> np.ndarray:
    n = len(c)
    idx = np.arange(n)[:, None] - np.arange(n)[None, :]
    return np.where(idx >= 0, c[np.clip(idx, 0, None)], 0.0)


def sqrt_toeplitz_coefficients(n: int) -> np.ndarray:
    """``c_k = binom(2k, k)/4^k``, k = 0 … n−1: the power series of ``(1 − x)^{−1/2}``.

    Computed by the exact recurrence ``c_k = c_{k−1}·(2k − 1)/(2k)`` (no factorials).

    Examples
    --------
    >>> sqrt_toeplitz_coefficients(4).tolist()
    [1.0, 0.5, 0.375, 0.3125]

    """
    n = _check_horizon(n)
    k = np.arange(1, n, dtype=float)
    return np.concatenate([[1.0], np.cumprod((2.0 * k - 1.0) / (2.0 * k))])


class SqrtToeplitz(ToeplitzFactorization):
    """The square-root factorization ``C = A^{1/2}`` (Fichtenberger, Henzinger, Upadhyay 2023).

    ``c_k = binom(2k, k)/4^k`` and ``C⁻¹`` has ``d_0 = 1, d_k = −c_k/(2k − 1)`` (the series of
    ``(1 − x)^{1/2}``), so ``A·C⁻¹ = C``: the prefix-sum noise of step t has variance
    ``Σ_{k<t} c_k²`` — the same number as the squared column norm, about ``(ln t)/π + 1``.
    Applying ``C⁻¹`` to a stream needs every past row (O(t) memory), so it is the reference a
    :class:`~stream_dp.privacy.blt.BLT` is held against, not a runtime mechanism.

    Examples
    --------
    >>> f = SqrtToeplitz()
    >>> round(f.max_column_norm(1000) ** 2, 4), round(f.max_error(1000), 4)
    (3.265, 3.265)

    """

    name = "sqrt-toeplitz"

    def coefficients(self, n: int) -> np.ndarray:
        return sqrt_toeplitz_coefficients(n)

    def inverse_coefficients(self, n: int) -> np.ndarray:
        c = sqrt_toeplitz_coefficients(n)
        k = np.arange(n, dtype=float)
        d = -c / np.where(k > 0, 2.0 * k - 1.0, 1.0)
        d[0] = 1.0
        return d

    def prefix_variance(self, n: int) -> np.ndarray:
        c = sqrt_toeplitz_coefficients(n)  # the partial sums of d are c itself
        return np.cumsum(c * c)

    def state_dict(self) -> dict:
        return {"kind": self.name}


class Independent(Factorization):
    """``C = I``: fresh Gaussian noise on every gradient (the baseline of DP-SGD).

    A pattern ``u`` has sensitivity ``‖u‖₂``; the prefix-sum variance grows like ``t``.

    Examples
    --------
    >>> round(Independent().sensitivity([3.0, 4.0], n=10), 9)
    5.0

    """

    name = "independent"

    def strategy_matrix(self, n: int) -> np.ndarray:
        return np.eye(_check_horizon(n))

    def noise_matrix(self, n: int) -> np.ndarray:
        return np.eye(_check_horizon(n))

    def column_norms(self, n: int) -> np.ndarray:
        return np.ones(_check_horizon(n))

    def max_column_norm(self, n: int) -> float:
        _check_horizon(n)
        return 1.0

    def prefix_variance(self, n: int) -> np.ndarray:
        return np.arange(1, _check_horizon(n) + 1, dtype=float)

    def sensitivity(self, pattern, n: int) -> float:
        u = _check_pattern(pattern)[: _check_horizon(n)]
        return float(math.sqrt(math.fsum(u * u))) * (1.0 + 1e-12)  # rounded up

    def state_dict(self) -> dict:
        return {"kind": self.name}


class BinaryTree(Factorization):
    """The binary-tree mechanism with the plain estimator (Dwork et al. 2010; Chan et al. 2011).

    ``C`` has one row per *complete* dyadic interval ``(q − 1)·2^ℓ + 1 … q·2^ℓ ≤ n`` (the tree
    nodes; ``ℓ = 0 … ⌊log₂ n⌋``), so every column has norm at most ``√(⌊log₂ n⌋ + 1)``. The
    prefix sum of step t is the sum of the nodes of t's binary decomposition — for every set
    bit ℓ of t, node ``(ℓ, t >> ℓ)`` — and the gradient noise of step t is the difference of
    the decompositions of t and t − 1: post-processing of the noisy nodes. Its prefix-sum
    variance is ``popcount(t)``. Honaker's estimator would cut the error further; this is the
    baseline.

    Examples
    --------
    >>> BinaryTree().max_column_norm(8) ** 2, BinaryTree().prefix_variance(7).tolist()
    (4.0, [1.0, 1.0, 2.0, 1.0, 2.0, 2.0, 3.0])

    """

    name = "tree"

    @staticmethod
    def nodes(n: int) -> list[tuple[int, int]]:
        """The complete nodes ``(level ℓ, index q)`` for ``n`` steps, level by level."""
        n = _check_horizon(n)
        return [(lv, q) for lv in range(n.bit_length()) for q in range(1, (n >> lv) + 1)]

    @staticmethod
    def decomposition(t: int) -> list[tuple[int, int]]:
        """The nodes whose sum is the prefix ``1 … t``: ``(ℓ, t >> ℓ)`` for every set bit ℓ."""
        return [(lv, t >> lv) for lv in range(int(t).bit_length()) if (t >> lv) & 1]

    def strategy_matrix(self, n: int) -> np.ndarray:
        nodes = self.nodes(n)
        C = np.zeros((len(nodes), n))
        for r, (lv, q) in enumerate(nodes):
            C[r, (q - 1) << lv : q << lv] = 1.0
        return C

    def noise_matrix(self, n: int) -> np.ndarray:
        index = {node: r for r, node in enumerate(self.nodes(n))}
        M = np.zeros((n, len(index)))
        for t in range(1, n + 1):
            for node in self.decomposition(t):
                M[t - 1, index[node]] += 1.0
            for node in self.decomposition(t - 1):
                M[t - 1, index[node]] -= 1.0
        return M

    def column_norms(self, n: int) -> np.ndarray:
        n = _check_horizon(n)
        t = np.arange(1, n + 1)
        count = np.zeros(n)
        for lv in range(n.bit_length()):  # t's node at level ℓ is complete iff ⌈t/2^ℓ⌉·2^ℓ ≤ n
            count += ((((t - 1) >> lv) + 1) << lv) <= n
        return np.sqrt(count)

    def max_column_norm(self, n: int) -> float:
        return math.sqrt(_check_horizon(n).bit_length())

    def prefix_variance(self, n: int) -> np.ndarray:
        t = np.arange(1, _check_horizon(n) + 1)
        return np.array([bin(int(v)).count("1") for v in t], dtype=float)

    def sensitivity(self, pattern, n: int) -> float:
        """A bound on ``sup ‖C D‖_F``: the worst placement level by level.

        ``‖C D‖_F² ≤ Σ_nodes (Σ_{t∈node} u_t)²`` (C ≥ 0, as for Toeplitz), and the sum over nodes
        splits by level. Each level's share is maximised over the pattern's offset separately
        (an upper bound on the maximum of the sum): exactly for nodes shorter than the pattern,
        and by ``(Σu)²`` for longer ones (the pattern then meets at most two nodes, and
        ``a² + b² ≤ (a + b)²``).
        """
        n = _check_horizon(n)
        u = _check_pattern(pattern)[:n]
        total = 0.0
        for lv in range(n.bit_length()):
            size = 1 << lv
            if size >= len(u):
                total += float(u.sum()) ** 2
                continue
            best = 0.0
            for off in range(size):
                padded = np.concatenate([np.zeros(off), u])
                padded = np.concatenate([padded, np.zeros(-len(padded) % size)])
                sums = padded.reshape(-1, size).sum(axis=1)
                best = max(best, float(np.dot(sums, sums)))
            total += best
        return math.sqrt(total) * (1.0 + 1e-12)

    def state_dict(self) -> dict:
        return {"kind": self.name}
