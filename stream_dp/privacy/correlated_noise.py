"""Keyed correlated noise: the rows ``(M·Z)_t`` of a factorization, in blocks or one at a time.

The noise a learner adds to the gradient of step ``t`` is ``σ·(M·Z)_t`` where ``M`` is the noise
matrix of a factorization (``C⁻¹`` for the Toeplitz ones, :mod:`stream_dp.privacy.factorizations`)
and ``Z_t`` is a standard-normal row that is a pure function of (secret, model id, t): it comes
from :class:`~stream_dp.privacy.noise.KeyedNoise` (purpose ``"gradient"``). What depends on the
past — the k buffers of a BLT — is the recurrence state, which :meth:`CorrelatedNoise.state_dict`
returns for any step inside the last block, so a checkpoint taken mid-block replays identical
noise.

Rows come in blocks (:meth:`CorrelatedNoise.next_rows`): a BLT block is k first-order linear
recurrences, O(k·p) per step — one compiled loop when numba is active
(:func:`stream_dp._jit.numba_active`), otherwise ``scipy.signal.lfilter`` over the whole
block, once per buffer. Both bodies perform the same floating-point operations in the same order
(``λ·R + Z``, then ``Z + β_1 R_1 + β_2 R_2 + …``), so the rows are bit for bit the same on both
paths, and a block's rows are those of one step at a time (:meth:`~CorrelatedNoise.next_row`)
whatever the block boundaries (``tests/test_correlated_noise.py``).

BLT recurrence (``d_m = Σ_j β_j λ_j^{m−1}``): with ``R_{j,t} = λ_j R_{j,t−1} + Z_t``
(``R_{j,0} = 0``),

    (C⁻¹Z)_t = Σ_{s≤t} d_{t−s} Z_s = Z_t + Σ_j β_j R_{j,t−1}.

"""

from __future__ import annotations

import numpy as np

from stream_dp import _jit
from stream_dp._signal import lfilter
from stream_dp.privacy.blt import BLT
from stream_dp.privacy.factorizations import (
    BinaryTree,
    Factorization,
    Independent,
    ToeplitzFactorization,
)
from stream_dp.privacy.noise import KeyedNoise, rows_per_block

__all__ = ["CorrelatedNoise", "blt_rows", "block_rows", "standard_rows", "tree_node_counters"]


def _blt_loop(Z, R, lam, beta, rows):  # pragma: no cover - compiled with numba only
    # The recurrence of _blt_rows_numpy, one step at a time: rows = Z + Σ_j β_j R_j (j in
    # order), then R_j = λ_j·R_j + Z. Updates R in place.
    m, p = Z.shape
    k = len(lam)
    for t in range(m):
        for c in range(p):
            z = Z[t, c]
            y = z
            for j in range(k):
                y = y + beta[j] * R[j, c]
            rows[t, c] = y
            for j in range(k):
                R[j, c] = lam[j] * R[j, c] + z


# [the compiled loop, or None where numba cannot be used], decided on first use.
_COMPILED: list = []


def _compiled_loop():
    if not _COMPILED:
        loop = None
        if _jit.NUMBA_INSTALLED:
            try:
                loop = _jit.njit(_blt_loop)
            except Exception:  # pragma: no cover - a numba that cannot compile it
                loop = None
        _COMPILED.append(loop)
    return _COMPILED[0]


def _blt_rows_numpy(Z, R, lam, beta):
    rows = Z.copy()
    new_R = np.empty_like(R)
    for j in range(len(lam)):
        # y_t = Z_t + λ·y_{t−1}, started from y_{first−1} = R_j (lfilter's state is λ·R_j).
        out, _ = lfilter([1.0], [1.0, -lam[j]], Z, axis=0, zi=(lam[j] * R[j])[None, :])
        rows[0] += beta[j] * R[j]
        rows[1:] += beta[j] * out[:-1]
        new_R[j] = out[-1]
    return rows, new_R


def blt_rows(Z: np.ndarray, R: np.ndarray, lam: np.ndarray, beta: np.ndarray, compiled=None):
    """BLT noise rows for the standard rows ``Z`` from the state ``R``; returns (rows, new R).

    ``compiled`` forces a path (``None``: numba when :func:`~stream_dp._jit.numba_active`).
    """
    loop = _compiled_loop() if (compiled is None and _jit.numba_active()) or compiled else None
    if loop is None:
        return _blt_rows_numpy(Z, R, lam, beta)
    rows = np.empty_like(Z)
    new_R = np.array(R, dtype=float, order="C")
    loop(np.ascontiguousarray(Z), new_R, lam, beta, rows)
    return rows, new_R


