"""The release ring: what an online learner serves — its latest releases and their mean.

Predictions, transforms and partners only ever see released models (``docs/privacy.md``,
*Threat model*): the latest release, or the mean of the last ``window`` releases
(``smoothed``), which is post-processing of private outputs and costs no budget. Warm-up
releases are data-independent random models; the first learned release empties the window of
them, so the mean never averages them in. A release made but not paid for (an internal error
after the step) is withdrawn: the ring then serves nothing rather than an uncharged model.

The ring lives in two arrays — the releases, one per row, and a small integer state — so that
the compiled fast path pushes releases with the same :func:`ring_push` the reference step uses.
"""

from __future__ import annotations

from typing import NamedTuple

import numpy as np

from stream_dp._jit import jitable

__all__ = ["KeptReleases", "ReleaseRing", "release_norm", "ring_push", "window_mean"]

#: Layout of :attr:`ReleaseRing.state`.
COUNT, HEAD, LEARNED, HAS_FACTORS, STEP = 0, 1, 2, 3, 4
STATE_SIZE = 5


@jitable
def release_norm(rel):
    """‖rel‖₂ of a flat model: the bound ``predict_proba_one`` scales its scores by."""
    return np.sqrt(np.sum(rel * rel))


@jitable
def ring_push(win, norms, state, rel, step, learned, has_factors):
    """Push release ``rel`` of ``step`` into the ring ``win`` (state updated in place) and its
    Euclidean norm into ``norms`` (predictions scale scores by it).

    A learned release after warm-up releases first empties the window (the mean is of learned
    releases only).
    """
    if learned and state[LEARNED] == 0:
        state[COUNT] = 0
        state[LEARNED] = 1
    k = win.shape[0]
    win[state[HEAD]] = rel
    norms[state[HEAD]] = release_norm(rel)
    state[HEAD] = (state[HEAD] + 1) % k
    state[COUNT] = min(state[COUNT] + 1, k)
    state[HAS_FACTORS] = has_factors
    state[STEP] = step


@jitable
def window_mean(win, count, head):
    """Mean of the ``count`` newest rows of the ring ``win`` (next write at ``head``).

    Rows are summed oldest first, as ``np.mean(np.stack(window), axis=0)`` does.
    """
    k = win.shape[0]
    start = (head - count) % k
    out = win[start].copy()
    for i in range(1, count):
        out += win[(start + i) % k]
    return out / count


class KeptReleases(NamedTuple):
    """What a batch learned and released (``learn_many_kept``): ``learned`` rows, and for each
    release, in order, its step, its index (the learner's ``n_releases`` right after it) and its
    flat model (a row of ``weights``)."""

    learned: int
    steps: np.ndarray
    indices: np.ndarray
    weights: np.ndarray


def _readonly(a: np.ndarray) -> np.ndarray:
    a.flags.writeable = False
    return a