# Node (ℓ, q) of the binary tree draws the standard row of counter (q << 6) | ℓ: unique for
# every level ℓ < 64 and index q.
_TREE_LEVEL_BITS = 6


#: Values of node rows :meth:`CorrelatedNoise._tree_rows` draws at a time (8 MB of float64).
_TREE_CHUNK_VALUES = 1 << 20


def tree_node_counters(nodes: list[tuple[int, int]]) -> np.ndarray:
    """The keyed-noise counters of binary-tree nodes ``(ℓ, q)``: ``(q << 6) | ℓ``.

    Node (ℓ, q)'s standard row is ``standard_rows(keyed, counters, size, purpose)``; the noise
    of the prefix sum ``1 … t`` is the sum of the rows of ``BinaryTree.decomposition(t)``.

    Examples
    --------
    >>> tree_node_counters([(0, 5), (2, 1)]).tolist()
    [320, 66]

    """
    return np.array([(q << _TREE_LEVEL_BITS) | lv for lv, q in nodes], dtype=np.int64)


def block_rows(size: int) -> int:
    """Rows per block for ``size`` values per row: about 2 MB of noise, at most 1024 steps.

    Examples
    --------
    >>> block_rows(48), block_rows(48 * 48), block_rows(10**6)
    (1024, 113, 1)

    """
    return int(min(1024, max(1, (1 << 18) // max(int(size), 1))))


def standard_rows(keyed: KeyedNoise, steps: np.ndarray, size: int, purpose: str) -> np.ndarray:
    """The standard-normal rows ``Z_t`` for ``steps`` (shape ``(len(steps), size)``).

    Through :class:`KeyedNoise`'s public methods only: ``gaussian_rows`` with σ = 1 (the rows of
    ``standard_row``, times 1.0) for sizes drawn in blocks, one generator per step otherwise.
    """
    steps = np.asarray(steps, dtype=np.int64)
    if rows_per_block(size) > 1:
        return keyed.gaussian_rows(steps, size, np.ones(len(steps)), purpose)
    out = np.empty((len(steps), size))
    for r, t in enumerate(steps.tolist()):
        out[r] = keyed.generator(t, purpose).standard_normal(size)
    return out


class CorrelatedNoise:
    """The noise rows ``(M·Z)_t``, t = 1, 2, …, of a factorization (σ = 1; scale them by σ).

    Parameters
    ----------
    factorization
        A :class:`~stream_dp.privacy.blt.BLT` (O(k·p) state: the one to stream with),
        :class:`~stream_dp.privacy.factorizations.Independent`,
        :class:`~stream_dp.privacy.factorizations.BinaryTree` (stateless: node rows are keyed),
        or any other Toeplitz factorization (O(t·p) memory: tests and small horizons only).
    keyed
        The learner's keyed generator; ``Z_t`` is its standard row of step t.
    size
        Values per row (the number of model parameters).
    purpose
        The :data:`~stream_dp.privacy.noise.PURPOSES` lane of ``Z``.

    Examples
    --------
    >>> from stream_dp.privacy.blt import BLT
    >>> from stream_dp.privacy.noise import KeyedNoise
    >>> blt = BLT.fit(100)
    >>> a = CorrelatedNoise(blt, KeyedNoise(secret=3, model_id="m"), size=4)
    >>> block = a.next_rows(10)
    >>> b = CorrelatedNoise(blt, KeyedNoise(secret=3, model_id="m"), size=4)
    >>> rows = [b.next_row() for _ in range(10)]
    >>> bool((block == np.array(rows)).all()), a.position
    (True, 11)

    """

    def __init__(
        self, factorization: Factorization, keyed: KeyedNoise, size: int, purpose: str = "gradient"
    ) -> None:
        self.factorization = factorization
        self.keyed = keyed
        self.size = int(size)
        self.purpose = purpose
        self.position = 1
        if isinstance(factorization, BLT):
            self._kind = "blt"
        elif isinstance(factorization, Independent):
            self._kind = "independent"
        elif isinstance(factorization, BinaryTree):
            self._kind = "tree"
        elif isinstance(factorization, ToeplitzFactorization):
            self._kind = "toeplitz"
        else:
            raise ValueError(f"no streaming noise for {factorization!r}")
        self._reset_state()

    def _reset_state(self) -> None:
        k = self.factorization.buffers if self._kind == "blt" else 0
        # R_{j, position − 1}, and the same at the first step of the last block (for state_dict
        # at a step inside that block).
        self._R = np.zeros((k, self.size))
        self._block_start = self.position
        self._block_R = self._R.copy()
        self._history: list[np.ndarray] = []  # Z_1 … Z_{position−1} ("toeplitz" only)
        self._inverse: np.ndarray | None = None

    # -- rows -------------------------------------------------------------------------------
    def _z(self, first: int, m: int) -> np.ndarray:
        return standard_rows(self.keyed, np.arange(first, first + m), self.size, self.purpose)

    def _blt_rows(self, Z: np.ndarray, R: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
        """Rows for the block ``Z`` from ``R = R_{·, first − 1}``; returns (rows, new R)."""
        return blt_rows(Z, R, self.factorization.lam, self.factorization.beta)

    def next_rows(self, m: int) -> np.ndarray:
        """The rows of steps ``position … position + m − 1`` (shape ``(m, size)``); advances."""
        m = int(m)
        if m < 1:
            raise ValueError(f"need at least one row, got {m!r}")
        first = self.position
        if self._kind == "tree":
            rows = self._tree_rows(first, m)
        else:
            Z = self._z(first, m)
            if self._kind == "independent":
                rows = Z
            elif self._kind == "blt":
                self._block_start, self._block_R = first, self._R
                rows, self._R = self._blt_rows(Z, self._R)
            else:
                rows = self._toeplitz_rows(Z)
        self.position = first + m
        return rows

    def next_row(self) -> np.ndarray:
        """The row of step ``position`` (bit for bit what a block would give); advances."""
        return self.next_rows(1)[0]

    def _toeplitz_rows(self, Z: np.ndarray) -> np.ndarray:
        self._history.extend(Z)
        H = np.asarray(self._history)
        t_end = len(H)
        d = self.factorization.inverse_coefficients(t_end)
        out = np.empty_like(Z)
        for r in range(len(Z)):
            t = t_end - len(Z) + r + 1  # 1-based step of this row
            out[r] = d[:t][::-1] @ H[:t]
        return out

    def _tree_rows(self, first: int, m: int) -> np.ndarray:
        decomposition = BinaryTree.decomposition
        out = np.zeros((m, self.size))
        # The node rows of a chunk of steps are drawn in one call: consecutive nodes share a
        # keyed block, which is then drawn once, not once per node and step (about 70× the
        # time of a step at d = 16). At most ~8 MB of node rows at a time.
        chunk = max(1, _TREE_CHUNK_VALUES // (2 * self.size))
        for start in range(0, m, chunk):
            plans, index = [], {}
            for r in range(start, min(start + chunk, m)):
                t = first + r
                plus, minus = decomposition(t), decomposition(t - 1)
                nodes = sorted(set(plus) | set(minus))
                plans.append((r, nodes, plus, minus))
                for node in nodes:
                    index.setdefault(node, len(index))
            Z = standard_rows(self.keyed, tree_node_counters(list(index)), self.size, self.purpose)
            for r, nodes, plus, minus in plans:
                for node in nodes:
                    z = Z[index[node]]
                    out[r] += (node in plus) * z - (node in minus) * z
        return out

    # -- checkpoints ------------------------------------------------------------------------
    def state_dict(self, at: int | None = None) -> dict:
        """The state at step ``at`` (default: :attr:`position`): the next row it would return.

        ``at`` may lie anywhere in the last block served (a learner that read a block ahead
        checkpoints at the step it has actually consumed); the BLT state there is recomputed
        from the block's first state with the same recurrence, bit for bit.
        """
        at = self.position if at is None else int(at)
        state = {"factorization": self.factorization.state_dict(), "size": self.size,
                 "purpose": self.purpose, "position": at}  # fmt: skip
        if self._kind != "blt":
            if not 1 <= at <= self.position:
                raise ValueError(f"step {at} is beyond the rows served ({self.position})")
            return state
        if at == self.position:
            R = self._R
        elif self._block_start <= at < self.position:
            R = self._block_R
            if at > self._block_start:
                _, R = self._blt_rows(self._z(self._block_start, at - self._block_start), R)
        else:
            raise ValueError(
                f"step {at} is outside the last block ({self._block_start} … {self.position})"
            )
        return {**state, "buffers": R.copy()}

    def load_state_dict(self, state: dict) -> None:
        if state["factorization"] != self.factorization.state_dict():
            raise ValueError("the checkpoint's noise uses another factorization")
        if int(state["size"]) != self.size or state["purpose"] != self.purpose:
            raise ValueError("the checkpoint's noise has another size or purpose")
        self.position = int(state["position"])
        self._reset_state()
        if self._kind == "blt":
            R = np.asarray(state["buffers"], dtype=float)
            if R.shape != self._R.shape:
                raise ValueError(f"BLT state of shape {R.shape}, expected {self._R.shape}")
            self._R = R.copy()
            self._block_R = self._R
        elif self._kind == "toeplitz" and self.position > 1:
            self._history = list(self._z(1, self.position - 1))