class ReleaseRing:
    """The last ``window`` releases of a model with ``shape`` parameters.

    Examples
    --------
    >>> ring = ReleaseRing(window=2, shape=(2,))
    >>> ring.push(np.array([1.0, 0.0]), step=5, learned=True)
    >>> ring.push(np.array([0.0, 1.0]), step=6, learned=True)
    >>> ring.latest.tolist(), ring.smoothed.tolist(), ring.step
    ([0.0, 1.0], [0.5, 0.5], 6)

    """

    def __init__(self, window: int, shape: tuple[int, ...]) -> None:
        self.shape = tuple(shape)
        size = int(np.prod(shape))
        self.rows = np.zeros((int(window), size))
        #: The norm of each row (of the latest release: what predictions scale scores by).
        self.norms = np.zeros(int(window))
        self.state = np.zeros(STATE_SIZE, dtype=np.int64)
        d = shape[0]
        #: Eigenpairs of the latest release of a metric model, when its projection kept them.
        self.lam = np.zeros(d)
        self.V = np.zeros((d, d))
        self._mean: tuple | None = None  # (state bytes, mean, its norm)
        self._views = self._row_views()

    def _row_views(self) -> list[np.ndarray]:
        """Read-only views of the rows, shaped (``latest`` is one of them)."""
        return [_readonly(row.reshape(self.shape)) for row in self.rows]

    def __getstate__(self) -> dict:
        # The views are of this ring's own rows. Copied (pickle, deepcopy) they would be arrays
        # of their own, frozen as they were: the copy would serve that release for ever while
        # its rows moved on. A copy makes them again from its rows (__setstate__).
        return {k: v for k, v in self.__dict__.items() if k not in ("_views", "_mean")}

    def __setstate__(self, state: dict) -> None:
        self.__dict__.update(state)
        self._mean = None
        self._views = self._row_views()

    @property
    def step(self) -> int:
        """The step of the latest release (0 before any)."""
        return int(self.state[STEP])

    @property
    def count(self) -> int:
        return int(self.state[COUNT])

    @property
    def learned(self) -> bool:
        """True once a release learned from data (not a warm-up model) was pushed."""
        return bool(self.state[LEARNED])

    def push(self, rel: np.ndarray, step: int, learned: bool, has_factors: bool = False) -> None:
        ring_push(
            self.rows, self.norms, self.state, rel.reshape(-1), step, learned, int(has_factors)
        )

    @property
    def latest(self) -> np.ndarray | None:
        """The latest release: a read-only view, valid until the next push."""
        return self.served(False)

    @property
    def smoothed(self) -> np.ndarray | None:
        """Mean of the releases in the window (cached per release)."""
        return self.served(True)

    def served(self, smoothed: bool) -> np.ndarray | None:
        """The latest release or the window's mean, shaped and read-only (None before any)."""
        return self.served_and_norm(smoothed)[0]

    def served_and_norm(self, smoothed: bool) -> tuple[np.ndarray | None, float]:
        """:meth:`served` and its Euclidean norm (None and 0.0 before any release).

        The compiled fast path pushes without telling this object, so both are read from the
        ring's state at every call: the latest is one of the row views made at construction,
        with the norm its push stored; the mean and its norm are cached under the state's bytes
        (every push and a withdrawal change them).
        """
        state = self.state
        count = state.item(COUNT)
        if count == 0:
            return None, 0.0
        if not smoothed:
            head = state.item(HEAD) - 1
            return self._views[head], self.norms.item(head)
        key = state.tobytes()
        cached = self._mean
        if cached is None or cached[0] != key:
            k = self.rows.shape[0]
            # A cumulative sum adds the rows in order, oldest first (never pairwise): the same
            # sum as window_mean's loop (which compiled code calls), without a Python loop.
            rows = self.rows[(state.item(HEAD) - count + np.arange(count)) % k]
            mean = np.cumsum(rows, axis=0)[-1] / count
            norm = float(release_norm(mean))
            cached = self._mean = (key, _readonly(mean.reshape(self.shape)), norm)
        return cached[1], cached[2]

    @property
    def factors(self) -> tuple[np.ndarray, np.ndarray] | None:
        """Eigenpairs of the latest release, when its projection kept them (metric task)."""
        return (self.lam, self.V) if self.state[HAS_FACTORS] and self.state[COUNT] else None

    def window(self) -> list[np.ndarray]:
        """The releases in the window, oldest first (copies)."""
        count, head, k = int(self.state[COUNT]), int(self.state[HEAD]), self.rows.shape[0]
        return [self.rows[(head - count + i) % k].reshape(self.shape).copy() for i in range(count)]

    def withdraw(self) -> None:
        """Serve nothing: a release was made but could not be paid for."""
        self.state[COUNT] = 0
        self.state[HAS_FACTORS] = 0
        self.rows[:] = 0.0
        self.norms[:] = 0.0
        self._mean = None

    def state_dict(self) -> dict:
        return {
            "window": self.window(),
            "learned": self.learned,
            "step": self.step,
        }

    def load_state_dict(self, state: dict) -> None:
        window = [np.asarray(a, dtype=float).reshape(-1) for a in state["window"]]
        k = self.rows.shape[0]
        self.rows[:] = 0.0
        for i, a in enumerate(window[-k:]):
            self.rows[i] = a
        self.norms[:] = [release_norm(row) for row in self.rows]
        count = min(len(window), k)
        self.state[:] = 0
        self.state[COUNT], self.state[HEAD] = count, count % k
        self.state[LEARNED] = int(bool(state["learned"]))
        self.state[STEP] = int(state["step"])
        self._mean = None
